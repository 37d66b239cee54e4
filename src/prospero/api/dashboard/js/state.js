// The fleet as the dashboard knows it: capabilities, the /api/fleet snapshot, per-agent
// totals, pending decisions — kept current by the fleet SSE stream (resumed from the store
// ordinal /api/dashboard/summary reports) plus a slow poll as a safety net. Views subscribe to
// topics ("fleet", "decisions", "conn") and re-render from here.

import { ApiError, enc, get, post } from "./api.js";
import { ResumableStream } from "./sse.js";

const POLL_MS = 10000;

const listeners = new Map();

export function on(topic, fn) {
  if (!listeners.has(topic)) listeners.set(topic, new Set());
  listeners.get(topic).add(fn);
  return () => listeners.get(topic).delete(fn);
}

function emit(topic, data) {
  for (const fn of listeners.get(topic) || []) {
    try {
      fn(data);
    } catch (e) {
      console.error(e);
    }
  }
}

export const store = {
  caps: null,
  fleet: null, // {host, workspaces: [{name, root, sources, health, config, agents: [...]}]}
  totals: {}, // agent id -> {input_tokens, output_tokens, cost_usd, turns, seq, outcome}
  stale: false,
  error: "",
  conn: "connecting",
  decisions: { available: null, items: new Map(), error: "", loads: 0 },
};

let fleetStream = null;
let pollTimer = null;
let fleetTimer = null;
let totalsTimer = null;
let started = false;

export function agents() {
  const out = [];
  for (const ws of store.fleet?.workspaces || []) for (const a of ws.agents || []) out.push(a);
  return out;
}

export function findAgent(id) {
  return agents().find((a) => a.id === id) || null;
}

export function workspaceByName(name) {
  return (store.fleet?.workspaces || []).find((w) => w.name === name) || null;
}

export async function loadCaps() {
  if (!store.caps) {
    try {
      store.caps = await get("/api/capabilities");
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) throw e;
      store.caps = { admin: true, async_workspace_ops: false, drive_protocols: ["ndjson"] };
    }
  }
  return store.caps;
}

// Responses can come back out of order: only the newest request's answer is applied.
let fleetReq = 0;
let totalsReq = 0;

export async function refreshFleet() {
  const my = ++fleetReq;
  try {
    const fleet = await get("/api/fleet");
    if (my !== fleetReq) return store.fleet;
    store.fleet = fleet;
    store.stale = false;
    store.error = "";
  } catch (e) {
    if (my !== fleetReq) return store.fleet;
    store.stale = true;
    store.error = e.message || String(e);
  }
  emit("fleet", store);
  return store.fleet;
}

export async function refreshTotals() {
  const my = ++totalsReq;
  try {
    const summary = await get("/api/dashboard/summary");
    if (my !== totalsReq) return summary;
    store.totals = summary.agents || {};
    emit("fleet", store);
    return summary;
  } catch {
    return null;
  }
}

export function scheduleFleetRefresh(ms = 150) {
  clearTimeout(fleetTimer);
  fleetTimer = setTimeout(refreshFleet, ms);
}

function scheduleTotalsRefresh(ms = 600) {
  if (totalsTimer) return;
  totalsTimer = setTimeout(() => {
    totalsTimer = null;
    refreshTotals();
  }, ms);
}

function setConn(state) {
  store.conn = state;
  emit("conn", state);
}

// The kinds onFleetEvent (and the views listening to "event") act on. Output and tool events,
// the bulk of a busy fleet's stream, are left to the agent page's own stream.
const FLEET_KINDS = [
  "agent_spawned",
  "agent_discovered",
  "agent_gone",
  "status_changed",
  "repo_health",
  "turn_finished",
  "agent_finished",
  "decision_pending",
  "decision_resolved",
];

