// Reviewable changes: the file edits a tool call makes, read from what it carries, and their
// rendering as a coloured unified diff.
//
// Recognised (by the input's shape, whatever the tool is called, so NDJSON and ACP agents
// alike):
// - Claude-style `Edit` {file_path, old_string, new_string} (also old_str/new_str, oldText/
//   newText; `path`/`filePath` for the path), `MultiEdit` {file_path, edits: [...]},
//   `Write` {file_path, content} (also file_text / contents);
// - ACP `diff` content, carried as `tool_started.diffs` [{path, old_text, new_text}]
//   (old_text null: a new file);
// - unified diff text: a patch tool's `patch`/`diff` input, or a result prosperod rendered
//   from ACP diff content.

import { countChanges, diffLines, parseUnified, splitLines, toHunks } from "./diff.js";
import { h } from "./dom.js";
import { colourLine, languageOf } from "./syntax.js";

const MAX_LINES = 1500; // rendered per diff view; the rest is summarised

function str(v) {
  return typeof v === "string" ? v : null;
}

function pathOf(input) {
  for (const key of ["file_path", "path", "filePath", "filename", "target_file", "notebook_path"]) {
    const v = str(input[key]);
    if (v) return v;
  }
  return null;
}

function pairOf(obj) {
  for (const [o, n] of [
    ["old_string", "new_string"],
    ["old_str", "new_str"],
    ["oldText", "newText"],
    ["old_text", "new_text"],
  ]) {
    if (str(obj[o]) !== null && str(obj[n]) !== null) return [obj[o], obj[n]];
  }
  return null;
}

function fileEdit(path, kind, hunks, numbered) {
  return { path, kind, hunks, numbered, ...countChanges(hunks) };
}

/** A snippet replacement: the whole old and new snippets, line numbers unknown. */
function snippetHunks(oldText, newText) {
  return toHunks(diffLines(splitLines(oldText), splitLines(newText)), Infinity);
}

function fromUnified(text) {
  const files = parseUnified(text);
  if (!files) return [];
  return files.map((f) =>
    fileEdit(f.newPath || f.oldPath || "?", f.oldPath === null ? "create" : f.newPath === null ? "delete" : "patch", f.hunks, true),
  );
}

/** The file edits of a tool call: [{path, kind, hunks, numbered, adds, dels}] (empty: not an
 *  edit). `kind`: edit | multi-edit | write | create | patch | delete. */
export function editsOf(name, input, diffs) {
  const out = [];
  for (const d of Array.isArray(diffs) ? diffs : []) {
    if (!d || typeof d !== "object") continue;
    const oldText = d.old_text ?? d.oldText ?? null;
    const newText = str(d.new_text ?? d.newText) ?? "";
    const ops = diffLines(splitLines(oldText ?? ""), splitLines(newText));
    out.push(fileEdit(str(d.path) || "?", oldText === null ? "create" : "edit", toHunks(ops, 3), true));
  }
  if (out.length) return out;
  if (typeof input === "string") return fromUnified(input);
  if (!input || typeof input !== "object" || Array.isArray(input)) return out;
  const path = pathOf(input);
  const pair = pairOf(input);
  if (path && pair) return [fileEdit(path, "edit", snippetHunks(pair[0], pair[1]), false)];
  if (path && Array.isArray(input.edits)) {
    const hunks = input.edits
      .map((e) => (e && typeof e === "object" ? pairOf(e) : null))
      .filter(Boolean)
      .flatMap(([o, n]) => snippetHunks(o, n));
    if (hunks.length) return [fileEdit(path, "multi-edit", hunks, false)];
  }
  const content = str(input.content) ?? str(input.file_text) ?? str(input.contents);
  if (path && content !== null && !/read|grep|search|glob|fetch/i.test(name || "")) {
    const ops = splitLines(content).map((text, i) => ({ t: "+", text, a: null, b: i + 1 }));
    return [fileEdit(path, "write", ops.length ? toHunks(ops, 0) : [], true)];
  }
  for (const key of ["patch", "diff", "input"]) {
    const text = str(input[key]);
    if (text) {
      const found = fromUnified(text);
      if (found.length) return found;
    }
  }
  return out;
}

/** The file edits a tool's result text shows (a unified diff), else []. */
export function resultEdits(result) {
  return fromUnified(result && typeof result.text === "string" ? result.text : "");
}

/** A path shown relative to `root` when it lies inside it. */
export function shownPath(path, root) {
  if (root && path.startsWith(root.endsWith("/") ? root : `${root}/`)) {
    return path.slice(root.length).replace(/^\/+/, "");
  }
  return path;
}

function stat(e) {
  return h(
    "span",
    { class: "diff-stat" },
    h("span", { class: "diff-adds" }, `+${e.adds}`),
    h("span", { class: "diff-dels" }, `−${e.dels}`),
  );
}

function line(op, numbered, lang) {
  const cls = op.t === "+" ? "diff-add" : op.t === "-" ? "diff-del" : "diff-ctx";
  return h(
    "div",
    { class: ["diff-line", cls] },
    h("span", { class: "diff-ln", "aria-hidden": "true" }, numbered && op.a !== null ? String(op.a) : ""),
    h("span", { class: "diff-ln", "aria-hidden": "true" }, numbered && op.b !== null ? String(op.b) : ""),
    h("span", { class: "diff-sign", "aria-hidden": "true" }, op.t === " " ? " " : op.t === "-" ? "−" : "+"),
    h("span", { class: "diff-text" }, colourLine(op.text, lang)),
  );
}

function hunkHeader(hk, numbered) {
  const text = numbered
    ? `@@ -${hk.oldStart},${hk.oldLines} +${hk.newStart},${hk.newLines} @@${hk.section ? ` ${hk.section}` : ""}`
    : `@@ replaced ${hk.oldLines} line${hk.oldLines === 1 ? "" : "s"} with ${hk.newLines} @@`;
  return h("div", { class: "diff-hunk" }, text);
}

/** One file's diff: a header (path, what happened, +/− counts) and its hunks. */
export function fileDiff(e, { root } = {}) {
  const lang = languageOf(e.path);
  const body = h("div", { class: "diff-body" });
  let shown = 0;
  let hidden = 0;
  for (const hk of e.hunks) {
    if (shown >= MAX_LINES) {
      hidden += hk.ops.length;
      continue;
    }
    body.append(hunkHeader(hk, e.numbered));
    for (const op of hk.ops) {
      if (shown >= MAX_LINES) hidden += 1;
      else {
        body.append(line(op, e.numbered, lang));
        shown += 1;
      }
    }
  }
  if (!e.hunks.length) body.append(h("div", { class: "diff-hunk" }, e.kind === "write" ? "(empty file)" : "(no change)"));
  if (hidden) body.append(h("div", { class: "diff-more muted" }, `… ${hidden} more line${hidden === 1 ? "" : "s"} not shown`));
  return h(
    "section",
    { class: ["diff", e.numbered ? null : "diff-unnumbered"], dataset: { path: e.path, kind: e.kind } },
    h(
      "header",
      { class: "diff-file" },
      h("span", { class: "diff-path mono", title: e.path }, shownPath(e.path, root)),
      h("span", { class: ["tag", `diff-kind-${e.kind}`] }, e.kind === "write" ? "write" : e.kind),
      stat(e),
    ),
    body,
  );
}

/** Every edit's diff, one after the other. */
export function diffView(edits, opts = {}) {
  return h("div", { class: "diffs", dataset: { field: "diff" } }, edits.map((e) => fileDiff(e, opts)));
}
