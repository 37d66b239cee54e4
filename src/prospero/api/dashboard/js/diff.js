// Line diffs for reviewing edits, as pure functions (no DOM):
//
// - `diffLines(a, b)`: Myers' O(ND) diff of two line arrays (common prefix and suffix trimmed
//   first, so a small edit of a big file costs little); past a work bound it falls back to
//   "all old lines out, all new lines in" rather than stall the page;
// - `toHunks(ops, context)`: unified hunks with `context` unchanged lines around each change;
// - `parseUnified(text)`: the files and hunks of unified diff text (`---`/`+++`/`@@`), e.g. a
//   patch tool's input or an ACP edit's result, which prosperod renders as a unified diff.
//
// An op is {t: " " | "-" | "+", text, a, b}: `a`/`b` are its 1-based line numbers in the old
// and new text (null on the side it is absent from).

// Bound on Myers' work (edit distance x the lines compared), about a few ms of JS.
const MAX_WORK = 4_000_000;

export function splitLines(text) {
  if (text === null || text === undefined || text === "") return [];
  const lines = String(text).split("\n");
  if (lines.length > 1 && lines[lines.length - 1] === "") lines.pop(); // the final newline
  return lines;
}

function same(ops, a, b, ai, bi, n) {
  for (let i = 0; i < n; i += 1) ops.push({ t: " ", text: a[ai + i], a: ai + i + 1, b: bi + i + 1 });
}

/** The edit script from `a` to `b` (arrays of lines), in order. */
export function diffLines(a, b) {
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start += 1;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
    endA -= 1;
    endB -= 1;
  }
  const ops = [];
  same(ops, a, b, 0, 0, start);
  const mid = myers(a.slice(start, endA), b.slice(start, endB));
  for (const op of mid) {
    ops.push({
      t: op.t,
      text: op.text,
      a: op.a === null ? null : op.a + start,
      b: op.b === null ? null : op.b + start,
    });
  }
  same(ops, a, b, endA, endB, a.length - endA);
  return ops;
}

function replaceAll(a, b) {
  return [
    ...a.map((text, i) => ({ t: "-", text, a: i + 1, b: null })),
    ...b.map((text, i) => ({ t: "+", text, a: null, b: i + 1 })),
  ];
}

function myers(a, b) {
  const n = a.length;
  const m = b.length;
  if (!n || !m) return replaceAll(a, b);
  const max = n + m;
  const off = max + 1;
  const v = new Int32Array(2 * max + 3);
  const trace = [];
  for (let d = 0; d <= max; d += 1) {
    if (d * (n + m) > MAX_WORK) return replaceAll(a, b);
    trace.push(v.slice(off - d - 1, off + d + 2)); // v[-d-1 .. d+1] before step d
    for (let k = -d; k <= d; k += 2) {
      let x = k === -d || (k !== d && v[off + k - 1] < v[off + k + 1]) ? v[off + k + 1] : v[off + k - 1] + 1;
      let y = x - k;
      while (x < n && y < m && a[x] === b[y]) {
        x += 1;
        y += 1;
      }
      v[off + k] = x;
      if (x >= n && y >= m) return backtrack(trace, a, b);
    }
  }
  return replaceAll(a, b);
}

function backtrack(trace, a, b) {
  const out = [];
  let x = a.length;
  let y = b.length;
  for (let d = trace.length - 1; d >= 0; d -= 1) {
    const snap = trace[d]; // index i holds v[i - d - 1]
    const at = (k) => snap[k + d + 1];
    const k = x - y;
    const prevK = k === -d || (k !== d && at(k - 1) < at(k + 1)) ? k + 1 : k - 1;
    const prevX = d === 0 ? 0 : at(prevK);
    const prevY = d === 0 ? 0 : prevX - prevK;
    while (x > prevX && y > prevY) {
      x -= 1;
      y -= 1;
      out.push({ t: " ", text: a[x], a: x + 1, b: y + 1 });
    }
    if (d > 0) {
      if (x === prevX) {
        y -= 1;
        out.push({ t: "+", text: b[y], a: null, b: y + 1 });
      } else {
        x -= 1;
        out.push({ t: "-", text: a[x], a: x + 1, b: null });
      }
    }
  }
  return out.reverse();
}

