// "Files changed": the files the run's edit and write tool calls touched, derived from the
// timeline's tool records (edits.js), with +/- line counts summed over the calls that did not
// fail. A file is "pending" while a call on it runs, and "not applied" when every call on it
// failed (e.g. a denied edit: its counts are then those of the attempt, struck through).
// Clicking a file opens its latest call in the inspector.

import { h, replace } from "./dom.js";
import { shownPath } from "./edits.js";
import { plural } from "./format.js";

function stateOf(rec) {
  return rec.finished === null || rec.finished === undefined ? "running" : rec.ok ? "ok" : "failed";
}

/** path -> {path, adds, dels, calls: [rec], applied, running}, in first-touched order. */
export function changedFiles(tools) {
  const files = new Map();
  for (const rec of tools) {
    for (const e of rec.edits || []) {
      let f = files.get(e.path);
      if (!f) {
        f = { path: e.path, adds: 0, dels: 0, tried: [0, 0], calls: [], applied: 0, running: 0, kinds: new Set() };
        files.set(e.path, f);
      }
      const st = stateOf(rec);
      if (!f.calls.includes(rec)) f.calls.push(rec);
      f.kinds.add(e.kind);
      f.tried[0] += e.adds;
      f.tried[1] += e.dels;
      if (st === "failed") continue;
      if (st === "running") f.running += 1;
      else f.applied += 1;
      f.adds += e.adds;
      f.dels += e.dels;
    }
  }
  for (const f of files.values()) {
    if (!f.applied && !f.running) [f.adds, f.dels] = f.tried;
  }
  return [...files.values()];
}

export class FilesPanel {
  constructor({ onSelect, root }) {
    this.onSelect = onSelect;
    this.root = root || (() => "");
    this.list = h("ul", { class: "files-list" });
    this.count = h("span", { class: "muted files-count" });
    this.el = h(
      "section",
      { class: "files-card card", "aria-label": "Files changed", hidden: true },
      h("div", { class: "files-head" }, h("h2", { class: "card-title" }, "Files changed"), this.count),
      this.list,
    );
    this.queued = false;
  }

  /** Re-derive from the tool records (batched per frame: a replay reports many calls). */
  update(tools) {
    if (this.queued) return;
    this.queued = true;
    requestAnimationFrame(() => {
      this.queued = false;
      this.render(tools);
    });
  }

  render(tools) {
    const files = changedFiles(tools);
    this.el.hidden = files.length === 0;
    const counted = files.filter((f) => f.applied || f.running);
    const adds = counted.reduce((n, f) => n + f.adds, 0);
    const dels = counted.reduce((n, f) => n + f.dels, 0);
    this.count.textContent = `${plural(files.length, "file")} · +${adds} −${dels}`;
    const root = this.root();
    replace(
      this.list,
      files.map((f) => {
        const status = f.running ? "pending" : f.applied ? "changed" : "not applied";
        const last = f.calls[f.calls.length - 1];
        return h(
          "li",
          { class: ["file-row", `file-${status.replace(" ", "-")}`], dataset: { path: f.path, status } },
          h(
            "button",
            {
              type: "button",
              class: "file-btn",
              title: `${f.path} — ${plural(f.calls.length, "call")}: open the latest in the inspector`,
              on: { click: () => this.onSelect(last) },
            },
            h("span", { class: "file-path mono" }, shownPath(f.path, root)),
            status !== "changed" ? h("span", { class: "tag file-status" }, status) : null,
            h("span", { class: "diff-stat" }, h("span", { class: "diff-adds" }, `+${f.adds}`), h("span", { class: "diff-dels" }, `−${f.dels}`)),
          ),
        );
      }),
    );
  }
}
