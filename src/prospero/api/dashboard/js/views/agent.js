// Agent page: header with status (awaiting approval while a permission request waits) and
// totals, controls (send input, end input, cancel turn, kill, respawn, remove — destructive
// ones confirmed), the live timeline with its search, the files the run changed and the tool
// inspector. The timeline follows /api/agents/{id}/stream from seq 0 and resumes after any
// drop with ?from=<last seq + 1>; the stream ends after agent_finished, later events (the
// final status change, removal) are fetched from /events when the fleet stream reports them.

import { ApiError, del, enc, get, post } from "../api.js";
import { h, replace } from "../dom.js";
import { fmtAge, fmtTokens, fmtUsd, isTerminal, shortId } from "../format.js";
import { FilesPanel } from "../files.js";
import { renderInspector } from "../inspector.js";
import { setViewKeys } from "../keys.js";
import { TranscriptSearch } from "../search.js";
import { ResumableStream } from "../sse.js";
import * as state from "../state.js";
import { Timeline } from "../timeline.js";
import { agentPill, banner, busy, button, confirmDialog, ownerBadge, tag } from "../ui.js";

const CONN_LABEL = {
  connecting: "connecting",
  live: "live",
  reconnecting: "reconnecting",
  finished: "finished",
};

export function mount(root, { params }) {
  const id = params[0];
  let agent = state.findAgent(id);
  let gone = false;
  let disposed = false;
  let pendingShown = null; // the pending requests the head shows

  const titleEl = h("h1", { class: "agent-title" });
  const statusEl = h("span", { class: "agent-status" });
  const connEl = h("span", { class: "conn-chip", dataset: { state: "connecting" } }, "connecting");
  const tagsEl = h("div", { class: "agent-tags" });
  const statsEl = h("div", { class: "agent-stats" });
  const controlsEl = h("div", { class: "controls" });
  const inputSlot = h("div", {});
  const goneEl = h("p", { class: "note-info", hidden: true });
  const list = h("div", { class: "timeline", role: "log", "aria-live": "polite", "aria-label": "Agent timeline" });
  const placeholder = h("p", { class: "muted tl-placeholder" }, "Waiting for events…");
  const inspector = h("aside", { class: "inspector card", "aria-label": "Tool inspector" });
  const follow = h("input", { type: "checkbox", id: "follow", props: { checked: true } });
  const expand = h("input", { type: "checkbox", id: "expand-thinking" });

  // Following the tail only makes sense while the agent runs.
  follow.checked = !agent || !isTerminal(agent.status);

  const wsRoot = () => state.workspaceByName(agent?.workspace || "")?.root || "";
  const files = new FilesPanel({ onSelect: (rec) => timeline.select(rec), root: wsRoot });
  const search = new TranscriptSearch(list, {
    beforeSearch: () => timeline.flush(),
    onNavigate: () => {
      follow.checked = false;
    },
  });

  // Bursts (a replayed history) update the stats and the scroll position once per frame.
  let frameQueued = false;
  const timeline = new Timeline(list, {
    onSelectTool: (rec) => renderInspector(inspector, rec, () => timeline.select(null), { root: wsRoot() }),
    onTool: () => files.update(timeline.tools),
    root: wsRoot,
    onChange: () => {
      placeholder.hidden = true;
      search.schedule();
      if (frameQueued) return;
      frameQueued = true;
      requestAnimationFrame(() => {
        frameQueued = false;
        if (disposed) return;
        renderStats();
        if (follow.checked) window.scrollTo(0, document.documentElement.scrollHeight);
      });
    },
  });
  renderInspector(inspector, null);

  expand.addEventListener("change", () => {
    for (const d of list.querySelectorAll("details.thinking")) d.open = expand.checked;
  });
  // thinking blocks created later follow the toggle too
  const obs = new MutationObserver((muts) => {
    if (!expand.checked) return;
    for (const m of muts) for (const n of m.addedNodes) n.querySelector?.("details.thinking")?.setAttribute("open", "");
  });
  obs.observe(list, { childList: true });

  function renderHead() {
    const a = agent;
    const name = a ? a.label || a.name || a.id : id;
    titleEl.textContent = name;
    document.title = `${name} · Prospero`;
    pendingShown = a ? state.pendingFor(a) : null;
    replace(statusEl, a ? agentPill(a.status, pendingShown) : null);
    replace(
      tagsEl,
      h("span", { class: "mono agent-id", title: "agent id" }, id),
      a ? tag(a.workspace, "tag-ws", "workspace") : null,
      a ? tag(a.drive_protocol || "ndjson", `proto-${a.drive_protocol || "ndjson"}`, "drive protocol") : null,
      a?.posture ? tag(a.posture, `posture-${a.posture}`, "permission posture") : null,
      a?.model || timeline.model ? tag(a?.model || timeline.model, "tag-model", "model") : null,
      a?.interactive ? tag("interactive", "tag-int") : null,
      a ? tag(a.isolated ? "worktree" : "shared tree", a.isolated ? "tag-wt" : "") : null,
      ownerBadge(a?.owner),
      a ? h("span", { class: "muted", title: a.started_at }, `started ${fmtAge(a.started_at)} ago`) : null,
    );
    renderControls();
  }

  function renderStats() {
    const t = timeline.totals;
    replace(
      statsEl,
      h("div", { class: "mini-stat" }, h("span", {}, "Tokens in"), h("strong", {}, fmtTokens(t.input))),
      h("div", { class: "mini-stat" }, h("span", {}, "Tokens out"), h("strong", {}, fmtTokens(t.output))),
      h("div", { class: "mini-stat" }, h("span", {}, "Cost"), h("strong", {}, fmtUsd(t.cost))),
      h("div", { class: "mini-stat" }, h("span", {}, "Turns"), h("strong", {}, String(t.turns))),
      h("div", { class: "mini-stat" }, h("span", {}, "Events"), h("strong", { dataset: { testid: "event-count" } }, String(timeline.lastSeq))),
    );
  }

  async function act(btn, fn, okText) {
    await busy(btn, async () => {
      await fn();
      if (okText) banner(okText, "ok");
      refreshAgent();
    });
  }

  function renderControls() {
    const a = agent;
    const items = [];
    if (a && !gone) {
      const terminal = isTerminal(a.status);
      if (!terminal) {
        const acp = (a.drive_protocol || "ndjson") === "acp";
        const cancelBtn = button(
          "Cancel turn",
          () =>
            act(cancelBtn, () => post(`/api/agents/${enc(id)}/cancel`), "Cancel requested"),
          "btn",
          {
            dataset: { action: "cancel" },
            disabled: !acp || a.status === "idle",
            title: acp ? "Cancel the current turn; the agent stays up" : "Only ACP agents can cancel a turn",
          },
        );
        const killBtn = button(
          "Kill",
          async () => {
            const ok = await confirmDialog({
              title: "Kill this agent?",
              message: `${a.label || a.name || a.id} (${shortId(a.id)}) will be stopped now. Its history stays available.`,
              confirmLabel: "Kill agent",
              danger: true,
            });
            if (ok) await act(killBtn, () => post(`/api/agents/${enc(id)}/kill`), "Kill requested");
          },
          "btn btn-danger",
          { dataset: { action: "kill" } },
        );
        items.push(cancelBtn, killBtn);
      } else {
        const respawnBtn = button(
          "Respawn",
          () =>
            busy(respawnBtn, async () => {
              const r = await post(`/api/agents/${enc(id)}/respawn`);
              banner(`Respawned as ${r.agent_id}`, "ok");
              await state.refreshFleet();
              location.hash = `#/agents/${encodeURIComponent(r.agent_id)}`;
            }),
          "btn",
          { dataset: { action: "respawn" }, title: "Start a new agent with the same spec" },
        );
        const removeBtn = button(
          "Remove",
          async () => {
            const ok = await confirmDialog({
              title: "Remove this agent?",
              message: `${a.label || a.name || a.id} (${shortId(a.id)}) will be removed from its caliband. Its history stays readable here.`,
              confirmLabel: "Remove agent",
              danger: true,
            });
            if (!ok) return;
            await busy(removeBtn, async () => {
              await del(`/api/agents/${enc(id)}`);
              banner(`Removed ${shortId(id)}`, "ok");
              await state.refreshFleet();
              location.hash = "#/";
            });
          },
          "btn btn-danger",
          { dataset: { action: "remove" } },
        );
        items.push(respawnBtn, removeBtn);
      }
    }
    replace(controlsEl, items);
    renderInput();
  }

  let inputBox = null;
  function renderInput() {
    const a = agent;
    const show = a && !gone && a.interactive && !isTerminal(a.status);
    if (!show) {
      replace(inputSlot);
      inputBox = null;
      return;
    }
    if (inputBox) {
      inputBox.querySelector(".input-state").textContent =
        a.status === "idle" ? "The agent is waiting for input." : "The agent is working; input is queued.";
      return;
    }
    const ta = h("textarea", {
      class: "input",
      id: "agent-input",
      rows: "2",
      placeholder: "Message the agent…  (Ctrl+Enter to send)",
      "aria-label": "Message",
    });
    const send = h("button", { type: "submit", class: "btn btn-primary", dataset: { action: "send" } }, "Send");
    const endBtn = button(
      "End input",
      async () => {
        const ok = await confirmDialog({
          title: "End input?",
          message: "The agent finishes its current work and its run ends. It cannot take more input.",
          confirmLabel: "End input",
        });
        if (ok) await act(endBtn, () => post(`/api/agents/${enc(id)}/end-input`), "Input ended");
      },
      "btn",
      { dataset: { action: "end-input" } },
    );
    const form = h(
      "form",
      {
        class: "input-box card",
        on: {
          submit: async (e) => {
            e.preventDefault();
            const text = ta.value;
            if (!text.trim()) return;
            await busy(send, async () => {
              await post(`/api/agents/${enc(id)}/input`, { text });
              ta.value = "";
              banner("Message sent", "ok", { timeout: 2000 });
            });
          },
        },
      },
      h("div", { class: "input-head" }, h("strong", {}, "Interactive"), h("span", { class: "muted input-state" })),
      ta,
      h("div", { class: "input-actions" }, endBtn, send),
    );
    ta.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) form.requestSubmit();
    });
    inputBox = form;
    replace(inputSlot, form);
    renderInput();
  }

  let refreshTimer = null;
  async function refreshAgent() {
    clearTimeout(refreshTimer);
    try {
      agent = await get(`/api/agents/${enc(id)}`);
      gone = false;
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        gone = true;
        agent = agent ? { ...agent } : null;
      }
    }
    if (disposed) return;
    goneEl.hidden = !gone;
    goneEl.textContent = gone ? "This agent is no longer in the fleet; its stored history is shown." : "";
    renderHead();
  }

  // ---------------------------------------------------------------------------- events

  function apply(ev) {
    const added = timeline.add(ev);
    if (!added) return;
    const k = ev.kind || {};
    if (k.kind === "status_changed" && agent) {
      agent.status = k.to;
      renderHead();
      clearTimeout(refreshTimer);
      refreshTimer = setTimeout(refreshAgent, 250);
    } else if (k.kind === "agent_gone") {
      refreshAgent();
    } else if (k.kind === "agent_init" && !agent?.model) {
      renderHead();
    }
  }

  // After the stream ended (agent_finished), later events come from /events, in order.
  let catching = false;
  let catchAgain = false;
  async function catchUp() {
    if (catching) {
      catchAgain = true;
      return;
    }
    catching = true;
    try {
      do {
        catchAgain = false;
        const events = await get(`/api/agents/${enc(id)}/events?from=${timeline.lastSeq + 1}`);
        if (disposed) return;
        for (const ev of events || []) apply(ev);
      } while (catchAgain);
    } catch {
      /* shown by the conn chip / next event */
    } finally {
      catching = false;
    }
  }

  const stream = new ResumableStream(
    `/api/agents/${enc(id)}/stream`,
    {
      onEvent: (ev) => apply(ev),
      onGap: (info) =>
        timeline.notice(
          "gap",
          `Fell behind the live stream: ${info.skipped ?? "some"} event(s) after #${info.last_seq ?? "?"} were replayed from the store.`,
        ),
      onBadFrame: () => timeline.notice("bad_frame", "An undecodable frame was skipped.", "warn"),
      onState: (st, attempt) => {
        connEl.dataset.state = st;
        connEl.textContent = st === "reconnecting" && attempt > 1 ? `reconnecting (${attempt})` : CONN_LABEL[st] || st;
        if (st === "finished") catchUp();
      },
      isFinished: () => timeline.finished,
    },
    0,
  );

  const offEvent = state.on("event", (ev) => {
    if (ev.agent_id === id && timeline.finished && Number(ev.seq) > timeline.lastSeq) catchUp();
  });
  const offFleet = state.on("fleet", () => {
    const fresh = state.findAgent(id);
    if (
      fresh &&
      agent &&
      (fresh.status !== agent.status || fresh.model !== agent.model || (fresh.owner || null) !== (agent.owner || null))
    ) {
      agent = { ...agent, ...fresh };
      renderHead();
    }
  });
  // The head shows "awaiting approval" while one of this agent's requests waits.
  const offDecisions = state.on("decisions", () => {
    const n = state.pendingFor(agent || id);
    if (n !== pendingShown) renderHead();
  });
  const onDrop = () => stream.drop();
  window.addEventListener("prospero:drop", onDrop);
  const offKeys = setViewKeys((key) => {
    if (key === "n" || key === "N") {
      if (!search.query) return false;
      search.step(key === "n" ? 1 : -1);
      return true;
    }
    if (key === "Escape" && timeline.selected) {
      timeline.select(null);
      return true;
    }
    return false;
  });

  root.append(
    h(
      "section",
      { class: "agent-head card" },
      h("a", { class: "back", href: "#/" }, "← Fleet"),
      h("div", { class: "agent-title-row" }, titleEl, statusEl, connEl),
      tagsEl,
      goneEl,
      h("div", { class: "agent-head-bottom" }, statsEl, controlsEl),
    ),
    inputSlot,
    h(
      "div",
      { class: "agent-body" },
      h(
        "section",
        { class: "timeline-wrap card" },
        h(
          "div",
          { class: "tl-toolbar" },
          h("h2", { class: "card-title" }, "Timeline"),
          search.el,
          h(
            "div",
            { class: "tl-toggles" },
            h("label", { class: "check" }, expand, " Expand thinking"),
            h("label", { class: "check" }, follow, " Follow"),
          ),
        ),
        placeholder,
        list,
      ),
      h("div", { class: "agent-side" }, files.el, inspector),
    ),
  );
  renderHead();
  renderStats();
  refreshAgent();
  stream.start();

  return () => {
    disposed = true;
    stream.stop();
    obs.disconnect();
    timeline.dispose();
    search.dispose();
    offEvent();
    offFleet();
    offDecisions();
    offKeys();
    clearTimeout(refreshTimer);
    window.removeEventListener("prospero:drop", onDrop);
    document.title = "Prospero";
  };
}
