// A small, line-at-a-time syntax colourer for diffs and markdown code blocks: comments,
// strings, numbers and keywords of the common languages, picked by file extension or fence
// language. It only ever wraps pieces of the line's text in <span class="tok-…"> (text
// nodes): nothing is parsed as markup. A construct spanning lines (a block comment, a
// triple-quoted string) is coloured on its first line only.

import { h } from "./dom.js";

const KEYWORDS = {
  py: "and as assert async await break class continue def del elif else except False finally for from global if import in is lambda None nonlocal not or pass raise return True try while with yield match case self",
  js: "async await break case catch class const continue debugger default delete do else export extends false finally for from function if import in instanceof let new null of return static super switch this throw true try typeof undefined var void while with yield interface type enum implements private public protected readonly",
  go: "break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var nil true false",
  rs: "as async await break const continue crate else enum extern false fn for if impl in let loop match mod move mut pub ref return self Self static struct super trait true type unsafe use where while dyn None Some Ok Err",
  sh: "if then else elif fi case esac for while until do done in function return export local readonly set unset echo exit",
  c: "auto break case char const continue default do double else enum extern float for goto if inline int long register return short signed sizeof static struct switch typedef union unsigned void volatile while class public private protected namespace template typename new delete true false nullptr bool",
  java: "abstract boolean break byte case catch char class const continue default do double else enum extends final finally float for if implements import instanceof int interface long native new package private protected public return short static super switch synchronized this throw throws try void volatile while true false null var val fun object when",
  rb: "begin break case class def defined do else elsif end ensure false for if in module next nil not or redo rescue retry return self super then true undef unless until when while yield require",
  sql: "select from where and or not insert into values update set delete create table drop alter index join left right inner outer on group by order having limit offset as null is in exists distinct union all primary key references",
};

const LANG = {
  py: "py", python: "py", pyi: "py",
  js: "js", mjs: "js", cjs: "js", jsx: "js", ts: "js", tsx: "js", javascript: "js", typescript: "js", json: "js",
  go: "go", golang: "go",
  rs: "rs", rust: "rs",
  sh: "sh", bash: "sh", zsh: "sh", shell: "sh", console: "sh",
  c: "c", h: "c", cc: "c", cpp: "c", hpp: "c", cxx: "c", "c++": "c", cs: "c",
  java: "java", kt: "java", kotlin: "java", scala: "java", swift: "java",
  rb: "rb", ruby: "rb",
  sql: "sql",
  yaml: "sh", yml: "sh", toml: "sh", ini: "sh", dockerfile: "sh", makefile: "sh", mk: "sh",
};

const HASH_COMMENTS = new Set(["py", "sh", "rb"]);
const cache = new Map();

/** The colourer's language for a path ("src/app.py") or fence info ("python"); null: none. */
export function languageOf(pathOrLang) {
  if (!pathOrLang) return null;
  const s = String(pathOrLang).toLowerCase();
  const base = s.split("/").pop();
  if (base === "dockerfile" || base === "makefile") return "sh";
  const ext = base.includes(".") ? base.split(".").pop() : base;
  return LANG[ext] || null;
}

function tokenizer(lang) {
  if (cache.has(lang)) return cache.get(lang);
  const comment = HASH_COMMENTS.has(lang) ? "#.*" : lang === "sql" ? "--.*" : "\\/\\/.*|\\/\\*.*?(?:\\*\\/|$)";
  const strings = "\"(?:[^\"\\\\]|\\\\.)*\"?|'(?:[^'\\\\]|\\\\.)*'?" + (lang === "js" || lang === "go" ? "|`[^`]*`?" : "");
  const words = KEYWORDS[lang].split(" ").join("|");
  const flags = lang === "sql" ? "gi" : "g";
  const re = new RegExp(
    `(${comment})|(${strings})|(\\b(?:0x[0-9a-fA-F_]+|\\d[\\d_]*(?:\\.\\d+)?(?:[eE][+-]?\\d+)?)\\b)|(\\b(?:${words})\\b)`,
    flags,
  );
  cache.set(lang, re);
  return re;
}

const CLASSES = ["tok-comment", "tok-string", "tok-number", "tok-keyword"];

/** Nodes for one line of `lang` (text and <span>s); the plain text when lang is null. */
export function colourLine(text, lang) {
  if (!lang || !KEYWORDS[lang] || text.length > 2000) return [text];
  const re = tokenizer(lang);
  re.lastIndex = 0;
  const out = [];
  let at = 0;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    if (m[0] === "") {
      re.lastIndex += 1;
      continue;
    }
    if (m.index > at) out.push(text.slice(at, m.index));
    const group = [1, 2, 3, 4].find((g) => m[g] !== undefined);
    out.push(h("span", { class: CLASSES[group - 1] }, m[0]));
    at = m.index + m[0].length;
  }
  if (at < text.length) out.push(text.slice(at));
  return out;
}
