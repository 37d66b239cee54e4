// Usage: tokens, cost, turns, runs and outcomes per workspace per UTC day over 24 h / 7 d /
// 30 d (GET /api/usage?days=N), as SVG charts plus a per-workspace table. Reloaded as turns
// and runs end (the fleet's spend moves with every turn: this page must not lag behind it).
// The spend is the one the fleet shows, per turn, but per UTC day within the window and with
// removed agents: the stat says so.

import { get } from "../api.js";
import { barChart, areaChart } from "../charts.js";
import { h, replace } from "../dom.js";
import { fmtInt, fmtTokens, fmtUsd } from "../format.js";
import * as state from "../state.js";
import { button, emptyState } from "../ui.js";

const WINDOWS = [
  ["1", "24 h"],
  ["7", "7 d"],
  ["30", "30 d"],
];
const OUTCOMES = ["done", "failed", "killed", "crashed", "budget_exceeded"];
const COLUMNS = ["Workspace", "Tokens in", "Tokens out", "Cost", "Turns", "Runs", "Done", "Failed", "Killed", "Crashed", "Over budget"];

function daysBetween(since, until) {
  const out = [];
  const start = new Date(`${since.slice(0, 10)}T00:00:00Z`);
  const endMs = Date.parse(until) - 1;
  for (let d = start; d.getTime() <= endMs; d = new Date(d.getTime() + 86400000)) {
    out.push(d.toISOString().slice(0, 10));
    if (out.length > 400) break;
  }
  return out;
}

function emptyBucket() {
  return { input_tokens: 0, output_tokens: 0, cost_usd: 0, turns: 0, runs: 0, done: 0, failed: 0, killed: 0, crashed: 0, budget_exceeded: 0 };
}

function addBucket(acc, b) {
  acc.input_tokens += b.input_tokens || 0;
  acc.output_tokens += b.output_tokens || 0;
  acc.cost_usd += b.cost_usd || 0;
  acc.turns += b.turns || 0;
  acc.runs += b.runs || 0;
  for (const o of OUTCOMES) acc[o] += b.outcomes?.[o] || 0;
}

function stat(label, value, note) {
  return h("div", { class: "stat" }, h("div", { class: "stat-label" }, label), h("div", { class: "stat-value" }, value), note ? h("div", { class: "stat-note" }, note) : null);
}