function onFleetEvent(ev) {
  const k = ev.kind || {};
  switch (k.kind) {
    case "status_changed": {
      const a = findAgent(ev.agent_id);
      if (a) {
        a.status = k.to;
        emit("fleet", store);
      } else scheduleFleetRefresh();
      break;
    }
    case "repo_health": {
      const ws = workspaceByName(ev.repo);
      if (ws && k.state) {
        ws.health = k.state;
        emit("fleet", store);
      }
      scheduleFleetRefresh(500);
      break;
    }
    case "agent_spawned":
    case "agent_discovered":
    case "agent_gone":
      scheduleFleetRefresh();
      scheduleTotalsRefresh();
      break;
    case "turn_finished":
    case "agent_finished":
      scheduleTotalsRefresh();
      break;
    case "decision_pending":
      decisionPending(ev);
      break;
    case "decision_resolved":
      decisionResolved(ev);
      break;
    default:
      break;
  }
  emit("event", ev);
}

export async function start() {
  if (started) return;
  started = true;
  await loadCaps();
  const [, summary] = await Promise.all([refreshFleet(), refreshTotals()]);
  refreshDecisions();
  const from = summary && Number.isFinite(summary.last_ordinal) ? summary.last_ordinal + 1 : 0;
  fleetStream = new ResumableStream(
    `/api/stream?kinds=${FLEET_KINDS.join(",")}`,
    {
      onEvent: onFleetEvent,
      onGap: () => {
        scheduleFleetRefresh();
        scheduleTotalsRefresh();
      },
      onState: (state) => {
        setConn(state);
        if (state === "live") scheduleFleetRefresh(0); // catch up on what a drop hid
      },
    },
    from,
  ).start();
  pollTimer = setInterval(() => {
    refreshFleet();
    if (store.decisions.available !== false) refreshDecisions();
  }, POLL_MS);
}

export function dropStreams() {
  if (fleetStream) fleetStream.drop();
}

export function stop() {
  if (fleetStream) fleetStream.stop();
  clearInterval(pollTimer);
  started = false;
}

// ----------------------------------------------------------------------------- decisions
// The decisions API (issue 5): GET /api/decisions?state=pending, POST /api/decisions/{id}
// {option_id, note?}, and fleet events decision_pending / decision_resolved carrying the
// decision. A daemon without it answers 404: the inbox then says approvals are unavailable.

function normaliseDecision(d, ev) {
  const id = d.id ?? d.decision_id;
  return {
    ...d,
    id: id == null ? "" : String(id),
    agent_id: d.agent_id || ev?.agent_id || "",
    workspace: d.workspace || ev?.repo || "",
    tool_call: d.tool_call || {},
    options: Array.isArray(d.options) ? d.options : [],
    state: d.state || "pending",
  };
}

function decisionOf(ev) {
  const k = ev.kind || {};
  return normaliseDecision(k.decision && typeof k.decision === "object" ? k.decision : k, ev);
}

// A GET snapshot can be older than the events that arrived while it was in flight: it must
// neither bring back an answered decision nor drop an ask that arrived meanwhile. Answered
// ids are remembered (a decision never becomes pending again), and every decision event bumps
// a counter that live-added asks carry.
let decisionsReq = 0;
let decisionEvents = 0;
const answered = new Set();
const ANSWERED_MAX = 2000;

function markAnswered(id) {
  decisionEvents += 1;
  answered.add(id);
  if (answered.size > ANSWERED_MAX) answered.delete(answered.values().next().value);
}

/** How many permission requests of this agent wait for a human: the live decisions when the
 *  daemon has the decisions API, else what /api/fleet said (`pending_decisions`). */
export function pendingFor(agent) {
  const id = typeof agent === "string" ? agent : agent?.id;
  const dec = store.decisions;
  if (dec.available) {
    let n = 0;
    for (const d of dec.items.values()) if (d.agent_id === id) n += 1;
    return n;
  }
  const a = typeof agent === "string" ? findAgent(agent) : agent;
  return Number(a?.pending_decisions) || 0;
}

