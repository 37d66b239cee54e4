// The agent timeline: turns FleetEvents into DOM entries, incrementally.
//
// - consecutive output chunks of one stream coalesce into one text block (thinking into a
//   collapsed <details>); agent text renders as markdown (markdown.js: DOM nodes, never
//   HTML), re-rendered at most once per frame while it grows;
// - tool calls are paired start -> finish by id (fallback for id-less legacy events: the
//   oldest open call) into one entry that opens the inspector; an edit shows its +/- counts
//   (edits.js) and every call is reported to `onTool` (the files-changed list);
// - a permission request is answerable right here (decision.js) until it is resolved;
// - status changes, per-turn usage, the run summary, gaps and lost turns are their own rows.
//
// Every entry lists the seqs it shows in `data-seqs`, so "each stored event exactly once" is
// checkable from the DOM. Events at or below the last seq shown are ignored (a resumed stream
// or a catch-up fetch can overlap). Text goes in as text nodes only.

import { decisionCard } from "./decision.js";
import { h } from "./dom.js";
import { editsOf, resultEdits } from "./edits.js";
import { fmtDuration, fmtTime, fmtTokens, fmtUsd, parseTs, toolHint } from "./format.js";
import { MarkdownView } from "./markdown.js";
import { statusPill } from "./ui.js";

export function toolDuration(rec) {
  const a = rec.started ? parseTs(rec.started) : null;
  const b = rec.finished ? parseTs(rec.finished) : null;
  return a !== null && b !== null ? Math.max(0, b - a) : null;
}

function addSeq(el, seq) {
  if (seq === undefined || seq === null || !Number.isFinite(seq)) return;
  el.dataset.seqs = el.dataset.seqs ? `${el.dataset.seqs} ${seq}` : String(seq);
}

export class Timeline {
  constructor(listEl, { onSelectTool, onChange, onTool, root } = {}) {
    this.el = listEl;
    this.onSelectTool = onSelectTool || (() => {});
    this.onChange = onChange || (() => {});
    this.onTool = onTool || (() => {});
    this.root = root || (() => "");
    this.tools = []; // every tool record, in order
    this.dirty = new Set(); // markdown views to re-render
    this.frame = 0;
    this.lastSeq = 0;
    this.block = null; // {stream, el, text: Text}
    this.open = []; // tool records without a finish, oldest first
    this.count = 0;
    this.finished = false;
    this.totals = { input: null, output: null, cost: null, turns: 0, outcome: null };
    this.model = null;
    this.asks = new Map(); // decision id -> {link, card} of its pending marker
  }

  /** Render what is pending now (the search reads the DOM). */
  flush() {
    cancelAnimationFrame(this.frame);
    this.frame = 0;
    for (const view of this.dirty) view.render();
    this.dirty.clear();
  }

  _dirty(view) {
    this.dirty.add(view);
    if (!this.frame) {
      this.frame = requestAnimationFrame(() => {
        this.frame = 0;
        this.flush();
        this.onChange();
      });
    }
  }

  dispose() {
    cancelAnimationFrame(this.frame);
  }

  _entry(kind, seq, ts, ...body) {
    const el = h(
      "div",
      { class: ["tl-entry", `tl-${kind}`], tabindex: "-1", dataset: { kind, navItem: "entry" } },
      h("div", { class: "tl-time", title: ts || "" }, fmtTime(ts)),
      h("div", { class: "tl-body" }, ...body),
    );
    addSeq(el, seq);
    this.el.append(el);
    this.count += 1;
    return el;
  }

  /** An info/warning row that is not a stored event (SSE gap notice, undecodable frame). */
  notice(kind, text, level = "info") {
    this.block = null;
    const el = this._entry("marker", null, null, h("span", { class: "marker-text" }, text));
    el.classList.add(`marker-${level}`);
    el.dataset.marker = kind;
    this.onChange();
    return el;
  }

