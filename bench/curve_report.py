"""Rendering of bench/curve.py's results: the markdown tables spliced into bench/README.md
and the PNG plot. Imported by curve.py (not run on its own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

GROUPS = ("replay", "fanout", "idle", "ingest", "summary")
MARKS = {
    "curve": ("<!-- curve:begin (bench/curve.py) -->", "<!-- curve:end -->"),
    "before-after": ("<!-- before-after:begin (bench/curve.py) -->", "<!-- before-after:end -->"),
}


def g(x: Any, digits: int = 2) -> str:
    if not isinstance(x, (int, float)):
        return "?"
    if abs(x) >= 1e5:
        return f"{x / 1e3:,.0f}k"
    if abs(x) >= 1e4:
        return f"{x / 1e3:,.1f}k"
    return f"{x:.{digits}f}"


def spread(f: dict[str, Any], k: str, digits: int = 2) -> str:
    if f"{k}_min" in f and f"{k}_max" in f:
        return f"{g(f.get(k), digits)} [{g(f[f'{k}_min'], digits)}-{g(f[f'{k}_max'], digits)}]"
    return g(f.get(k), digits)


def size_label(n: int) -> str:
    return (
        f"{n // 1_000_000}M"
        if n >= 1_000_000 and n % 1_000_000 == 0
        else (f"{n // 1000}k" if n >= 10_000 and n % 1000 == 0 else f"{n:,}")
    )


def curve_rows(points: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One row per figure: axis, size, path, figure, ceiling (same run), ratio, target."""
    rows: list[list[str]] = []
    for p in sorted(points.values(), key=lambda p: (GROUPS.index(p["group"]), p["size"])):
        grp, n, f = p["group"], p["size"], p.get("figures", {})
        load = p["load"][0].split()[0] if p.get("load") else "?"
        if "error" in p:
            rows.append([grp, size_label(n), "-", "failed", "-", "-", "-", load])
            continue
        if grp == "replay":
            for k, label in (
                ("sse_agent", "SSE per agent"),
                ("sse_fleet", "SSE fleet"),
                ("rest_1000", "REST limit 1000"),
                ("rest_10000", "REST limit 10000"),
            ):
                rows.append(
                    [
                        "history",
                        size_label(n),
                        label,
                        f"{g(f.get(f'{k}_evs'))} ev/s",
                        f"{g(f.get('ceiling_evs'))} ev/s",
                        spread(f, f"{k}_ratio", 3),
                        ">= 0.5",
                        load,
                    ]
                )
        elif grp == "fanout":
            tgt = "p99 <= 20 ms, ratio >= 0.5" if p["issue"] else "(curve)"
            rows.append(
                [
                    "watchers",
                    str(n),
                    "live SSE, 50 agents, 5k frames/s",
                    f"p50 {g(f.get('sse_p50_ms'))} / p99 {spread(f, 'sse_p99_ms')} ms, "
                    f"prosperod {g(f.get('prosperod_cpu'), 0)}% CPU; gaps {f.get('gaps', '?')}, "
                    f"lost {f.get('lost', '?')}, dup {f.get('duplicated', '?')}",
                    f"raw p99 {g(f.get('raw_p99_ms'))} ms",
                    spread(f, "ratio_p99", 3),
                    tgt,
                    load,
                ]
            )
        elif grp == "idle":
            tgt = "<= 0.3 %, <= 40 KB" if p["issue"] else "(curve)"
            rows.append(
                [
                    "agents",
                    str(n),
                    "idle CPU, RSS per agent",
                    f"{spread(f, 'cpu_pct', 3)} % CPU, {g(f.get('rss_per_agent_kb'), 1)} KB/agent",
                    f"empty daemon {g(f.get('floor_pct'), 3)} %",
                    "-",
                    tgt,
                    load,
                ]
            )
        elif grp == "ingest":
            rows.append(
                [
                    "agents",
                    str(n),
                    "ingest",
                    f"{spread(f, 'events_per_s', 0)} ev/s",
                    f"{g(f.get('ceiling_per_s'), 0)} ev/s",
                    spread(f, "ratio", 3),
                    ">= 0.5" if p["issue"] else "(curve)",
                    load,
                ]
            )
        elif grp == "summary":
            rows.append(
                [
                    "agents",
                    str(n),
                    "dashboard summary (warm; cold)",
                    f"warm p50 {spread(f, 'warm_p50_ms')} ms; cold {g(f.get('cold_ms'), 1)} ms",
                    f"{g(f.get('heads_ms'))} ms high-water SELECTs; {g(f.get('query_ms'))} ms one query",
                    f"warm {g(f.get('warm_ratio'))}; cold {g(f.get('cold_ratio'))}x",
                    "warm <= 5 ms, cold <= 2x" if p["issue"] else "(curve)",
                    load,
                ]
            )
    return rows


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def curve_md(data: dict[str, Any]) -> str:
    head = [
        "axis",
        "size",
        "path",
        "figure (median [min-max])",
        "ceiling (same run)",
        "ratio",
        "target",
        "load",
    ]
    meta, pts = data.get("meta", {}), data["points"].values()
    ats = sorted({p.get("at", "?") for p in pts})
    commits = ", ".join(f"`{c}`" for c in sorted({p.get("commit", "?") for p in pts}))
    logs = ", ".join(f"`{x}`" for x in sorted({p.get("logs", "?") for p in pts}))
    quick = " **(--quick: sizes too small to mean anything)**" if meta.get("quick") else ""
    when = ats[0] if len(ats) == 1 else f"{ats[0]} to {ats[-1]}"
    return (
        f"Generated by `bench/curve.py`{quick}: measured {when} on commit {commits}, "
        f"{meta.get('cpus', '?')} CPUs. `load` is the 1-minute load average when each bench "
        f"started (lock held). Each bench's full output: {logs}.\n\n"
        + table(head, curve_rows(data["points"]))
        + "\n\n![cost curve](curve.png)\n"
    )


