// Fleet overview: stat row, filters, one card per workspace (health, config, status meter,
// agents with status — "awaiting approval" while a permission request waits —, drive
// protocol, posture, model, age, tokens and cost; clustered, the replica driving each one).
// Live: re-renders whenever the store changes (fleet SSE stream + poll, decisions). Spend is
// all-time, per listed agent, per turn (as the agent page counts it); the usage page counts
// the same turns per UTC day in its window, removed agents included: the stat says which.

import { ApiError, post } from "../api.js";
import { h, replace } from "../dom.js";
import { fmtAge, fmtTokens, fmtUsd, parseTs, plural, shortId } from "../format.js";
import * as state from "../state.js";
import { agentPill, banner, button, emptyState, healthPill, ownerBadge, tag } from "../ui.js";

const FILTER_KEY = "prospero.filters";

const STATUS_FILTERS = {
  all: { label: "All statuses", match: () => true },
  awaiting: { label: "Awaiting approval", match: (s, a) => awaiting(a) },
  active: { label: "Running", match: (s) => s === "running" || s === "spawning" },
  idle: { label: "Awaiting input", match: (s) => s === "idle" },
  done: { label: "Done", match: (s) => s === "done" },
  failed: { label: "Failed / crashed", match: (s) => s === "failed" || s === "crashed" },
  killed: { label: "Killed", match: (s) => s === "killed" },
};

const METER = [
  ["awaiting", (s, a) => awaiting(a)],
  ["running", (s, a) => s === "running" && !awaiting(a)],
  ["spawning", (s) => s === "spawning"],
  ["idle", (s) => s === "idle"],
  ["done", (s) => s === "done"],
  ["failed", (s) => s === "failed" || s === "crashed" || s === "killed"],
];

function awaiting(a) {
  return !["killed", "done", "failed", "crashed"].includes(a.status) && state.pendingFor(a) > 0;
}

function loadFilters() {
  const def = { q: "", status: "all", workspace: "", protocol: "" };
  try {
    return { ...def, ...JSON.parse(sessionStorage.getItem(FILTER_KEY) || "{}") };
  } catch {
    return def;
  }
}

function saveFilters(f) {
  try {
    sessionStorage.setItem(FILTER_KEY, JSON.stringify(f));
  } catch {
    /* ignore */
  }
}

function agentMatches(a, f) {
  if (!(STATUS_FILTERS[f.status] || STATUS_FILTERS.all).match(a.status, a)) return false;
  if (f.protocol && (a.drive_protocol || "ndjson") !== f.protocol) return false;
  if (f.q) {
    const q = f.q.toLowerCase();
    const hay = [a.id, a.name, a.label, a.model, totalsOf(a.id)?.model, a.workspace, a.owner].filter(Boolean).join(" ").toLowerCase();
    if (!hay.includes(q)) return false;
  }
  return true;
}

function totalsOf(id) {
  return state.store.totals[id] || null;
}

function stat(label, value, note, cls = "", title = undefined) {
  return h(
    "div",
    { class: ["stat", cls], title },
    h("div", { class: "stat-label" }, label),
    h("div", { class: "stat-value" }, value),
    note ? h("div", { class: "stat-note" }, note) : null,
  );
}

function renderStats(el) {
  const ws = state.store.fleet?.workspaces || [];
  // An agent listed under two workspaces is one agent: counted once.
  const all = [...new Map(state.agents().map((a) => [a.id, a])).values()];
  const unreachable = ws.filter((w) => w.health?.state === "unreachable").length;
  const running = all.filter((a) => a.status === "running" || a.status === "spawning").length;
  const idle = all.filter((a) => a.status === "idle").length;
  let cost = null;
  let tokens = null;
  for (const a of all) {
    const t = totalsOf(a.id);
    if (t?.cost_usd != null) cost = (cost || 0) + t.cost_usd;
    if (t?.input_tokens != null || t?.output_tokens != null) {
      tokens = (tokens || 0) + (t.input_tokens || 0) + (t.output_tokens || 0);
    }
  }
  const dec = state.store.decisions;
  replace(
    el,
    stat("Workspaces", String(ws.length), unreachable ? `${unreachable} unreachable` : "all healthy", unreachable ? "stat-warn" : ""),
    stat("Agents", String(all.length), `${all.filter((a) => a.interactive).length} interactive`),
    stat("Running", String(running), null, running ? "stat-running" : ""),
    stat("Awaiting input", String(idle), null, idle ? "stat-idle" : ""),
    dec.available
      ? stat("Pending approvals", String(dec.items.size), `${plural(all.filter(awaiting).length, "agent")} waiting`, dec.items.size ? "stat-warn" : "")
      : null,
    stat(
      "Spend",
      fmtUsd(cost),
      `${tokens == null ? "tokens not reported" : `${fmtTokens(tokens)} tokens`} · all time, listed agents`,
      "stat-spend",
      "Sum of the turns of the agents listed here, since they started. The usage page counts the same turns per UTC day within its window, including removed agents.",
    ),
  );
}

