// A resumable SSE reader over EventSource with our own reconnect loop.
//
// prosperod tags every message with `id: <cursor>` (seq on an agent stream, store ordinal on
// the fleet stream). We remember the last cursor seen and, after any drop, reopen with
// `?from=<last + 1>`; messages at or below the last cursor are dropped, so a replay overlap
// never shows twice. The browser's own retry is never used (the stream is closed on error).
// An agent stream closes after `agent_finished`: that close is the end, not an error.

import { get, streamUrl } from "./api.js";

const MIN_BACKOFF = 500;
const MAX_BACKOFF = 15000;

export class ResumableStream {
  /**
   * @param {string} path            e.g. /api/agents/ID/stream
   * @param {object} handlers        onEvent(ev, cursor), onGap(info), onState(state, attempt),
   *                                 onBadFrame(raw), isFinished() -> bool
   * @param {number} from            first cursor wanted (0 = everything)
   */
  constructor(path, handlers, from = 0) {
    this.path = path;
    this.h = handlers;
    this.last = from - 1;
    this.es = null;
    this.timer = null;
    this.attempt = 0;
    this.stopped = false;
    this.state = "idle";
  }

  start() {
    this.stopped = false;
    this._open();
    return this;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.es) this.es.close();
    this.es = null;
  }

  /** Drop the connection as a network failure would (used to exercise resumption). */
  drop() {
    if (this.es && !this.stopped) this._failed();
  }

  _setState(state) {
    this.state = state;
    if (this.h.onState) this.h.onState(state, this.attempt);
  }

  _open() {
    if (this.stopped) return;
    this._setState(this.attempt === 0 ? "connecting" : "reconnecting");
    const es = new EventSource(streamUrl(this.path, this.last + 1));
    this.es = es;
    es.onopen = () => {
      if (this.es !== es) return;
      this.attempt = 0;
      this._setState("live");
    };
    es.onmessage = (msg) => {
      if (this.es !== es) return;
      const cursor = Number.parseInt(msg.lastEventId, 10);
      let ev;
      try {
        ev = JSON.parse(msg.data);
      } catch {
        if (this.h.onBadFrame) this.h.onBadFrame(msg.data);
        return;
      }
      const at = Number.isFinite(cursor) ? cursor : Number(ev && ev.seq);
      if (Number.isFinite(at)) {
        if (at <= this.last) return; // already shown (replay overlap after a reconnect)
        this.last = at;
      }
      this.h.onEvent(ev, at);
    };
    es.addEventListener("gap", (msg) => {
      if (this.es !== es) return;
      let info = {};
      try {
        info = JSON.parse(msg.data);
      } catch {
        /* keep {} */
      }
      if (this.h.onGap) this.h.onGap(info);
    });
    es.onerror = () => {
      if (this.es !== es) return;
      this._failed();
    };
  }

  async _failed() {
    const es = this.es;
    this.es = null;
    if (es) es.close();
    if (this.stopped) return;
    if (this.h.isFinished && this.h.isFinished()) {
      this._setState("finished");
      return;
    }
    this.attempt += 1;
    this._setState("reconnecting");
    const delay = Math.min(MAX_BACKOFF, MIN_BACKOFF * 2 ** Math.min(this.attempt - 1, 6));
    // An SSE error hides its status: one API call finds out whether a token is missing (the
    // request asks for one on 401) before the stream is reopened with it.
    try {
      await get("/api/capabilities");
    } catch {
      /* unreachable or still unauthorised: retry later with backoff */
    }
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this._open(), this.attempt === 1 ? 0 : delay);
  }
}
