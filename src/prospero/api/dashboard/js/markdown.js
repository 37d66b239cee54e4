// Agent text as markdown, rendered by building DOM nodes (never parsed as HTML: the text is
// untrusted, and raw HTML in it stays literal text). Blocks: paragraphs, ATX and
// setext headings, fenced and indented code (coloured by its language), block quotes, bullet
// and ordered lists (nested), GFM tables, thematic breaks. Inline syntax: md-inline.js.
//
// `MarkdownView` renders a growing text (an agent's streamed output): the part before the
// last blank line outside a code fence is rendered once and kept; only the tail after it is
// re-rendered as chunks arrive.
//
// The rendered text keeps the source's line structure in `textContent` (soft line breaks are
// "\n" text, shown as breaks by the stylesheet; a "\n" follows every block).

import { h } from "./dom.js";
import { inline } from "./md-inline.js";
import { colourLine, languageOf } from "./syntax.js";

const FENCE = /^( {0,3})(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$/;
const ATX = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const HR = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const SETEXT = /^ {0,3}(=+|-+)[ \t]*$/;
const QUOTE = /^ {0,3}> ?/;
const LIST = /^( {0,3})([-*+]|\d{1,9}[.)])([ \t]+|$)/;
const TABLE_DELIM = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
const MAX_DEPTH = 16;

function blank(line) {
  return /^[ \t]*$/.test(line);
}

function indentOf(line) {
  let n = 0;
  for (const c of line) {
    if (c === " ") n += 1;
    else if (c === "\t") n += 4 - (n % 4);
    else break;
  }
  return n;
}

function dedent(line, n) {
  let i = 0;
  let col = 0;
  while (i < line.length && col < n && (line[i] === " " || line[i] === "\t")) {
    col += line[i] === "\t" ? 4 - (col % 4) : 1;
    i += 1;
  }
  return line.slice(i);
}

function splitRow(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  const cells = [];
  let cur = "";
  for (let i = 0; i < s.length; i += 1) {
    if (s[i] === "\\" && s[i + 1] === "|") {
      cur += "|";
      i += 1;
    } else if (s[i] === "|") {
      cells.push(cur.trim());
      cur = "";
    } else cur += s[i];
  }
  cells.push(cur.trim());
  return cells;
}

function interrupts(line) {
  return FENCE.test(line) || ATX.test(line) || HR.test(line) || QUOTE.test(line) || startsList(line, true);
}

function startsList(line, interrupting) {
  const m = LIST.exec(line);
  if (!m) return false;
  if (!interrupting) return true;
  // Interrupting a paragraph: not an empty item, and an ordered list only from 1.
  const rest = line.slice(m[0].length);
  return !blank(rest) && (!/^\d/.test(m[2]) || /^1[.)]$/.test(m[2]));
}

function codeBlock(lines, lang) {
  const code = h("code", { class: lang ? `language-${lang.replace(/[^\w+-]/g, "")}` : null });
  const colour = languageOf(lang);
  lines.forEach((ln, i) => {
    code.append(...colourLine(ln, colour));
    if (i < lines.length - 1) code.append("\n");
  });
  return h("pre", { class: "md-code" }, code);
}

function listBlock(lines, start, depth) {
  const first = LIST.exec(lines[start]);
  const ordered = /^\d/.test(first[2]);
  const marker = ordered ? first[2].slice(-1) : first[2];
  const items = [];
  let i = start;
  let loose = false;
  while (i < lines.length) {
    const m = LIST.exec(lines[i]);
    if (!m || /^\d/.test(m[2]) !== ordered || (ordered ? m[2].slice(-1) : m[2]) !== marker) break;
    const contentIndent = m[1].length + m[2].length + Math.max(1, Math.min(m[3].length, 4));
    const body = [lines[i].slice(Math.min(lines[i].length, m[0].length))];
    i += 1;
    let sawBlank = false;
    while (i < lines.length) {
      const ln = lines[i];
      if (blank(ln)) {
        sawBlank = true;
        body.push("");
        i += 1;
        continue;
      }
      if (indentOf(ln) >= contentIndent) {
        if (sawBlank) loose = true;
        body.push(dedent(ln, contentIndent));
        sawBlank = false;
        i += 1;
        continue;
      }
      if (sawBlank || interrupts(ln) || LIST.test(ln)) break;
      body.push(ln); // a lazy continuation of the item's paragraph
      i += 1;
    }
    while (body.length && body[body.length - 1] === "") body.pop();
    if (sawBlank && i < lines.length && LIST.test(lines[i])) loose = true;
    items.push({ body, number: ordered ? Number.parseInt(m[2], 10) : null });
    if (sawBlank && !(i < lines.length && LIST.test(lines[i]))) break;
  }
  while (i > start && blank(lines[i - 1])) i -= 1; // trailing blanks belong to the caller
  const attrs = { class: loose ? "md-loose" : null };
  if (ordered && items[0].number !== 1) attrs.start = String(items[0].number);
  const el = h(ordered ? "ol" : "ul", attrs);
  for (const item of items) {
    const li = h("li");
    appendBlocks(li, item.body, depth + 1, !loose);
    el.append(li);
  }
  return { el, next: i };
}