function meter(agents) {
  const counts = METER.map(([name, m]) => [name, agents.filter((a) => m(a.status, a)).length]);
  const total = agents.length;
  const summary = counts
    .filter(([, n]) => n)
    .map(([name, n]) => `${n} ${name}`)
    .join(", ");
  const bar = h("div", { class: "meter", role: "img", "aria-label": summary || "no agents" });
  for (const [name, n] of counts) {
    if (!n) continue;
    const seg = h("span", { class: ["meter-seg", `seg-${name}`], title: `${n} ${name}` });
    seg.style.flexGrow = String(Math.max(n, total / 40));
    bar.append(seg);
  }
  return h("div", { class: "meter-wrap" }, bar, h("span", { class: "meter-text" }, summary || "no agents"));
}

function agentRow(a) {
  const t = totalsOf(a.id);
  const tokens =
    t && (t.input_tokens != null || t.output_tokens != null)
      ? (t.input_tokens || 0) + (t.output_tokens || 0)
      : null;
  const href = `#/agents/${encodeURIComponent(a.id)}`;
  const model = a.model || t?.model || "";
  const title = a.label || a.name || a.id;
  const pending = state.pendingFor(a);
  const row = h(
    "tr",
    {
      class: ["agent-row", `row-${a.status}`, awaiting(a) ? "row-awaiting" : null],
      tabindex: "0",
      dataset: { agentId: a.id, status: a.status, navItem: "agent" },
      on: {
        click: (e) => {
          if (e.target.closest("a")) return;
          location.hash = href;
        },
      },
    },
    h(
      "td",
      { class: "col-agent" },
      h("a", { href, class: "agent-link" }, title),
      h(
        "div",
        { class: "agent-sub" },
        h("span", { class: "mono" }, shortId(a.id)),
        a.interactive ? tag("int", "tag-int", "interactive: accepts input") : null,
        a.isolated ? tag("wt", "tag-wt", "isolated in its own git worktree") : null,
        ownerBadge(a.owner),
      ),
    ),
    h("td", { class: "col-status", dataset: { label: "Status" } }, agentPill(a.status, pending)),
    h("td", { class: "col-proto", dataset: { label: "Protocol" } }, tag(a.drive_protocol || "ndjson", `proto-${a.drive_protocol || "ndjson"}`)),
    h("td", { class: "col-posture", dataset: { label: "Posture" } }, a.posture ? tag(a.posture, `posture-${a.posture}`) : h("span", { class: "muted" }, "—")),
    h("td", { class: "col-model mono", title: model || "", dataset: { label: "Model" } }, model || "—"),
    h("td", { class: "col-age", dataset: { since: a.started_at, label: "Age" }, title: a.started_at }, fmtAge(a.started_at)),
    h(
      "td",
      {
        class: "col-num col-tokens",
        title: t ? `${t.input_tokens ?? "—"} in / ${t.output_tokens ?? "—"} out · ${t.turns} turns` : "",
        dataset: { label: "Tokens" },
      },
      fmtTokens(tokens),
    ),
    h("td", { class: "col-num col-cost", dataset: { label: "Cost" } }, fmtUsd(t?.cost_usd)),
  );
  return row;
}

function configSummary(cfg) {
  const bits = [];
  if (cfg?.provider) bits.push(`provider ${cfg.provider}`);
  if (cfg?.base_url) bits.push(cfg.base_url);
  if (cfg?.api_key_from_env) bits.push(`key from $${cfg.api_key_from_env}`);
  const envN = Object.keys(cfg?.env || {}).length;
  if (envN) bits.push(plural(envN, "env var"));
  if (cfg?.caliband?.addr) bits.push(`caliband ${cfg.caliband.addr}`);
  return bits.length ? bits.join(" · ") : "default provider config";
}

