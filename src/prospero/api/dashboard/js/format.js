// Number, money, time and status formatting shared by the views.

export const TERMINAL = new Set(["killed", "done", "failed", "crashed"]);
export const ACTIVE = new Set(["spawning", "running"]);

export function isTerminal(status) {
  return TERMINAL.has(status);
}

export function shortId(id) {
  return String(id || "").slice(0, 12);
}

export function fmtInt(n) {
  if (n === null || n === undefined) return "—";
  return Number(n).toLocaleString("en-US");
}

export function fmtTokens(n) {
  if (n === null || n === undefined) return "—";
  const v = Number(n);
  if (v < 1000) return String(v);
  if (v < 1e6) return `${(v / 1e3).toFixed(v < 1e4 ? 1 : 0)}k`;
  if (v < 1e9) return `${(v / 1e6).toFixed(v < 1e7 ? 2 : 1)}M`;
  return `${(v / 1e9).toFixed(2)}B`;
}

// USD that keeps sub-cent spend visible ($0.0034) and is compact for large sums.
export function fmtUsd(v) {
  if (v === null || v === undefined) return "—";
  const x = Number(v);
  if (x === 0) return "$0.00";
  if (Math.abs(x) < 0.01) return `$${x.toPrecision(2)}`;
  if (Math.abs(x) < 100) return `$${x.toFixed(2)}`;
  return `$${Math.round(x).toLocaleString("en-US")}`;
}

export function parseTs(ts) {
  const t = Date.parse(ts);
  return Number.isFinite(t) ? t : null;
}

export function fmtAge(ts, now = Date.now()) {
  const t = typeof ts === "number" ? ts : parseTs(ts);
  if (t === null) return "—";
  return fmtSpan(Math.max(0, now - t));
}

export function fmtSpan(ms) {
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${m % 60}m`;
  return `${Math.floor(h / 24)}d`;
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
  return fmtSpan(ms);
}

export function fmtTime(ts) {
  const t = typeof ts === "number" ? ts : parseTs(ts);
  if (t === null) return "";
  return new Date(t).toLocaleTimeString("en-GB", { hour12: false });
}

export function fmtDateTime(ts) {
  const t = typeof ts === "number" ? ts : parseTs(ts);
  if (t === null) return "";
  return new Date(t).toLocaleString("en-GB", { hour12: false });
}

export function prettyJson(value) {
  if (value === undefined) return "";
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value;
    }
  }
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

// A one-line hint of what a tool call is about: its command, path, pattern, url or query.
export function toolHint(input) {
  if (input === null || input === undefined) return "";
  if (typeof input === "string") return input.slice(0, 160);
  if (typeof input !== "object") return String(input);
  for (const key of ["command", "file_path", "path", "pattern", "url", "query", "description"]) {
    const v = input[key];
    if (typeof v === "string" && v) return v.slice(0, 160);
  }
  const first = Object.values(input).find((v) => typeof v === "string");
  return first ? first.slice(0, 160) : "";
}

export function plural(n, one, many = `${one}s`) {
  return `${n} ${n === 1 ? one : many}`;
}
