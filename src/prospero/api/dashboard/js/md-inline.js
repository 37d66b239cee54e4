// Markdown inline syntax for agent text, built as DOM nodes (never parsed as HTML): code
// spans, emphasis (* _ ** __), ~~strikethrough~~, links and autolinks, images (shown as links,
// never loaded), backslash escapes and hard line breaks. Raw HTML stays literal text, entities
// are not decoded. Links go through `externalLink`: only http(s) and mailto URLs become links.

import { externalLink, h } from "./dom.js";

const PUNCT = /[!-/:-@[-`{-~\u2000-\u206f\u2e00-\u2e7f\u3000-\u303f]/;
const SPACE = /\s/;
const ESCAPABLE = "\\`*_{}[]()#+-.!|~<>\"'$&%^=:;,?@/";

function isSpace(c) {
  return c === undefined || SPACE.test(c);
}

function isPunct(c) {
  return c !== undefined && PUNCT.test(c);
}

// CommonMark flanking rules (simplified to the previous and next character).
function leftFlanking(prev, next) {
  return !isSpace(next) && (!isPunct(next) || isSpace(prev) || isPunct(prev));
}

function rightFlanking(prev, next) {
  return !isSpace(prev) && (!isPunct(prev) || isSpace(next) || isPunct(next));
}

function canOpen(ch, prev, next) {
  if (!leftFlanking(prev, next)) return false;
  return ch !== "_" || !rightFlanking(prev, next) || isPunct(prev);
}

function canClose(ch, prev, next) {
  if (!rightFlanking(prev, next)) return false;
  return ch !== "_" || !leftFlanking(prev, next) || isPunct(next);
}

function runLength(s, i, ch) {
  let n = 0;
  while (s[i + n] === ch) n += 1;
  return n;
}

/** The index of the closing delimiter run for an opener of `len` `ch` at `from`, or -1: a
 *  run of exactly `len` first (so `*a **b** c*` pairs the single stars), else a longer one. */
function findCloser(s, from, ch, len) {
  const exact = scanCloser(s, from, ch, len, true);
  return exact >= 0 ? exact : scanCloser(s, from, ch, len, false);
}

function scanCloser(s, from, ch, len, exact) {
  for (let i = from; i < s.length; i += 1) {
    const c = s[i];
    if (c === "\\") {
      i += 1;
      continue;
    }
    if (c === "`") {
      const n = runLength(s, i, "`");
      const end = s.indexOf("`".repeat(n), i + n);
      if (end > 0) i = end + n - 1;
      continue;
    }
    if (c !== ch) continue;
    const n = runLength(s, i, ch);
    if ((exact ? n === len : n > len) && canClose(ch, s[i - 1], s[i + n])) return i + (n - len);
    i += n - 1;
  }
  return -1;
}

function parseLinkTarget(s, at) {
  // s[at] === "(": (url "title") with balanced parentheses in the url
  let i = at + 1;
  while (s[i] === " ") i += 1;
  let url = "";
  if (s[i] === "<") {
    const end = s.indexOf(">", i);
    if (end < 0) return null;
    url = s.slice(i + 1, end);
    i = end + 1;
  } else {
    let depth = 0;
    for (; i < s.length; i += 1) {
      const c = s[i];
      if (c === "\\" && i + 1 < s.length) {
        url += s[i + 1];
        i += 1;
        continue;
      }
      if (c === "(") depth += 1;
      else if (c === ")") {
        if (depth === 0) break;
        depth -= 1;
      } else if (SPACE.test(c)) break;
      url += c;
    }
  }
  while (s[i] === " ") i += 1;
  let title = null;
  const q = s[i];
  if (q === '"' || q === "'") {
    const end = s.indexOf(q, i + 1);
    if (end < 0) return null;
    title = s.slice(i + 1, end);
    i = end + 1;
    while (s[i] === " ") i += 1;
  }
  if (s[i] !== ")") return null;
  return { url, title, end: i + 1 };
}

function findBracketEnd(s, at) {
  let depth = 0;
  for (let i = at; i < s.length; i += 1) {
    const c = s[i];
    if (c === "\\") i += 1;
    else if (c === "`") {
      const n = runLength(s, i, "`");
      const end = s.indexOf("`".repeat(n), i + n);
      if (end > 0) i = end + n - 1;
    } else if (c === "[") depth += 1;
    else if (c === "]") {
      depth -= 1;
      if (depth === 0) return i;
    }
  }
  return -1;
}

const AUTOLINK = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/i;
const BARE_URL = /^https?:\/\/[^\s<>"]+/i;

function trimUrl(url) {
  // Trailing punctuation is the sentence's, not the URL's (GFM autolinks).
  let u = url.replace(/[.,:;!?'"*_~]+$/, "");
  while (u.endsWith(")") && (u.match(/\(/g) || []).length < (u.match(/\)/g) || []).length) u = u.slice(0, -1);
  return u;
}

/** The nodes of a link: the <a>, or its text alone when the URL is not a safe one. */
function link(url, title, children) {
  const el = externalLink(url, title, children);
  return el ? [el] : children;
}

/** Inline markdown of `s` as an array of nodes and strings. */
export function inline(s, depth = 0) {
  const out = [];
  let text = "";
  const flush = () => {
    if (text) out.push(text);
    text = "";
  };
  for (let i = 0; i < s.length; i += 1) {
    const c = s[i];
    const prev = s[i - 1];
    if (c === "\\") {
      const next = s[i + 1];
      if (next === "\n") {
        flush();
        out.push(h("br"), "\n");
        i += 1;
        continue;
      }
      if (next !== undefined && ESCAPABLE.includes(next)) {
        text += next;
        i += 1;
        continue;
      }
      text += c;
      continue;
    }
    if (c === "\n") {
      if (/ {2,}$/.test(text)) {
        text = text.replace(/ +$/, "");
        flush();
        out.push(h("br"));
      }
      text += "\n";
      continue;
    }
    if (c === "`") {
      const n = runLength(s, i, "`");
      const end = s.indexOf("`".repeat(n), i + n);
      if (end > 0 && s[end + n] !== "`") {
        flush();
        let code = s.slice(i + n, end).replace(/\n/g, " ");
        if (/^ .* $/.test(code) && code.trim()) code = code.slice(1, -1);
        out.push(h("code", {}, code));
        i = end + n - 1;
        continue;
      }
      text += "`".repeat(n);
      i += n - 1;
      continue;
    }
    if ((c === "*" || c === "_" || c === "~") && depth < 12) {
      const n = runLength(s, i, c);
      const next = s[i + n];
      const want = c === "~" ? (n === 2 ? 2 : 0) : Math.min(n, 3);
      if (want && canOpen(c, prev, next)) {
        const close = findCloser(s, i + n, c, want === 3 ? 3 : want);
        if (close > i + n) {
          flush();
          const inner = inline(s.slice(i + want, close), depth + 1);
          const lead = c.repeat(n - want);
          if (lead) out.push(lead);
          if (c === "~") out.push(h("del", {}, inner));
          else if (want === 1) out.push(h("em", {}, inner));
          else if (want === 2) out.push(h("strong", {}, inner));
          else out.push(h("em", {}, h("strong", {}, inner)));
          i = close + want - 1;
          continue;
        }
      }
      text += c.repeat(n);
      i += n - 1;
      continue;
    }
    if (c === "!" && s[i + 1] === "[") {
      const end = findBracketEnd(s, i + 1);
      const target = end > 0 && s[end + 1] === "(" ? parseLinkTarget(s, end + 1) : null;
      if (target) {
        flush();
        const alt = s.slice(i + 2, end);
        out.push(...link(target.url, target.title, [`[image: ${alt || target.url}]`]));
        i = target.end - 1;
        continue;
      }
    }
    if (c === "[") {
      const end = findBracketEnd(s, i);
      const target = end > 0 && s[end + 1] === "(" ? parseLinkTarget(s, end + 1) : null;
      if (target) {
        flush();
        out.push(...link(target.url, target.title, inline(s.slice(i + 1, end), depth + 1)));
        i = target.end - 1;
        continue;
      }
    }
    if (c === "<") {
      const m = AUTOLINK.exec(s.slice(i, i + 2048));
      if (m) {
        flush();
        out.push(...link(m[1], null, [m[1]]));
        i += m[0].length - 1;
        continue;
      }
    }
    if ((c === "h" || c === "H") && (i === 0 || /[\s(*_~]/.test(prev))) {
      const m = BARE_URL.exec(s.slice(i, i + 2048));
      if (m) {
        const url = trimUrl(m[0]);
        flush();
        out.push(...link(url, null, [url]));
        i += url.length - 1;
        continue;
      }
    }
    text += c;
  }
  flush();
  return out;
}