function workspaceCard(ws, f) {
  const agents = [...(ws.agents || [])].sort(
    (a, b) => (parseTs(b.started_at) || 0) - (parseTs(a.started_at) || 0),
  );
  const shown = agents.filter((a) => agentMatches(a, f));
  const healthy = ws.health?.state !== "unreachable";
  const table = shown.length
    ? h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { class: "agents stacked" },
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              h("th", {}, "Agent"),
              h("th", {}, "Status"),
              h("th", {}, "Protocol"),
              h("th", {}, "Posture"),
              h("th", {}, "Model"),
              h("th", {}, "Age"),
              h("th", { class: "col-num" }, "Tokens"),
              h("th", { class: "col-num" }, "Cost"),
            ),
          ),
          h("tbody", {}, shown.map(agentRow)),
        ),
      )
    : h(
        "p",
        { class: "muted ws-empty" },
        agents.length ? `No agents match the filters (${agents.length} hidden).` : "No agents yet.",
      );
  return h(
    "article",
    { class: "card ws-card", dataset: { workspace: ws.name } },
    h(
      "header",
      { class: "ws-head" },
      h(
        "div",
        { class: "ws-title" },
        h("h2", { class: "ws-name" }, ws.name),
        healthPill(ws.health),
        h("span", { class: "ws-root mono", title: ws.root }, ws.root),
      ),
      h(
        "div",
        { class: "ws-actions" },
        healthy
          ? h("a", { class: "btn btn-sm btn-primary", href: `#/spawn?ws=${encodeURIComponent(ws.name)}` }, "Launch agent")
          : null,
        h("a", { class: "btn btn-sm", href: `#/workspaces/${encodeURIComponent(ws.name)}` }, "Configure"),
      ),
    ),
    !healthy && ws.health?.reason
      ? h("p", { class: "ws-unreachable" }, `Unreachable: ${ws.health.reason}`)
      : null,
    h(
      "div",
      { class: "ws-meta" },
      h("span", {}, configSummary(ws.config)),
      (ws.sources || []).length > 1
        ? h("span", {}, `sources: ${(ws.sources || []).map((s) => s.name).join(", ")}`)
        : null,
    ),
    meter(agents),
    table,
  );
}

function addWorkspaceForm(onDone) {
  const name = h("input", { class: "input", name: "name", required: true, placeholder: "payments-api", pattern: "[A-Za-z0-9][A-Za-z0-9._-]*" });
  const root = h("input", { class: "input", name: "root", required: true, placeholder: "/home/me/dev/payments-api" });
  const submit = h("button", { type: "submit", class: "btn btn-primary" }, "Add workspace");
  // Optional: the workspace's own networked caliband (else prosperod's default).
  const net = {
    addr: h("input", { class: "input mono", name: "caliband_addr", placeholder: "host:port" }),
    ca_file: h("input", { class: "input mono", name: "caliband_ca_file", placeholder: "/etc/caliband/ca.pem" }),
    token_file: h("input", { class: "input mono", name: "caliband_token_file", placeholder: "/etc/caliband/token" }),
    server_name: h("input", { class: "input mono", name: "caliband_server_name", placeholder: "caliband" }),
  };
  const form = h(
    "form",
    {
      class: "card add-ws",
      on: {
        submit: async (e) => {
          e.preventDefault();
          submit.disabled = true;
          // prosperod answers once it has reached the workspace's caliband (or failed to).
          submit.textContent = "Adding… (reaching its caliband)";
          try {
            const body = { name: name.value.trim(), root: root.value.trim() };
            const caliband = {};
            for (const [k, input] of Object.entries(net)) {
              if (input.value.trim()) caliband[k] = input.value.trim();
            }
            if (Object.keys(caliband).length) body.config = { caliband };
            const added = await post("/api/workspaces", body);
            const health = added && added.health;
            if (health && health.state === "unreachable") {
              banner(
                `Workspace ${name.value.trim()} added, but its caliband is unreachable: ` +
                  `${health.reason || "no reason given"}`,
                "error",
              );
            } else {
              banner(`Workspace ${name.value.trim()} added`, "ok");
            }
            for (const warning of (added && added.warnings) || []) banner(`Warning: ${warning}`, "warn", { timeout: 0 });
            await state.refreshFleet();
            onDone();
          } catch (err) {
            banner(err instanceof ApiError ? err.message : String(err), "error");
          } finally {
            submit.disabled = false;
            submit.textContent = "Add workspace";
          }
        },
      },
    },
    h("h2", { class: "card-title" }, "Add a workspace"),
    h(
      "div",
      { class: "form-row" },
      h("label", { class: "field" }, h("span", { class: "field-label" }, "Name"), name),
      h("label", { class: "field grow" }, h("span", { class: "field-label" }, "Root directory"), root),
      h("div", { class: "field field-end" }, submit),
    ),
    h(
      "details",
      { class: "ws-caliband" },
      h("summary", {}, "Networked caliband (optional)"),
      h(
        "div",
        { class: "form-row" },
        h("label", { class: "field" }, h("span", { class: "field-label" }, "Address"), net.addr),
        h("label", { class: "field grow" }, h("span", { class: "field-label" }, "CA file"), net.ca_file),
        h("label", { class: "field grow" }, h("span", { class: "field-label" }, "Token file"), net.token_file),
        h("label", { class: "field" }, h("span", { class: "field-label" }, "TLS server name"), net.server_name),
      ),
    ),
    h(
      "p",
      { class: "hint" },
      "Prospero finds (or autostarts) the caliband serving that root, or dials the networked one " +
        "given (files on prosperod's host; the token stays in its file).",
    ),
  );
  return form;
}