BEFORE = [
    # (row, before, point key group, target)
    (
        "SSE replay of a 100k-event history (per agent / fleet)",
        "13.1k ev/s (11.7-15.0k), ratio **0.018**",
        "replay",
        ">= 0.5",
    ),
    (
        "REST paging of the same history (limit 1000 / 10000)",
        "92k / 65k ev/s, ratio 0.12 / 0.09",
        "rest",
        ">= 0.5",
    ),
    (
        "live: 50 SSE watchers, 5k frames/s (quiet machine)",
        "p50 4.8 ms, p99 51 ms; raw reader p99 2.2 ms; ratio 0.04",
        "fanout",
        "p99 <= 20 ms, ratio >= 0.5",
    ),
    ("ingest, 200 agents", "ratio 0.42 (0.27-0.64)", "ingest", ">= 0.5"),
    (
        "dashboard summary, warm, 500 agents",
        "p50 28 ms (500 high-water SELECTs 1.9 ms: 0.07)",
        "summary",
        "warm p50 <= 5 ms; cold <= 2x one query",
    ),
    (
        "1,000 idle interactive agents",
        "2.1 % CPU, 32 KB RSS per agent",
        "idle",
        "<= 0.3 % CPU, <= 40 KB",
    ),
]


def after(kind: str, points: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """(after figure, met?) for one row of the issue's table."""
    grp = {"rest": "replay"}.get(kind, kind)
    p = next((p for p in points.values() if p["group"] == grp and p["issue"]), None)
    if p is None:
        return "_(not run yet: `bench/curve.py`)_", "?"
    if "error" in p:
        return "_(failed: see its log)_", "?"
    f, n = p["figures"], size_label(p["size"])
    load = p["load"][0].split()[0]
    if kind == "replay":
        a, b = f.get("sse_agent_ratio", 0), f.get("sse_fleet_ratio", 0)
        txt = (
            f"{g(f.get('sse_agent_evs'))} / {g(f.get('sse_fleet_evs'))} ev/s against "
            f"{g(f.get('ceiling_evs'))}, ratio **{a:.3f} / {b:.3f}**"
        )
        ok = min(a, b) >= 0.5
    elif kind == "rest":
        a, b = f.get("rest_1000_ratio", 0), f.get("rest_10000_ratio", 0)
        txt = (
            f"{g(f.get('rest_1000_evs'))} / {g(f.get('rest_10000_evs'))} ev/s, "
            f"ratio **{a:.3f} / {b:.3f}**"
        )
        ok = min(a, b) >= 0.5
    elif kind == "fanout":
        txt = (
            f"p50 {g(f.get('sse_p50_ms'))} ms, p99 {g(f.get('sse_p99_ms'))} ms; raw reader "
            f"p99 {g(f.get('raw_p99_ms'))} ms; ratio **{g(f.get('ratio_p99'), 3)}**"
        )
        ok = f.get("sse_p99_ms", 1e9) <= 20 and f.get("ratio_p99", 0) >= 0.5
    elif kind == "ingest":
        txt = f"ratio **{spread(f, 'ratio', 3)}**"
        ok = f.get("ratio", 0) >= 0.5
    elif kind == "summary":
        txt = (
            f"warm p50 **{g(f.get('warm_p50_ms'))} ms** (high-water ceiling "
            f"{g(f.get('heads_ms'))} ms: {g(f.get('warm_ratio'))}); cold "
            f"{g(f.get('cold_ms'), 1)} ms = **{g(f.get('cold_ratio'))}x** one query"
        )
        ok = bool(f.get("warm_ok")) and bool(f.get("cold_ok"))
    else:
        txt = (
            f"**{g(f.get('cpu_pct'), 3)} % CPU**, **{g(f.get('rss_per_agent_kb'), 1)} KB** "
            "RSS per agent"
        )
        ok = f.get("cpu_ratio", 9) <= 1 and f.get("rss_ratio", 9) <= 1
    return f"{txt} (size {n}, load {load}, {p.get('at', '?')})", "yes" if ok else "**no**"


def before_after_md(data: dict[str, Any]) -> str:
    rows = []
    for label, before, kind, target in BEFORE:
        aft, ok = after(kind, data["points"])
        rows.append([label, before, aft, target, ok])
    note = " **--quick run: not the issue's sizes.**" if data.get("meta", {}).get("quick") else ""
    return (
        "Before: the issue's figures (2 cores, under other load unless said quiet). After: the "
        f"points of `bench/curve.py` at the issue's sizes (each with its 1-minute load).{note}\n\n"
        + table(["path", "before", "after (median of >= 3)", "target", "met"], rows)
        + "\n"
    )


def splice(text: str, name: str, body: str) -> str:
    begin, end = MARKS[name]
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"README has no {begin} ... {end} markers")
    return text[: i + len(begin)] + "\n" + body + text[j:]


