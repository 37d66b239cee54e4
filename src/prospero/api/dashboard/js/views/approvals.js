// Approvals inbox: pending permission decisions across the fleet (issue 5's decisions API),
// with the tool call's input and one button per option. Live through the fleet stream's
// decision_pending / decision_resolved events; a 409 means someone else decided first.

import { ApiError } from "../api.js";
import { h, reconcile, replace } from "../dom.js";
import { fmtAge, parseTs, prettyJson, shortId } from "../format.js";
import * as state from "../state.js";
import { banner, button, emptyState, tag } from "../ui.js";

const OPTION_CLASS = {
  allow_once: "btn btn-primary",
  allow_always: "btn btn-primary-outline",
  reject_once: "btn btn-danger",
  reject_always: "btn btn-danger-outline",
};

function deadlineText(deadline) {
  const t = parseTs(deadline);
  if (t === null) return "no deadline";
  const left = t - Date.now();
  if (left <= 0) return "deadline passed";
  return `answers itself in ${fmtAge(Date.now() - left)}`;
}

function agentName(d) {
  const agent = state.findAgent(d.agent_id);
  return agent?.label || agent?.name || shortId(d.agent_id);
}

function agentWorkspace(d) {
  return ` · ${d.workspace || state.findAgent(d.agent_id)?.workspace || ""}`;
}

function decisionCard(d) {
  const tc = d.tool_call || {};
  const note = h("input", {
    class: "input note-input",
    placeholder: "Note (optional)",
    "aria-label": "Note",
    maxlength: "2000",
  });
  const buttons = (d.options || []).map((opt) => {
    const btn = button(
      opt.label || opt.id,
      async () => {
        for (const b of card.querySelectorAll("button")) b.disabled = true;
        try {
          await state.decide(d.id, opt.id, note.value.trim());
          banner(`${opt.label || opt.id}: ${tc.title || "tool call"}`, "ok");
        } catch (e) {
          if (e instanceof ApiError && e.status === 409) {
            banner("Already decided elsewhere (or expired) — the inbox was refreshed.", "info");
          } else {
            banner(e.message || String(e), "error");
          }
          for (const b of card.querySelectorAll("button")) b.disabled = false;
        }
      },
      OPTION_CLASS[opt.kind] || "btn",
      { dataset: { option: opt.id, optionKind: opt.kind || "" } },
    );
    return btn;
  });
  // An ask can arrive before the fleet snapshot knows its (just spawned) agent: the name is
  // filled in again on every fleet update (see mount()).
  const agentLink = h("a", { href: `#/agents/${encodeURIComponent(d.agent_id)}`, class: "link", dataset: { field: "agent" } }, agentName(d));
  const agentWs = h("span", { class: "muted" }, agentWorkspace(d));
  const askedText = () => ` · asked ${fmtAge(d.created_at)} ago`;
  const askedEl = d.created_at ? h("span", { class: "muted", title: d.created_at, dataset: { field: "asked" } }, askedText()) : null;
  const deadlineEl = h("span", { class: "muted", title: d.deadline || "", dataset: { field: "deadline" } }, ` · ${deadlineText(d.deadline)}`);
  const card = h(
    "article",
    { class: "card decision", dataset: { decisionId: d.id } },
    h(
      "header",
      { class: "decision-head" },
      h(
        "div",
        {},
        h("div", { class: "decision-title" }, tc.title || tc.kind || "Tool call"),
        h(
          "div",
          { class: "decision-sub" },
          tc.kind ? tag(tc.kind, "tag-kind") : null,
          agentLink,
          agentWs,
          askedEl,
          deadlineEl,
        ),
      ),
    ),
    h("h4", { class: "inspector-section" }, "Input"),
    h("pre", { class: "code", dataset: { field: "input" } }, prettyJson(tc.input ?? null)),
    h("div", { class: "decision-actions" }, note, h("div", { class: "option-buttons" }, buttons)),
  );
  card.refreshAgent = () => {
    agentLink.textContent = agentName(d);
    agentWs.textContent = agentWorkspace(d);
  };
  // Ages and the deadline count down while the card is open.
  card.refreshTimes = () => {
    if (askedEl) askedEl.textContent = askedText();
    deadlineEl.textContent = ` · ${deadlineText(d.deadline)}`;
  };
  return card;
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
    for (const d of items) next.set(d.id, cards.get(d.id) || decisionCard(d));
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