export function mount(root) {
  const f = loadFilters();
  const statsEl = h("div", { class: "stats" });
  const listEl = h("div", { class: "ws-list" });
  const addSlot = h("div", {});
  let adding = false;

  const search = h("input", {
    class: "input",
    type: "search",
    placeholder: "Filter by id, label, model…",
    "aria-label": "Filter agents",
    dataset: { search: "fleet" },
    props: { value: f.q },
    on: {
      input: () => {
        f.q = search.value.trim();
        update();
      },
    },
  });
  const select = (name, options, value) => {
    const el = h(
      "select",
      {
        class: "input",
        name,
        "aria-label": name,
        on: {
          change: () => {
            f[name] = el.value;
            update();
          },
        },
      },
      options.map(([v, label]) => h("option", { value: v }, label)),
    );
    el.value = value;
    return el;
  };
  const statusSel = select(
    "status",
    Object.entries(STATUS_FILTERS).map(([k, v]) => [k, v.label]),
    f.status,
  );
  const protoSel = select("protocol", [["", "All protocols"], ["ndjson", "ndjson"], ["acp", "acp"]], f.protocol);
  const wsSel = h("select", {
    class: "input",
    name: "workspace",
    "aria-label": "workspace",
    on: {
      change: () => {
        f.workspace = wsSel.value;
        update();
      },
    },
  });

  function fillWsSelect() {
    const names = (state.store.fleet?.workspaces || []).map((w) => w.name);
    const cur = f.workspace;
    replace(wsSel, h("option", { value: "" }, "All workspaces"), names.map((n) => h("option", { value: n }, n)));
    wsSel.value = names.includes(cur) ? cur : "";
  }

  function update() {
    saveFilters(f);
    renderStats(statsEl);
    fillWsSelect();
    const fleet = state.store.fleet;
    if (!fleet) {
      replace(listEl, emptyState("Loading the fleet…", state.store.error || ""));
      return;
    }
    const ws = fleet.workspaces.filter((w) => !f.workspace || w.name === f.workspace);
    if (!fleet.workspaces.length) {
      replace(
        listEl,
        emptyState(
          "No workspaces yet",
          "Register a workspace (a directory served by a caliband) to see and launch agents.",
          button("Add workspace", () => toggleAdd(true), "btn btn-primary"),
        ),
      );
      return;
    }
    // Re-rendered rows are new elements: the one focused (j/k) keeps the focus.
    const focused = document.activeElement?.closest?.("tr.agent-row")?.dataset.agentId;
    replace(listEl, ws.map((w) => workspaceCard(w, f)));
    if (focused) listEl.querySelector(`tr.agent-row[data-agent-id="${CSS.escape(focused)}"]`)?.focus({ preventScroll: true });
  }

  function toggleAdd(on) {
    adding = on ?? !adding;
    replace(addSlot, adding ? addWorkspaceForm(() => toggleAdd(false)) : null);
  }

  root.append(
    h(
      "section",
      { class: "page-head" },
      h("div", {}, h("h1", {}, "Fleet"), h("p", { class: "page-sub" }, "Workspaces, their calibands and agents — live.")),
      h(
        "div",
        { class: "page-actions" },
        button("Add workspace", () => toggleAdd(), "btn"),
        h("a", { class: "btn btn-primary", href: "#/spawn" }, "New agent"),
      ),
    ),
    statsEl,
    addSlot,
    h(
      "div",
      { class: "filters", role: "search" },
      search,
      statusSel,
      wsSel,
      protoSel,
      button(
        "Clear",
        () => {
          Object.assign(f, { q: "", status: "all", workspace: "", protocol: "" });
          search.value = "";
          statusSel.value = "all";
          protoSel.value = "";
          update();
        },
        "btn btn-ghost",
      ),
    ),
    listEl,
  );

  update();
  const offs = [state.on("fleet", update), state.on("decisions", update)];
  const ageTimer = setInterval(() => {
    for (const td of root.querySelectorAll("td[data-since]")) td.textContent = fmtAge(td.dataset.since);
  }, 15000);
  return () => {
    offs.forEach((off) => off());
    clearInterval(ageTimer);
  };
}