def plot(points: dict[str, dict[str, Any]], path: Path, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    def series(grp: str) -> list[tuple[int, dict[str, Any]]]:
        pts = [p for p in points.values() if p["group"] == grp and "figures" in p]
        return [(p["size"], p["figures"]) for p in sorted(pts, key=lambda p: p["size"])]

    def line(
        ax: Any, pts: list[tuple[int, dict[str, Any]]], key: str, label: str, **kw: Any
    ) -> None:
        have = [(n, f) for n, f in pts if key in f]
        if not have:
            return
        xs, ys = [n for n, _ in have], [f[key] for _, f in have]
        lo = [f[key] - f.get(f"{key}_min", f[key]) for _, f in have]
        hi = [f.get(f"{key}_max", f[key]) - f[key] for _, f in have]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label, **kw)
        ticks.setdefault(id(ax), set()).update(xs)

    ticks: dict[int, set[int]] = {}
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    title = "Prospero cost curve (bench/curve.py; median, bars min-max)"
    fig.suptitle(title + ("  [--quick: meaningless sizes]" if quick else ""))
    ax = axes[0][0]
    r = series("replay")
    for k, lab in (
        ("ceiling_evs", "ceiling (SQLite+JSON)"),
        ("sse_agent_evs", "SSE agent"),
        ("sse_fleet_evs", "SSE fleet"),
        ("rest_1000_evs", "REST 1000"),
        ("rest_10000_evs", "REST 10000"),
    ):
        line(ax, r, k, lab, linestyle="--" if k.startswith("ceiling") else "-")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="history (events)",
        ylabel="events/s",
        title="replay throughput vs history",
    )
    ax = axes[0][1]
    fo = series("fanout")
    line(ax, fo, "sse_p50_ms", "SSE p50")
    line(ax, fo, "sse_p99_ms", "SSE p99")
    line(ax, fo, "raw_p99_ms", "raw reader p99", linestyle="--")
    ax.axhline(20, color="grey", linestyle=":", label="target p99 20 ms")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="SSE watchers (50 agents, 5k frames/s)",
        ylabel="ms, frame written -> byte read",
        title="live fan-out latency vs watchers",
    )
    ax = axes[0][2]
    for grp, k, lab in (
        ("replay", "sse_agent_ratio", "replay SSE agent (x: history/1k)"),
        ("fanout", "ratio_p99", "live ratio p99 (x: watchers)"),
        ("ingest", "ratio", "ingest (x: agents)"),
    ):
        pts = [(n // 1000 if grp == "replay" else n, f) for n, f in series(grp)]
        line(ax, pts, k, lab)
    ax.axhline(0.5, color="grey", linestyle=":", label="target 0.5")
    ax.set(
        xscale="log",
        xlabel="size (see legend)",
        ylabel="figure / same-run ceiling",
        title="ratios against their ceilings",
    )
    ax = axes[1][0]
    idle = series("idle")
    line(ax, idle, "cpu_pct", "idle CPU %", color="C0")
    line(ax, idle, "floor_pct", "empty daemon CPU %", color="C0", linestyle="--")
    ax.axhline(0.3, color="C0", linestyle=":", label="target 0.3 %")
    ax.set(xscale="log", xlabel="idle agents", ylabel="% of one core", title="idle cost vs agents")
    ax2 = ax.twinx()
    line(ax2, idle, "rss_per_agent_kb", "RSS KB/agent", color="C3")
    ax2.set(ylabel="KB RSS per agent")
    ax2.legend(loc="upper right")
    ax = axes[1][1]
    ing = series("ingest")
    line(ax, ing, "events_per_s", "prospero ingest")
    line(ax, ing, "ceiling_per_s", "ceiling (raw read+parse+insert)", linestyle="--")
    ax.set(xscale="log", xlabel="agents", ylabel="TurnEvent lines/s", title="ingest vs agents")
    ax = axes[1][2]
    sm = series("summary")
    line(ax, sm, "warm_p50_ms", "warm p50")
    line(ax, sm, "cold_ms", "cold")
    line(ax, sm, "heads_ms", "N high-water SELECTs (raw)", linestyle="--")
    line(ax, sm, "query_ms", "one filtered query (raw)", linestyle="--")
    ax.axhline(5, color="grey", linestyle=":", label="target warm 5 ms")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="agents",
        ylabel="ms",
        title="dashboard summary vs agents",
    )
    for row in axes:
        for a in row:
            a.grid(True, which="both", alpha=0.3)
            if xs := sorted(ticks.get(id(a), ())):
                a.set_xticks(xs, [size_label(x) for x in xs])
                a.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            a.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
