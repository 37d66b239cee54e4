// Approvals inbox: pending permission decisions across the fleet (issue 5's decisions API),
// one card each (decision.js: the edit as a diff, else the tool call's input; one button per
// option). Live through the fleet stream's decision_pending / decision_resolved events; a 409
// means someone else decided first. j/k move between cards, a/d answer the focused one.

import { decisionCard } from "../decision.js";
import { h, reconcile, replace } from "../dom.js";
import * as state from "../state.js";
import { banner, button, emptyState } from "../ui.js";

function rootOf(d) {
  const ws = state.workspaceByName(d.workspace || state.findAgent(d.agent_id)?.workspace || "");
  return ws?.root || "";
}

export function mount(root) {
  const listEl = h("div", { class: "decision-list" });
  let cards = new Map();
  const notifyBtn = h("button", { type: "button", class: "btn btn-sm" });

  function renderNotify() {
    const on = state.notificationsOn();
    notifyBtn.hidden = !state.notificationsSupported() || state.store.decisions.available === false;
    notifyBtn.textContent = on ? "Notifications on" : "Enable notifications";
    notifyBtn.setAttribute("aria-pressed", on ? "true" : "false");
  }
  notifyBtn.addEventListener("click", async () => {
    const ok = await state.setNotifications(!state.notificationsOn());
    if (!ok && !state.notificationsOn() && Notification.permission === "denied") {
      banner("The browser blocks notifications for this site.", "info");
    }
    renderNotify();
  });

  function render() {
    const dec = state.store.decisions;
    listEl.dataset.loads = String(dec.loads); // snapshots applied (tests wait on it)
    renderNotify();
    if (dec.available === null) {
      replace(listEl, emptyState("Loading…", ""));
      return;
    }
    if (dec.available === false) {
      replace(
        listEl,
        h(
          "div",
          { class: "empty", dataset: { testid: "approvals-unavailable" } },
          h("div", { class: "empty-title" }, "Approvals are not available on this daemon"),
          h(
            "p",
            { class: "empty-text" },
            "This prosperod has no decisions API (GET /api/decisions answered 404). Supervised agents' permission requests appear here once it does.",
          ),
        ),
      );
      return;
    }
    const items = state.pendingDecisions();
    if (!items.length) {
      replace(listEl, emptyState("Nothing to approve", "Pending permission requests from supervised agents show up here, live."));
      return;
    }
    // Keyed: a card that stays keeps its typed note and focus.
    const next = new Map();
    for (const d of items) next.set(d.id, cards.get(d.id) || decisionCard(d, { root: rootOf(d) }));
    cards = next;
    reconcile(listEl, [...next.values()]);
  }

  root.append(
    h(
      "section",
      { class: "page-head" },
      h("div", {}, h("h1", {}, "Approvals"), h("p", { class: "page-sub" }, "Pending permission decisions across the fleet.")),
      h("div", { class: "page-actions" }, notifyBtn, button("Refresh", () => state.refreshDecisions(), "btn btn-sm")),
    ),
    listEl,
  );
  render();
  state.refreshDecisions();
  const offs = [
    state.on("decisions", render),
    state.on("fleet", () => {
      for (const card of cards.values()) card.refreshAgent();
    }),
  ];
  const timer = setInterval(() => {
    for (const card of cards.values()) card.refreshTimes();
  }, 1000);
  return () => {
    clearInterval(timer);
    offs.forEach((off) => off());
  };
}