  add(ev) {
    const seq = Number(ev.seq);
    if (Number.isFinite(seq)) {
      if (seq <= this.lastSeq) return false;
      this.lastSeq = seq;
    }
    const k = ev.kind || {};
    const ts = ev.ts;
    if (k.kind !== "output") this.block = null;
    switch (k.kind) {
      case "output":
        this._output(k, seq, ts);
        break;
      case "tool_started":
        this._toolStarted(k, seq, ts);
        break;
      case "tool_finished":
        this._toolFinished(k, seq, ts);
        break;
      case "status_changed":
        this._entry(
          "status",
          seq,
          ts,
          h("span", { class: "muted" }, "status "),
          statusPill(k.from),
          h("span", { class: "arrow" }, " → "),
          statusPill(k.to),
        );
        break;
      case "turn_finished":
        this._turn(k, seq, ts);
        break;
      case "agent_finished":
        this._finished(k, seq, ts);
        break;
      case "agent_spawned":
        this._entry("lifecycle", seq, ts, "Spawned");
        break;
      case "agent_discovered":
        this._entry("lifecycle", seq, ts, "Discovered an already running agent");
        break;
      case "agent_init":
        this.model = k.model || this.model;
        this._entry(
          "lifecycle",
          seq,
          ts,
          `Session ${k.session_id || "?"}`,
          k.model ? ` · ${k.model}` : "",
          k.tools && k.tools.length ? ` · tools: ${k.tools.join(", ")}` : "",
        );
        break;
      case "agent_gone":
        this._entry("lifecycle", seq, ts, "Removed from its caliband");
        break;
      case "stream_gap":
        this._marker(
          "stream_gap",
          seq,
          ts,
          "warn",
          `Stream gap: ${k.missing != null ? `${k.missing} line(s)` : "data"} may be missing` +
            (k.detail ? ` — ${k.detail}` : ""),
        );
        break;
      case "frames_skipped":
        this._marker(
          "frames_skipped",
          seq,
          ts,
          "warn",
          `Skipped ${k.count ?? "?"} ${k.reason || "unreadable"} line(s) of the agent's stream`,
        );
        break;
      case "turn_lost":
        this._marker(
          "turn_lost",
          seq,
          ts,
          "warn",
          `Turn ${k.turn ?? "?"} lost — its outcome is unknown` + (k.reason ? ` (${k.reason})` : ""),
        );
        break;
      case "budget_warning":
      case "budget_exceeded": {
        const money = k.limit === "usd";
        const fmt = (v) => (money ? `$${Number(v).toFixed(4)}` : `${Math.round(v).toLocaleString()} tokens`);
        const text =
          k.kind === "budget_warning"
            ? `Budget: ${fmt(k.spent)} of ${fmt(k.cap)} spent (${Math.round((k.threshold || 0.8) * 100)} % reached)`
            : `Budget exceeded: ${fmt(k.spent)} of a ${fmt(k.cap)} cap — the agent is stopped`;
        this._marker(k.kind, seq, ts, "warn", text);
        break;
      }
      case "store_persist_failed":
        this._marker(
          "store_persist_failed",
          seq,
          ts,
          "warn",
          `Event #${k.lost_seq} could not be stored` + (k.detail ? `: ${k.detail}` : ""),
        );
        break;
      case "decision_pending":
        this._ask(ev, seq, ts);
        break;
      case "decision_resolved": {
        const d = k.decision || k;
        const who = d.by || d.decided_by || "";
        const title = d.tool_call?.title || "";
        const state = d.state || "decided";
        const text =
          state === "decided"
            ? `Permission answered: ${d.option_label || d.option_id || "?"}${who ? ` (by ${who})` : ""}`
            : `Permission request ${state}${who ? ` (${who})` : ""}`;
        const el = this._marker("decision", seq, ts, "info", title ? `${text} — ${title}` : text);
        if (d.id != null) {
          el.dataset.decisionId = String(d.id);
          // Answered: the inbox no longer has it, nor does this timeline.
          const ask = this.asks.get(String(d.id));
          if (ask) {
            ask.link.remove();
            ask.card?.remove();
            ask.resolved = true;
            this.asks.delete(String(d.id));
          }
        }
        if (d.note) el.querySelector(".tl-body").append(h("div", { class: "muted" }, `Note: ${d.note}`));
        break;
      }
      default:
        this._entry("unknown", seq, ts, h("span", { class: "muted" }, `event ${k.kind || "?"}`));
    }
    this.onChange();
    return true;
  }

  _marker(kind, seq, ts, level, text) {
    const el = this._entry("marker", seq, ts, h("span", { class: "marker-text" }, text));
    el.classList.add(`marker-${level}`);
    el.dataset.marker = kind;
    return el;
  }