/** Group ops into hunks: changes with up to `context` unchanged lines around them (Infinity:
 *  one hunk with everything). Each hunk: {oldStart, oldLines, newStart, newLines, ops}. */
export function toHunks(ops, context = 3) {
  const changed = [];
  ops.forEach((op, i) => {
    if (op.t !== " ") changed.push(i);
  });
  if (!changed.length) return [];
  const ranges = [];
  for (const i of changed) {
    const lo = Math.max(0, i - context);
    const hi = Math.min(ops.length - 1, i + context);
    const last = ranges[ranges.length - 1];
    if (last && lo <= last[1] + 1) last[1] = Math.max(last[1], hi);
    else ranges.push([lo, hi]);
  }
  return ranges.map(([lo, hi]) => hunkOf(ops.slice(lo, hi + 1), ops, lo));
}

function hunkOf(slice, ops, lo) {
  // Start lines: the first line number on each side at or after the hunk's start.
  let oldStart = null;
  let newStart = null;
  for (let i = lo; i < ops.length && (oldStart === null || newStart === null); i += 1) {
    if (oldStart === null && ops[i].a !== null) oldStart = ops[i].a;
    if (newStart === null && ops[i].b !== null) newStart = ops[i].b;
  }
  return {
    oldStart: oldStart ?? 0,
    oldLines: slice.filter((op) => op.t !== "+").length,
    newStart: newStart ?? 0,
    newLines: slice.filter((op) => op.t !== "-").length,
    ops: slice,
  };
}

export function countChanges(hunks) {
  let adds = 0;
  let dels = 0;
  for (const h of hunks) {
    for (const op of h.ops) {
      if (op.t === "+") adds += 1;
      else if (op.t === "-") dels += 1;
    }
  }
  return { adds, dels };
}

const HUNK_RE = /^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$/;

function stripPrefix(path) {
  const p = path.split("\t")[0].trim();
  if (p === "/dev/null") return null;
  return p.replace(/^[ab]\//, "");
}

/** The files of unified diff text: [{oldPath, newPath, hunks}] (paths null for /dev/null), or
 *  null when the text is not a unified diff. */
export function parseUnified(text) {
  if (typeof text !== "string" || !text.includes("@@")) return null;
  const lines = text.split("\n");
  const files = [];
  let file = null;
  let hunk = null;
  let a = 0;
  let b = 0;
  for (let i = 0; i < lines.length; i += 1) {
    const line = lines[i];
    if (line.startsWith("--- ") && i + 1 < lines.length && lines[i + 1].startsWith("+++ ")) {
      file = { oldPath: stripPrefix(line.slice(4)), newPath: stripPrefix(lines[i + 1].slice(4)), hunks: [] };
      files.push(file);
      hunk = null;
      i += 1;
      continue;
    }
    const m = HUNK_RE.exec(line);
    if (m && file) {
      a = Number(m[1]);
      b = Number(m[3]);
      hunk = {
        oldStart: a,
        oldLines: m[2] === undefined ? 1 : Number(m[2]),
        newStart: b,
        newLines: m[4] === undefined ? 1 : Number(m[4]),
        section: m[5].trim(),
        ops: [],
      };
      file.hunks.push(hunk);
      continue;
    }
    if (!hunk) continue;
    const sign = line[0];
    if (sign === "+") hunk.ops.push({ t: "+", text: line.slice(1), a: null, b: b++ });
    else if (sign === "-") hunk.ops.push({ t: "-", text: line.slice(1), a: a++, b: null });
    else if (sign === " " || (line === "" && i < lines.length - 1)) {
      hunk.ops.push({ t: " ", text: line.slice(1), a: a++, b: b++ });
    } else if (sign !== "\\") hunk = null; // "\ No newline at end of file" is skipped
  }
  const found = files.filter((f) => f.hunks.some((h) => h.ops.length));
  return found.length ? found : null;
}
