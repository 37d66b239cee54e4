// Boot, hash router, header (host, connection, approvals badge, theme) and the token prompt.

import { onUnauthorized, signOut, whoami } from "./api.js";
import { $, clear, h } from "./dom.js";
import { installKeys, toggleHelp } from "./keys.js";
import * as state from "./state.js";
import { banner, clearBanners, tokenDialog } from "./ui.js";
import * as agentView from "./views/agent.js";
import * as approvalsView from "./views/approvals.js";
import * as automationsView from "./views/automations.js";
import * as fleetView from "./views/fleet.js";
import * as notificationsView from "./views/notifications.js";
import * as spawnView from "./views/spawn.js";
import * as usageView from "./views/usage.js";
import * as workspaceView from "./views/workspace.js";

const ROUTES = [
  { re: /^\/?$/, view: fleetView, nav: "fleet" },
  { re: /^\/agents\/([^/]+)$/, view: agentView, nav: "fleet" },
  { re: /^\/approvals$/, view: approvalsView, nav: "approvals" },
  { re: /^\/usage$/, view: usageView, nav: "usage" },
  { re: /^\/automations$/, view: automationsView, nav: "automations" },
  { re: /^\/notifications$/, view: notificationsView, nav: "notifications" },
  { re: /^\/spawn$/, view: spawnView, nav: "fleet" },
  { re: /^\/workspaces\/([^/]+)$/, view: workspaceView, nav: "fleet" },
];

let unmount = null;

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, qs = ""] = raw.split("?");
  return { path, query: new URLSearchParams(qs) };
}

function route() {
  const { path, query } = parseHash();
  if (unmount) {
    try {
      unmount();
    } catch (e) {
      console.error(e);
    }
    unmount = null;
  }
  clearBanners();
  const view = $("#view");
  clear(view);
  const match = ROUTES.map((r) => ({ r, m: path.match(r.re) })).find((x) => x.m);
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", !!match && a.dataset.nav === match.r.nav);
  }
  if (!match) {
    view.append(
      h(
        "div",
        { class: "empty" },
        h("div", { class: "empty-title" }, "Page not found"),
        h("a", { href: "#/", class: "btn" }, "Back to the fleet"),
      ),
    );
    return;
  }
  const params = match.m.slice(1).map((p) => decodeURIComponent(p));
  document.body.dataset.page = match.r.nav;
  unmount = match.r.view.mount(view, { params, query }) || null;
  window.scrollTo(0, 0);
}

// ------------------------------------------------------------------------------- header

const THEMES = ["system", "light", "dark"];
const THEME_LABEL = { system: "System", light: "Light", dark: "Dark" };
const THEME_ICON = { system: "◐", light: "☀", dark: "☾" };

function currentTheme() {
  const t = document.documentElement.getAttribute("data-theme");
  return THEMES.includes(t) ? t : "system";
}

function applyTheme(t) {
  document.documentElement.setAttribute("data-theme", t);
  try {
    localStorage.setItem("prospero.theme", t);
  } catch {
    /* storage disabled */
  }
  const btn = $("#theme-toggle");
  btn.textContent = `Theme: ${THEME_LABEL[t]}`;
  btn.dataset.icon = THEME_ICON[t]; // shown instead of the words on a narrow screen
  btn.setAttribute("title", "Cycle the colour theme: System → Light → Dark");
}

const CONN_TEXT = {
  connecting: "connecting",
  live: "live",
  reconnecting: "reconnecting",
  finished: "closed",
};

function renderConn() {
  const el = $("#conn");
  const st = state.store.stale ? "stale" : state.store.conn;
  el.dataset.state = st;
  el.textContent = st === "stale" ? "stale" : CONN_TEXT[st] || st;
  el.setAttribute(
    "title",
    st === "stale"
      ? `Last refresh failed (${state.store.error}); showing the last good snapshot`
      : `Fleet event stream: ${CONN_TEXT[st] || st}`,
  );
}

function renderBadge() {
  const badge = $("#approvals-badge");
  const dec = state.store.decisions;
  const n = dec.available ? dec.items.size : 0;
  badge.textContent = String(n);
  badge.hidden = n === 0;
  badge.setAttribute("aria-label", `${n} pending approvals`);
}

function renderHost() {
  const host = state.store.fleet?.host;
  const el = $("#host");
  el.textContent = host ? host : "";
  el.hidden = !host;
}

async function renderAuth() {
  const me = await whoami();
  const btn = $("#signout");
  btn.hidden = !(me && me.via === "cookie");
  btn.title = me && me.name ? `Signed in as ${me.name} (${me.scope})` : "";
}

function setupHeader() {
  applyTheme(currentTheme());
  $("#theme-toggle").addEventListener("click", () => {
    const next = THEMES[(THEMES.indexOf(currentTheme()) + 1) % THEMES.length];
    applyTheme(next);
  });
  $("#keys-help").addEventListener("click", () => toggleHelp());
  $("#signout").addEventListener("click", async () => {
    try {
      await signOut();
    } finally {
      location.reload();
    }
  });
  state.on("conn", renderConn);
  state.on("fleet", () => {
    renderConn();
    renderHost();
  });
  state.on("decisions", renderBadge);
  renderConn();
  renderBadge();
}

// ---------------------------------------------------------------------------------- boot

async function boot() {
  onUnauthorized(async (reason) => {
    const ok = await tokenDialog(reason);
    renderAuth();
    return ok;
  });
  setupHeader();
  installKeys();
  window.addEventListener("hashchange", route);
  // Debug/test hook: drop the live connections as a network failure would.
  window.prospero = { dropStreams: () => window.dispatchEvent(new Event("prospero:drop")) };
  window.addEventListener("prospero:drop", () => state.dropStreams());
  try {
    await state.start();
  } catch (e) {
    banner(
      e.status === 401
        ? "Sign in with an API token to use this dashboard. Reload the page to sign in."
        : `Cannot reach prosperod: ${e.message || e}`,
      "error",
    );
  }
  renderAuth();
  route();
}

boot();