  _output(k, seq, ts) {
    const stream = k.stream === "thinking" ? "thinking" : "stdout";
    const chunk = String(k.chunk ?? "");
    if (this.block && this.block.stream === stream) {
      addSeq(this.block.el, seq);
      if (stream === "thinking") {
        this.block.text.appendData(chunk);
        this._thinkingSummary(this.block, chunk);
      } else {
        this.block.md.append(chunk);
        this._dirty(this.block.md);
      }
      return;
    }
    let el;
    if (stream === "thinking") {
      const text = document.createTextNode(chunk);
      const summary = h("summary", {}, h("span", { class: "think-label" }, "Thinking"), h("span", { class: "think-meta muted" }));
      const details = h("details", { class: "thinking" }, summary, h("div", { class: "thinking-text" }, text));
      el = this._entry("thinking", seq, ts, details);
      this.block = { stream, el, text, summary, words: 0, midWord: false };
      this._thinkingSummary(this.block, chunk);
    } else {
      const body = h("div", { class: "text md" });
      el = this._entry("text", seq, ts, body);
      const md = new MarkdownView(body);
      md.append(chunk);
      this._dirty(md);
      this.block = { stream, el, md };
    }
  }

  // A running word count (recounting the whole block per chunk would be quadratic).
  _thinkingSummary(block, chunk) {
    const parts = chunk.split(/\s+/);
    let n = parts.filter(Boolean).length;
    if (block.midWord && parts[0]) n -= 1; // the chunk continues the previous word
    block.words += n;
    block.midWord = chunk.length > 0 && !/\s$/.test(chunk);
    const w = block.words;
    block.summary.querySelector(".think-meta").textContent = ` · ${w} word${w === 1 ? "" : "s"}`;
  }

  _toolStarted(k, seq, ts) {
    const rec = {
      id: k.id || "",
      name: k.name || "tool",
      input: k.input,
      diffs: Array.isArray(k.diffs) ? k.diffs : null,
      started: ts,
      finished: null,
      ok: null,
      result: null,
      startSeq: seq,
      finishSeq: null,
    };
    rec.edits = editsOf(rec.name, rec.input, rec.diffs);
    rec.el = this._entry("tool", seq, ts, this._toolRow(rec));
    rec.el.dataset.toolId = rec.id;
    this._toolState(rec);
    this.open.push(rec);
    this.tools.push(rec);
    this.onTool(rec);
  }

  _toolFinished(k, seq, ts) {
    // By id (the oldest open call with it, should an id be reused); id-less legacy events
    // close the oldest open call.
    let rec = k.id ? this.open.find((r) => r.id === k.id) : this.open[0];
    if (!rec) {
      // A finish without its start (e.g. the start was lost in a gap): its own entry.
      rec = { id: k.id || "", name: k.name || "tool", input: undefined, started: null, startSeq: null, edits: [] };
      rec.el = this._entry("tool", null, ts, this._toolRow(rec));
      rec.el.dataset.toolId = rec.id;
      rec.orphan = true;
      this.tools.push(rec);
    }
    rec.finished = ts;
    rec.ok = k.ok !== false;
    rec.result = k.result ?? null;
    rec.finishSeq = seq;
    if (k.name && (!rec.name || rec.name === "tool")) rec.name = k.name;
    if (!rec.edits.length) {
      rec.edits = resultEdits(rec.result); // an ACP edit's diff, rendered into its result
      rec.editsFromResult = rec.edits.length > 0;
    }
    addSeq(rec.el, seq);
    this.open = this.open.filter((r) => r !== rec);
    this._toolState(rec);
    this.onTool(rec);
    if (this.selected === rec) this.onSelectTool(rec);
  }

  /** The tool record of a call id (the latest with it). */
  tool(id) {
    for (let i = this.tools.length - 1; i >= 0; i -= 1) if (this.tools[i].id === id) return this.tools[i];
    return null;
  }

  _ask(ev, seq, ts) {
    const k = ev.kind;
    const d = k.decision || k;
    const title = d.tool_call?.title || d.tool_call?.kind || "a tool call";
    const el = this._marker("decision", seq, ts, "ask", `Permission requested: ${title} `);
    if (d.id == null) return;
    const id = String(d.id);
    el.dataset.decisionId = id;
    const link = h("a", { href: "#/approvals", class: "link" }, "open the inbox");
    el.querySelector(".tl-body").append(link);
    const ask = { link, card: null, resolved: false };
    this.asks.set(id, ask);
    // The card is built a frame later: a replayed history usually brings the answer at once.
    requestAnimationFrame(() => {
      if (ask.resolved || !el.isConnected) return;
      const dec = { ...d, id, agent_id: ev.agent_id, workspace: ev.repo, options: d.options || [], tool_call: d.tool_call || {} };
      const rec = dec.tool_call.id ? this.tool(dec.tool_call.id) : null;
      ask.card = decisionCard(dec, { compact: true, edits: rec?.edits || null, root: this.root() });
      el.querySelector(".tl-body").append(ask.card);
      this.onChange();
    });
  }