export function pendingDecisions() {
  return [...store.decisions.items.values()].sort((a, b) =>
    String(a.created_at || "").localeCompare(String(b.created_at || "")),
  );
}

export async function refreshDecisions() {
  const dec = store.decisions;
  const my = ++decisionsReq;
  const since = decisionEvents;
  try {
    const list = await get("/api/decisions?state=pending");
    if (my !== decisionsReq) return; // a newer refresh is on its way
    const items = new Map();
    for (const d of Array.isArray(list) ? list : list?.decisions || []) {
      const n = normaliseDecision(d);
      if (n.id && n.state === "pending" && !answered.has(n.id)) items.set(n.id, n);
    }
    for (const [id, d] of dec.items) {
      if (d.liveSince > since && !items.has(id)) items.set(id, d); // asked after the snapshot
    }
    dec.available = true;
    dec.error = "";
    dec.items = items;
    dec.loads += 1;
  } catch (e) {
    if (my !== decisionsReq) return;
    if (e instanceof ApiError && (e.status === 404 || e.status === 405)) {
      dec.available = false;
      dec.items = new Map();
    } else {
      dec.error = e.message || String(e);
    }
  }
  emit("decisions", dec);
}

function decisionPending(ev) {
  const d = decisionOf(ev);
  if (!d.id || answered.has(d.id)) return;
  decisionEvents += 1;
  d.liveSince = decisionEvents;
  if (store.decisions.available !== true) {
    refreshDecisions();
    return;
  }
  const fresh = !store.decisions.items.has(d.id);
  store.decisions.items.set(d.id, d);
  emit("decisions", store.decisions);
  if (fresh) notify(d);
}

function decisionResolved(ev) {
  const d = decisionOf(ev);
  if (!d.id) return;
  markAnswered(d.id);
  if (store.decisions.items.delete(d.id)) {
    emit("decisions", store.decisions);
    emit("decision-resolved", d);
  }
}

/** POST the choice. Resolves to "ok"; throws ApiError (409: decided elsewhere / expired). */
export async function decide(id, optionId, note) {
  const body = { option_id: optionId };
  if (note) body.note = note;
  try {
    await post(`/api/decisions/${enc(id)}`, body);
  } catch (e) {
    if (e instanceof ApiError && (e.status === 409 || e.status === 404)) {
      markAnswered(id);
      store.decisions.items.delete(id);
      emit("decisions", store.decisions);
      refreshDecisions();
    }
    throw e;
  }
  markAnswered(id);
  store.decisions.items.delete(id);
  emit("decisions", store.decisions);
  return "ok";
}

// ------------------------------------------------------------------- browser notifications

const NOTIFY_KEY = "prospero.notify";

export function notificationsSupported() {
  return typeof window.Notification === "function";
}

export function notificationsOn() {
  try {
    return (
      notificationsSupported() &&
      localStorage.getItem(NOTIFY_KEY) === "on" &&
      Notification.permission === "granted"
    );
  } catch {
    return false;
  }
}

export async function setNotifications(onOff) {
  try {
    if (!onOff) {
      localStorage.removeItem(NOTIFY_KEY);
      return false;
    }
    if (!notificationsSupported()) return false;
    const perm =
      Notification.permission === "granted" ? "granted" : await Notification.requestPermission();
    if (perm !== "granted") return false;
    localStorage.setItem(NOTIFY_KEY, "on");
    return true;
  } catch {
    return false;
  }
}

function notify(d) {
  if (!notificationsOn()) return;
  try {
    const title = d.tool_call?.title || d.tool_call?.kind || "a tool call";
    const n = new Notification("Approval needed", {
      body: `${d.agent_id}: ${title}`.slice(0, 200),
      tag: `prospero-decision-${d.id}`,
    });
    n.onclick = () => {
      window.focus();
      location.hash = "#/approvals";
    };
  } catch {
    /* notifications can fail (e.g. no service worker on some platforms): the badge remains */
  }
}
