"""Relay round trip on PostgreSQL: a call from one replica to the replica that drives an agent
(`core/relay/postgres.py`: insert + NOTIFY, claim, handler, outcome + NOTIFY, read, delete),
against a bare NOTIFY ping-pong between two connections measured in the same run (two doorbells,
no rows: the least any database-carried request/answer can cost). Not a test.

    uv run python bench/relay_latency.py [--calls 300] [--reps 3]

Two `PgRelay`s in one process on a throwaway PostgreSQL server (`prospero.testkit.postgres`,
fsync off); the handler answers at once, so the figure is the relay's own cost. Calls are
sequential (a steering request waits for its answer). Per repetition: p50/p99 of `--calls`
calls and of as many ping-pongs; the medians over `--reps` are printed with min-max. Ratio =
ping-pong p50 / relay p50. Last line
`relay_latency calls=N relay_p50_ms=.. relay_p99_ms=.. pingpong_p50_ms=.. pingpong_p99_ms=.. ratio_p50=..`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import asyncpg

from prospero.core.relay import RelayedCall
from prospero.core.relay.postgres import PgRelay
from prospero.testkit.postgres import PgServer


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


async def relay_run(dsn: str, calls: int) -> list[float]:
    async def handler(call: RelayedCall) -> Any:
        return {"ok": call.args["i"]}

    a, b = PgRelay(dsn, "a"), PgRelay(dsn, "b")
    await a.start(handler)
    await b.start(handler)
    try:
        for i in range(20):  # warm the pools
            await a.call("b", "agent", "send_input", {"i": i})
        out = []
        for i in range(calls):
            t0 = time.perf_counter()
            await a.call("b", "agent", "send_input", {"i": i})
            out.append((time.perf_counter() - t0) * 1000)
        return out
    finally:
        await a.close()
        await b.close()


async def pingpong_run(dsn: str, calls: int) -> list[float]:
    ping, pong = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    back: asyncio.Queue[str] = asyncio.Queue()

    def on_ping(conn: Any, pid: int, channel: str, payload: str) -> None:
        asyncio.get_running_loop().create_task(
            pong.execute("SELECT pg_notify('pong', $1)", payload)
        )

    def on_pong(conn: Any, pid: int, channel: str, payload: str) -> None:
        back.put_nowait(payload)

    await pong.add_listener("ping", on_ping)
    await ping.add_listener("pong", on_pong)
    sender = await asyncpg.connect(dsn)
    try:
        out = []
        for i in range(calls + 20):
            t0 = time.perf_counter()
            await sender.execute("SELECT pg_notify('ping', $1)", str(i))
            assert await back.get() == str(i)
            if i >= 20:
                out.append((time.perf_counter() - t0) * 1000)
        return out
    finally:
        for c in (ping, pong, sender):
            await c.close()


async def amain(calls: int, reps: int) -> None:
    with PgServer() as pg:
        rows = []
        for rep in range(reps):
            dsn = pg.create_database()
            r = await relay_run(dsn, calls)
            p = await pingpong_run(dsn, calls)
            rows.append((pct(r, 0.5), pct(r, 0.99), pct(p, 0.5), pct(p, 0.99)))
            print(
                f"rep {rep + 1}: relay p50 {rows[-1][0]:.2f} ms p99 {rows[-1][1]:.2f} ms | "
                f"ping-pong p50 {rows[-1][2]:.2f} ms p99 {rows[-1][3]:.2f} ms",
                flush=True,
            )
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    lo = [min(col) for col in zip(*rows, strict=True)]
    hi = [max(col) for col in zip(*rows, strict=True)]
    names = ("relay_p50_ms", "relay_p99_ms", "pingpong_p50_ms", "pingpong_p99_ms")
    for n, m, a, b in zip(names, med, lo, hi, strict=True):
        print(f"  {n}: {m:.2f} ({a:.2f}-{b:.2f})")
    print(
        f"relay_latency calls={calls} "
        + " ".join(f"{n}={m:.2f}" for n, m in zip(names, med, strict=True))
        + f" ratio_p50={med[2] / med[0]:.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(amain(args.calls, args.reps))


if __name__ == "__main__":
    main()