export function mount(root) {
  let days = sessionStorage.getItem("prospero.usage.days") || "7";
  let wsFilter = "";
  let report = null;
  let seq = 0;

  const seg = h("div", { class: "segmented", role: "group", "aria-label": "Window" });
  const wsSel = h("select", { class: "input", "aria-label": "workspace", on: { change: () => { wsFilter = wsSel.value; render(); } } });
  const body = h("div", { class: "usage-body" });

  function renderSeg() {
    replace(
      seg,
      WINDOWS.map(([v, label]) =>
        button(label, () => { days = v; sessionStorage.setItem("prospero.usage.days", v); renderSeg(); load(); }, v === days ? "seg-btn active" : "seg-btn", { "aria-pressed": v === days ? "true" : "false", dataset: { days: v } }),
      ),
    );
  }

  async function load() {
    const my = ++seq;
    try {
      const r = await get(`/api/usage?days=${encodeURIComponent(days)}`);
      if (my !== seq) return;
      report = r;
    } catch (e) {
      if (my !== seq) return;
      replace(body, emptyState("Usage is unavailable", e.message || String(e)));
      return;
    }
    render();
  }

  function render() {
    if (!report) return;
    const groups = report.groups || [];
    const names = [...new Set([...(state.store.fleet?.workspaces || []).map((w) => w.name), ...groups.map((g) => g.workspace)])].sort();
    replace(wsSel, h("option", { value: "" }, "All workspaces"), names.map((n) => h("option", { value: n }, n)));
    wsSel.value = names.includes(wsFilter) ? wsFilter : "";
    const dayList = daysBetween(report.since, report.until);
    const byDay = new Map(dayList.map((d) => [d, emptyBucket()]));
    const total = emptyBucket();
    let costReported = false;
    let tokensReported = false;
    for (const g of groups) {
      if (wsFilter && g.workspace !== wsFilter) continue;
      for (const b of g.series || []) {
        if (!byDay.has(b.day)) byDay.set(b.day, emptyBucket());
        addBucket(byDay.get(b.day), b);
        addBucket(total, b);
        if (b.cost_usd != null) costReported = true;
        if (b.input_tokens != null || b.output_tokens != null) tokensReported = true;
      }
    }
    const allDays = [...byDay.keys()].sort();
    const rows = allDays.map((d) => byDay.get(d));
    const shownGroups = groups.filter((g) => !wsFilter || g.workspace === wsFilter);
    replace(
      body,
      h(
        "div",
        { class: "stats" },
        stat(
          "Spend",
          costReported ? fmtUsd(total.cost_usd) : "—",
          `${costReported ? "" : "not reported · "}whole UTC days in the window, removed agents included`,
        ),
        stat("Tokens in", tokensReported ? fmtTokens(total.input_tokens) : "—"),
        stat("Tokens out", tokensReported ? fmtTokens(total.output_tokens) : "—"),
        stat("Turns", fmtInt(total.turns)),
        stat("Runs", fmtInt(total.runs)),
        stat("Outcomes", `${total.done} done`, `${total.failed} failed · ${total.killed} killed · ${total.crashed} crashed` + (total.budget_exceeded ? ` · ${total.budget_exceeded} over budget` : "")),
      ),
      h(
        "div",
        { class: "chart-grid" },
        h("div", { class: "card" }, areaChart("Spend per day (USD)", allDays, rows.map((r) => r.cost_usd), fmtUsd)),
        h(
          "div",
          { class: "card" },
          barChart(
            "Tokens per day",
            allDays,
            [
              { key: "input_tokens", label: "input", cls: "series-in" },
              { key: "output_tokens", label: "output", cls: "series-out" },
            ],
            rows,
            fmtTokens,
          ),
        ),
        h("div", { class: "card" }, barChart("Turns per day", allDays, [{ key: "turns", label: "turns", cls: "series-turns" }], rows, fmtInt, { integer: true })),
        h("div", { class: "card" }, barChart("Runs per day", allDays, [{ key: "runs", label: "runs", cls: "series-runs" }], rows, fmtInt, { integer: true })),
      ),
      h("h2", { class: "section-title" }, "Outcomes per day"),
      h(
        "div",
        { class: "chart-grid facets" },
        OUTCOMES.map((o) => h("div", { class: "card" }, barChart(o, allDays, [{ key: o, label: o, cls: `series-${o}` }], rows, fmtInt, { integer: true, size: "small" }))),
      ),
      h("h2", { class: "section-title" }, "Per workspace"),
      shownGroups.length
        ? h(
            "div",
            { class: "card table-wrap" },
            h(
              "table",
              { class: "agents usage-table stacked" },
              h("thead", {}, h("tr", {}, COLUMNS.map((c, i) => h("th", { class: i ? "col-num" : "" }, c)))),
              h(
                "tbody",
                {},
                shownGroups.map((g) =>
                  h(
                    "tr",
                    { dataset: { workspace: g.workspace } },
                    [
                      g.workspace,
                      fmtTokens(g.input_tokens),
                      fmtTokens(g.output_tokens),
                      fmtUsd(g.cost_usd),
                      fmtInt(g.turns),
                      fmtInt(g.runs),
                      ...OUTCOMES.map((o) => fmtInt(g.outcomes?.[o] || 0)),
                    ].map((v, i) => h("td", { class: i ? "col-num" : "", dataset: { label: i ? COLUMNS[i] : null } }, v)),
                  ),
                ),
              ),
            ),
          )
        : emptyState("No usage in this window", "Finished runs and terminal agents are counted here."),
    );
  }

  root.append(
    h(
      "section",
      { class: "page-head" },
      h("div", {}, h("h1", {}, "Usage"), h("p", { class: "page-sub" }, "Tokens, spend, turns and outcomes per UTC day.")),
      h("div", { class: "page-actions" }, wsSel, seg),
    ),
    body,
  );
  replace(body, emptyState("Loading usage…", ""));
  renderSeg();
  load();
  const timer = setInterval(load, 60000);
  let reloadTimer = null;
  const off = state.on("event", (ev) => {
    const k = ev.kind?.kind;
    if (k === "turn_finished" || k === "agent_finished" || (k === "status_changed" && ["done", "failed", "killed", "crashed"].includes(ev.kind.to))) {
      // At most one reload per half second, however busy the fleet (never starved).
      if (reloadTimer) return;
      reloadTimer = setTimeout(() => {
        reloadTimer = null;
        load();
      }, 500);
    }
  });
  return () => {
    clearInterval(timer);
    clearTimeout(reloadTimer);
    off();
  };
}
