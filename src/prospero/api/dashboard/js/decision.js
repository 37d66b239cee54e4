// A pending permission decision as a card: what the tool call is (its edit as a diff when it
// is one, else its input), an optional note and one button per option the agent offered.
// Used by the approvals inbox and, compact, on the agent's own timeline. `a` / `d` on a
// focused card answer it (allow once / reject once: see keys.js).

import { ApiError } from "./api.js";
import { h } from "./dom.js";
import { diffView, editsOf } from "./edits.js";
import { fmtAge, parseTs, prettyJson, shortId } from "./format.js";
import * as state from "./state.js";
import { banner, button, tag } from "./ui.js";

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

/** The option a key answers with: `a` the first allow_once (else any allow), `d` the first
 *  reject_once (else any reject). */
export function optionForKey(options, key) {
  const want = key === "a" ? "allow" : key === "d" ? "reject" : null;
  if (!want) return null;
  return (
    options.find((o) => o.kind === `${want}_once`) ||
    options.find((o) => String(o.kind || "").startsWith(want)) ||
    null
  );
}

/**
 * @param {object} d         the decision (state.js's normalised form)
 * @param {object} opts      compact: for the timeline (no agent link); edits: the file edits
 *                           to show, when known better than from the request's input (the
 *                           call's tool_started: its ACP diff content has the whole file);
 *                           root: the workspace root paths are shown relative to
 */
export function decisionCard(d, { compact = false, edits = null, root = "" } = {}) {
  const tc = d.tool_call || {};
  const note = h("input", {
    class: "input note-input",
    placeholder: "Note (optional)",
    "aria-label": "Note",
    maxlength: "2000",
  });
  async function answer(opt) {
    for (const b of card.querySelectorAll("button")) b.disabled = true;
    try {
      await state.decide(d.id, opt.id, note.value.trim());
      banner(`${opt.label || opt.id}: ${tc.title || "tool call"}`, "ok");
      card.dataset.answered = opt.id;
    } catch (e) {
      if (e instanceof ApiError && e.status === 409) {
        banner("Already decided elsewhere (or expired) — the inbox was refreshed.", "info");
      } else {
        banner(e.message || String(e), "error");
      }
      for (const b of card.querySelectorAll("button")) b.disabled = false;
    }
  }
  const buttons = (d.options || []).map((opt) =>
    button(opt.label || opt.id, () => answer(opt), OPTION_CLASS[opt.kind] || "btn", {
      dataset: { option: opt.id, optionKind: opt.kind || "" },
    }),
  );
  // An ask can arrive before the fleet snapshot knows its (just spawned) agent: the name is
  // filled in again on every fleet update (`refreshAgent`).
  const agentLink = compact
    ? null
    : h("a", { href: `#/agents/${encodeURIComponent(d.agent_id)}`, class: "link", dataset: { field: "agent" } }, agentName(d));
  const agentWs = compact ? null : h("span", { class: "muted" }, agentWorkspace(d));
  const askedText = () => ` · asked ${fmtAge(d.created_at)} ago`;
  const askedEl = d.created_at ? h("span", { class: "muted", title: d.created_at, dataset: { field: "asked" } }, askedText()) : null;
  const deadlineEl = h("span", { class: "muted", title: d.deadline || "", dataset: { field: "deadline" } }, ` · ${deadlineText(d.deadline)}`);
  const shownEdits = edits?.length ? edits : editsOf(tc.title || tc.kind || "", tc.input, tc.diffs);
  const inputPre = h("pre", { class: "code", dataset: { field: "input" } }, prettyJson(tc.input ?? null));
  const card = h(
    "article",
    {
      class: ["decision", compact ? "decision-inline" : "card"],
      tabindex: "0",
      dataset: { decisionId: d.id, navItem: "decision" },
      "aria-label": `Permission request: ${tc.title || tc.kind || "tool call"}`,
    },
    h(
      "header",
      { class: "decision-head" },
      h(
        "div",
        {},
        h("div", { class: "decision-title" }, tc.title || tc.kind || "Tool call"),
        h("div", { class: "decision-sub" }, tc.kind ? tag(tc.kind, "tag-kind") : null, agentLink, agentWs, askedEl, deadlineEl),
      ),
    ),
    shownEdits.length ? h("h4", { class: "inspector-section" }, "Proposed change") : null,
    shownEdits.length ? diffView(shownEdits, { root }) : null,
    shownEdits.length
      ? h("details", { class: "raw-input" }, h("summary", {}, "Input"), inputPre)
      : [h("h4", { class: "inspector-section" }, "Input"), inputPre],
    h("div", { class: "decision-actions" }, note, h("div", { class: "option-buttons" }, buttons)),
  );
  card.answerKey = (key) => {
    const opt = optionForKey(d.options || [], key);
    if (opt && !card.dataset.answered) answer(opt);
    return !!opt;
  };
  card.refreshAgent = () => {
    if (agentLink) agentLink.textContent = agentName(d);
    if (agentWs) agentWs.textContent = agentWorkspace(d);
  };
  // Ages and the deadline count down while the card is open.
  card.refreshTimes = () => {
    if (askedEl) askedEl.textContent = askedText();
    deadlineEl.textContent = ` · ${deadlineText(d.deadline)}`;
  };
  return card;
}
