// The tool inspector panel: the selected call's state, timing, its change as a coloured
// unified diff when it edits files (edits.js), its input and its result.

import { h, replace } from "./dom.js";
import { diffView } from "./edits.js";
import { fmtDuration, fmtTime, prettyJson } from "./format.js";
import { toolDuration } from "./timeline.js";

function section(title) {
  return h("h4", { class: "inspector-section" }, title);
}

function inputOf(rec, collapsed) {
  const body =
    rec.input === undefined || rec.input === null
      ? h("p", { class: "muted", dataset: { field: "input" } }, rec.orphan ? "Start not seen." : "No input.")
      : h("pre", { class: "code", dataset: { field: "input" } }, prettyJson(rec.input));
  return collapsed ? h("details", { class: "raw-input" }, h("summary", {}, "Input"), body) : [section("Input"), body];
}

function resultOf(rec, st, collapsed) {
  const result = rec.result;
  if (st === "running") return [section("Result"), h("p", { class: "muted" }, "Still running…")];
  if (!result) return [section("Result"), h("p", { class: "muted" }, "No result reported.")];
  const body = h(
    "div",
    {},
    result.truncated ? h("p", { class: "note-warn" }, "Truncated by the agent.") : null,
    h("pre", { class: "code", dataset: { field: "result" } }, result.text ?? ""),
  );
  return collapsed ? h("details", { class: "raw-input" }, h("summary", {}, "Result"), body) : [section("Result"), body];
}

/** Show `rec` (a timeline tool record) in `panel`; null: the empty state. */
export function renderInspector(panel, rec, onClose, { root = "" } = {}) {
  if (!rec) {
    replace(
      panel,
      h(
        "div",
        { class: "inspector-empty" },
        h("div", { class: "inspector-title" }, "Tool inspector"),
        h("p", { class: "muted" }, "Select a tool call in the timeline to see its input and result."),
      ),
    );
    panel.classList.remove("open");
    return;
  }
  const st = rec.finished === null || rec.finished === undefined ? "running" : rec.ok ? "ok" : "failed";
  const dur = toolDuration(rec);
  const edits = rec.edits || [];
  // An edit's input is its diff; the diff of a result (an ACP edit's) stands for the result.
  const fromResult = !!rec.editsFromResult;
  replace(
    panel,
    h(
      "div",
      { class: "inspector-head" },
      h("div", { class: "inspector-title" }, rec.name),
      h("span", { class: ["pill", `ts-${st}`] }, st),
      h("button", { type: "button", class: "btn btn-ghost btn-sm inspector-close", "aria-label": "Close inspector", on: { click: onClose } }, "Close"),
    ),
    h(
      "dl",
      { class: "inspector-meta" },
      h("div", { class: "kv" }, h("dt", {}, "Call id"), h("dd", { class: "mono" }, rec.id || "—")),
      h("div", { class: "kv" }, h("dt", {}, "Started"), h("dd", {}, rec.started ? fmtTime(rec.started) : "—")),
      h("div", { class: "kv" }, h("dt", {}, "Duration"), h("dd", { dataset: { field: "duration" } }, dur !== null ? fmtDuration(dur) : "—")),
    ),
    edits.length ? [section(st === "failed" ? "Change (not applied: the call failed)" : "Change"), diffView(edits, { root })] : null,
    inputOf(rec, edits.length > 0 && !fromResult),
    resultOf(rec, st, fromResult),
  );
  panel.classList.add("open");
}