  _toolRow(rec) {
    const row = h(
      "button",
      {
        type: "button",
        class: "tool-row",
        "aria-label": `Inspect tool call ${rec.name}`,
        on: { click: () => this.select(rec) },
      },
      h("span", { class: "tool-icon", "aria-hidden": "true" }),
      h("span", { class: "tool-name" }, rec.name),
      h("span", { class: "tool-hint mono" }, rec.edits?.length ? rec.edits.map((e) => e.path).join(", ") : toolHint(rec.input)),
      h("span", { class: "tool-edit" }),
      h("span", { class: "pill tool-state" }),
      h("span", { class: "tool-dur muted" }),
    );
    rec.row = row;
    return row;
  }

  _toolState(rec) {
    const st = rec.finished === null ? "running" : rec.ok ? "ok" : "failed";
    rec.el.dataset.state = st;
    const pill = rec.row.querySelector(".tool-state");
    pill.className = `pill tool-state ts-${st}`;
    pill.textContent = st;
    rec.row.querySelector(".tool-name").textContent = rec.name;
    const dur = toolDuration(rec);
    rec.row.querySelector(".tool-dur").textContent = dur !== null ? fmtDuration(dur) : "";
    const edit = rec.row.querySelector(".tool-edit");
    edit.replaceChildren();
    if (rec.edits?.length) {
      const adds = rec.edits.reduce((n, e) => n + e.adds, 0);
      const dels = rec.edits.reduce((n, e) => n + e.dels, 0);
      edit.append(h("span", { class: "diff-adds" }, `+${adds}`), h("span", { class: "diff-dels" }, `−${dels}`));
    }
  }

  select(rec) {
    if (this.selected && this.selected.el) this.selected.el.classList.remove("selected");
    this.selected = rec;
    if (rec && rec.el) rec.el.classList.add("selected");
    this.onSelectTool(rec);
  }

  _turn(k, seq, ts) {
    this.totals.turns += 1;
    if (k.usage) {
      this.totals.input = (this.totals.input || 0) + (k.usage.input_tokens || 0);
      this.totals.output = (this.totals.output || 0) + (k.usage.output_tokens || 0);
    }
    if (k.cost_usd != null) this.totals.cost = (this.totals.cost || 0) + k.cost_usd;
    if (k.model) this.model = k.model;
    const parts = [`Turn ${(k.turn ?? this.totals.turns - 1) + 1}`];
    if (k.stop_reason) parts.push(k.stop_reason);
    if (k.usage) {
      parts.push(`${fmtTokens(k.usage.input_tokens)} in`);
      parts.push(`${fmtTokens(k.usage.output_tokens)} out`);
      if (k.usage.cache_read_input_tokens) parts.push(`${fmtTokens(k.usage.cache_read_input_tokens)} cached`);
    } else parts.push("usage not reported");
    if (k.cost_usd != null) parts.push(fmtUsd(k.cost_usd));
    if (k.model) parts.push(k.model);
    this._entry("turn", seq, ts, h("span", { class: "turn-text" }, parts.join(" · ")));
  }

  _finished(k, seq, ts) {
    this.finished = true;
    const t = this.totals;
    t.outcome = k.outcome || null;
    // Totals are the sums of the turns (as the fleet and /api/usage count them); the run's
    // own totals only stand in when no turn was recorded (older histories).
    if (!t.turns) {
      t.turns = k.turns || 0;
      if (k.usage) {
        t.input = k.usage.input_tokens;
        t.output = k.usage.output_tokens;
      }
      if (k.cost_usd != null) t.cost = k.cost_usd;
    }
    const good = /^(EndOfTurn|end_turn|done|Done|EndInput)$/.test(k.outcome || "");
    this._entry(
      "finished",
      seq,
      ts,
      h(
        "div",
        { class: ["run-summary", good ? "run-ok" : "run-bad"] },
        h("div", { class: "run-title" }, `Run finished: ${k.outcome || "unknown outcome"}`),
        h(
          "div",
          { class: "run-meta" },
          `${t.turns} turn${t.turns === 1 ? "" : "s"} · ${fmtTokens(t.input)} in · ${fmtTokens(t.output)} out · ${fmtUsd(t.cost)}` +
            (k.model ? ` · ${k.model}` : ""),
        ),
        k.detail ? h("pre", { class: "run-detail" }, k.detail) : null,
      ),
    );
  }
}