function tableBlock(lines, start) {
  const head = splitRow(lines[start]);
  const aligns = splitRow(lines[start + 1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : null,
  );
  const cell = (tag, text, j) => h(tag, { class: aligns[j] ? `align-${aligns[j]}` : null }, inline(text));
  const rows = [];
  let i = start + 2;
  while (i < lines.length && !blank(lines[i]) && lines[i].includes("|") && !interrupts(lines[i])) {
    const cells = splitRow(lines[i]);
    rows.push(h("tr", {}, head.map((_, j) => cell("td", cells[j] ?? "", j))));
    i += 1;
  }
  const table = h(
    "table",
    { class: "md-table" },
    h("thead", {}, h("tr", {}, head.map((t, j) => cell("th", t, j)))),
    rows.length ? h("tbody", {}, rows) : null,
  );
  return { el: h("div", { class: "md-table-wrap" }, table), next: i };
}

/** Parse `lines` into blocks appended to `parent`. `tight`: paragraphs of a tight list item
 *  are shown without <p>. */
function appendBlocks(parent, lines, depth = 0, tight = false) {
  const add = (el) => parent.append(el, "\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (blank(line)) {
      i += 1;
      continue;
    }
    if (depth >= MAX_DEPTH) {
      add(h("p", {}, lines.slice(i).join("\n")));
      return;
    }
    let m = FENCE.exec(line);
    if (m) {
      const fence = m[2];
      const body = [];
      i += 1;
      while (i < lines.length) {
        const close = new RegExp(`^ {0,3}${fence[0] === "`" ? "`" : "~"}{${fence.length},}[ \\t]*$`);
        if (close.test(lines[i])) {
          i += 1;
          break;
        }
        body.push(dedent(lines[i], m[1].length));
        i += 1;
      }
      add(codeBlock(body, m[3]));
      continue;
    }
    m = ATX.exec(line);
    if (m) {
      add(h(`h${m[1].length}`, { class: "md-h" }, inline(m[2] || "")));
      i += 1;
      continue;
    }
    if (HR.test(line)) {
      add(h("hr"));
      i += 1;
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && !blank(lines[i]) && (QUOTE.test(lines[i]) || !interrupts(lines[i]))) {
        body.push(lines[i].replace(QUOTE, ""));
        i += 1;
      }
      const q = h("blockquote");
      appendBlocks(q, body, depth + 1);
      add(q);
      continue;
    }
    if (startsList(line, false)) {
      const { el, next } = listBlock(lines, i, depth);
      add(el);
      i = next;
      continue;
    }
    if (indentOf(line) >= 4) {
      const body = [];
      while (i < lines.length && (blank(lines[i]) || indentOf(lines[i]) >= 4)) {
        body.push(dedent(lines[i], 4));
        i += 1;
      }
      while (body.length && blank(body[body.length - 1])) body.pop();
      add(codeBlock(body, ""));
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && TABLE_DELIM.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      const { el, next } = tableBlock(lines, i);
      add(el);
      i = next;
      continue;
    }
    const para = [line.replace(/^ {0,3}/, "")];
    i += 1;
    let heading = 0;
    while (i < lines.length && !blank(lines[i])) {
      if (SETEXT.test(lines[i])) {
        heading = lines[i].trim()[0] === "=" ? 1 : 2;
        i += 1;
        break;
      }
      if (interrupts(lines[i])) break;
      para.push(lines[i].replace(/^[ \t]+/, ""));
      i += 1;
    }
    const text = para.join("\n").replace(/[ \t]+$/, "");
    if (heading) add(h(`h${heading}`, { class: "md-h" }, inline(text)));
    else if (tight) parent.append(...inline(text), "\n");
    else add(h("p", {}, inline(text)));
  }
}

/** The markdown of `text` as a DocumentFragment. */
export function renderMarkdown(text) {
  const frag = document.createDocumentFragment();
  appendBlocks(frag, String(text ?? "").replace(/\r\n?/g, "\n").split("\n"));
  return frag;
}

/** Where `text` can be cut so that both parts render as they would together: after its last
 *  blank line that is outside a fenced code block (0: nowhere). */
export function stableEnd(text) {
  let fence = null;
  let cut = 0;
  let at = 0;
  const lines = text.split("\n");
  for (let i = 0; i < lines.length - 1; i += 1) {
    const ln = lines[i];
    at += ln.length + 1;
    const m = FENCE.exec(ln);
    if (fence) {
      if (m && m[2][0] === fence[0] && m[2].length >= fence.length && !m[3]) fence = null;
    } else if (m) fence = m[2];
    else if (blank(ln) && i > 0 && !blank(lines[i + 1] ?? "x") && indentOf(lines[i + 1]) < 4 && !LIST.test(lines[i + 1])) {
      cut = at;
    }
  }
  return cut;
}

/** A growing markdown text shown in `el`: `append(chunk)`, then `render()` (cheap when only
 *  the tail changed). */
export class MarkdownView {
  constructor(el) {
    this.el = el;
    this.text = "";
    this.done = 0; // chars of `text` rendered for good
    this.stable = h("div", { class: "md-stable" });
    this.tail = h("div", { class: "md-tail" });
    el.append(this.stable, this.tail);
  }

  append(chunk) {
    this.text += chunk;
  }

  render() {
    const rest = this.text.slice(this.done);
    const cut = stableEnd(rest);
    if (cut > 0) {
      this.stable.append(renderMarkdown(rest.slice(0, cut)));
      this.done += cut;
    }
    this.tail.replaceChildren(renderMarkdown(this.text.slice(this.done)));
  }
}
