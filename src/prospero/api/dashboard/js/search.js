// Search over an agent's transcript: every match of the query (case-insensitive) in the
// timeline's text is highlighted (the CSS Custom Highlight API: ranges over the text nodes,
// the DOM is not touched; entries holding a match are marked either way), and Enter / n and
// Shift+Enter / N step through them, scrolling the current one into view (opening a collapsed
// thinking block that holds it). It follows the timeline as it grows.

import { h } from "./dom.js";

const HAS_HIGHLIGHTS = typeof CSS !== "undefined" && "highlights" in CSS && typeof Highlight === "function";
const MAX_MATCHES = 5000;

export class TranscriptSearch {
  /** @param {Element} list  the timeline; @param {object} opts  beforeSearch(): flush pending
   *  renders; onNavigate(): the user moved to a match (stop following the tail) */
  constructor(list, { beforeSearch, onNavigate } = {}) {
    this.list = list;
    this.beforeSearch = beforeSearch || (() => {});
    this.onNavigate = onNavigate || (() => {});
    this.matches = []; // {range, entry}
    this.current = -1;
    this.timer = null;
    this.input = h("input", {
      class: "input tl-search-input",
      type: "search",
      placeholder: "Search the transcript…  ( / )",
      "aria-label": "Search the transcript",
      dataset: { search: "transcript" },
      on: {
        input: () => this.schedule(0),
        keydown: (e) => {
          if (e.key === "Enter") {
            e.preventDefault();
            this.step(e.shiftKey ? -1 : 1);
          } else if (e.key === "Escape") {
            // Leave the box; the query stays (a search box would clear itself): n / N step
            // through it from the page.
            e.preventDefault();
            this.input.blur();
          }
        },
      },
    });
    this.counter = h("span", { class: "tl-search-count muted", "aria-live": "polite" });
    const nav = (label, dir, text) =>
      h("button", { type: "button", class: "btn btn-ghost btn-sm", "aria-label": label, on: { click: () => this.step(dir) } }, text);
    this.el = h("div", { class: "tl-search", role: "search" }, this.input, this.counter, nav("Previous match", -1, "↑"), nav("Next match", 1, "↓"));
  }

  get query() {
    return this.input.value.trim();
  }

  /** Re-run soon (the timeline changed, or the query did). */
  schedule(delay = 250) {
    if (!this.query && !this.matches.length) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.run(), delay);
  }

  run() {
    clearTimeout(this.timer);
    const q = this.query.toLowerCase();
    const keep = this.current >= 0 ? this.matches[this.current] : null;
    for (const m of this.matches) m.entry.classList.remove("search-hit", "search-current");
    this.matches = [];
    if (q) {
      this.beforeSearch();
      this._collect(q);
    }
    // Stay on the match we were on (same entry and position), else the first.
    this.current = -1;
    if (this.matches.length) {
      const same = keep ? this.matches.findIndex((m) => m.entry === keep.entry && m.offset === keep.offset) : -1;
      this.current = same >= 0 ? same : 0;
    }
    this._paint();
  }

  _collect(q) {
    const walker = document.createTreeWalker(this.list, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node && this.matches.length < MAX_MATCHES; node = walker.nextNode()) {
      const text = node.data.toLowerCase();
      const entry = node.parentElement?.closest(".tl-entry");
      if (!entry || node.parentElement.closest(".tl-time, button.btn, .decision-actions")) continue;
      let offset = 0;
      for (let at = text.indexOf(q); at >= 0; at = text.indexOf(q, at + q.length)) {
        const range = document.createRange();
        range.setStart(node, at);
        range.setEnd(node, at + q.length);
        this.matches.push({ range, entry, offset: offset++ });
        entry.classList.add("search-hit");
      }
    }
  }

  _paint() {
    const n = this.matches.length;
    this.counter.textContent = this.query ? (n ? `${this.current + 1} of ${n}${n >= MAX_MATCHES ? "+" : ""}` : "no match") : "";
    this.el.dataset.matches = String(n);
    for (const m of this.matches) m.entry.classList.remove("search-current");
    const cur = this.matches[this.current];
    if (cur) cur.entry.classList.add("search-current");
    if (!HAS_HIGHLIGHTS) return;
    if (n) {
      CSS.highlights.set("transcript-search", new Highlight(...this.matches.map((m) => m.range)));
      CSS.highlights.set("transcript-current", new Highlight(cur.range));
    } else {
      CSS.highlights.delete("transcript-search");
      CSS.highlights.delete("transcript-current");
    }
  }

  /** Move to the next (1) or previous (-1) match and show it. */
  step(dir) {
    if (this.query && !this.matches.length) this.run();
    const n = this.matches.length;
    if (!n) return;
    this.current = (this.current + dir + n) % n;
    this._paint();
    const cur = this.matches[this.current];
    const details = cur.entry.querySelector("details");
    if (details && !details.open && details.contains(cur.range.startContainer)) details.open = true;
    this.onNavigate();
    const rect = cur.range.getBoundingClientRect();
    if (rect.top < 80 || rect.bottom > window.innerHeight - 20) {
      window.scrollTo({ top: window.scrollY + rect.top - window.innerHeight / 3 });
    }
  }

  focus() {
    this.input.focus();
    this.input.select();
  }

  dispose() {
    clearTimeout(this.timer);
    if (HAS_HIGHLIGHTS) {
      CSS.highlights.delete("transcript-search");
      CSS.highlights.delete("transcript-current");
    }
  }
}
