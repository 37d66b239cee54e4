// Spawn form: workspace, prompt, model, label, interactive, isolation, drive protocol,
// posture (+ tool allowlist). Submits POST /api/workspaces/{ws}/agents and opens the agent.

import { enc, post } from "../api.js";
import { h } from "../dom.js";
import * as state from "../state.js";
import { banner, emptyState } from "../ui.js";

function field(label, control, hint, cls = "") {
  return h(
    "label",
    { class: ["field", cls] },
    h("span", { class: "field-label" }, label),
    control,
    hint ? h("span", { class: "hint" }, hint) : null,
  );
}

export function mount(root, { query }) {
  const fleet = state.store.fleet;
  const workspaces = fleet?.workspaces || [];
  const caps = state.store.caps || {};
  const protocols = caps.drive_protocols && caps.drive_protocols.length ? caps.drive_protocols : ["ndjson"];

  root.append(
    h(
      "section",
      { class: "page-head" },
      h("div", {}, h("h1", {}, "New agent"), h("p", { class: "page-sub" }, "Launch a caliban agent in a workspace.")),
    ),
  );
  if (!workspaces.length) {
    root.append(emptyState("No workspaces", "Add a workspace on the fleet page first.", h("a", { class: "btn", href: "#/" }, "Fleet")));
    return null;
  }

  const wsSel = h(
    "select",
    { class: "input", name: "workspace", required: true },
    workspaces.map((w) =>
      h(
        "option",
        { value: w.name, disabled: w.health?.state === "unreachable" },
        w.health?.state === "unreachable" ? `${w.name} (unreachable)` : w.name,
      ),
    ),
  );
  const wanted = query.get("ws");
  const firstHealthy = workspaces.find((w) => w.health?.state !== "unreachable");
  wsSel.value = workspaces.some((w) => w.name === wanted) ? wanted : firstHealthy?.name || workspaces[0].name;

  const prompt = h("textarea", {
    class: "input",
    name: "prompt",
    rows: "6",
    required: true,
    placeholder: "Fix the failing tests in tests/api and explain the root cause.",
  });
  const label = h("input", { class: "input", name: "label", maxlength: "200", placeholder: "fix-api-tests" });
  const model = h("input", { class: "input", name: "model", maxlength: "200", placeholder: "workspace default", list: "model-suggestions" });
  const models = h(
    "datalist",
    { id: "model-suggestions" },
    ["claude-sonnet-4-6", "claude-opus-4-1", "claude-haiku-4-5", "gpt-5.5"].map((m) => h("option", { value: m })),
  );
  const interactive = h("input", { type: "checkbox", name: "interactive" });
  const worktree = h("input", { type: "checkbox", name: "worktree", props: { checked: true } });
  const protocol = h(
    "select",
    { class: "input", name: "drive_protocol" },
    protocols.map((p) => h("option", { value: p }, p === "ndjson" ? "ndjson (caliband attach stream)" : p === "acp" ? "acp (Agent Client Protocol)" : p)),
  );
  protocol.value = protocols.includes("ndjson") ? "ndjson" : protocols[0];
  const posture = h(
    "select",
    { class: "input", name: "posture" },
    h("option", { value: "" }, "workspace default"),
    h("option", { value: "supervised" }, "supervised — ask a human"),
    h("option", { value: "autonomous" }, "autonomous — answer by policy"),
  );
  const allowlist = h("input", { class: "input", name: "tool_allowlist", placeholder: "Edit, Bash(git *)" });
  const errorEl = h("p", { class: "form-error", role: "alert", hidden: true });
  const submit = h("button", { type: "submit", class: "btn btn-primary", dataset: { action: "spawn" } }, "Launch agent");

  const form = h(
    "form",
    {
      class: "card form spawn-form",
      id: "spawn-form",
      on: {
        submit: async (e) => {
          e.preventDefault();
          errorEl.hidden = true;
          const body = { prompt: prompt.value, interactive: interactive.checked };
          if (!prompt.value.trim()) {
            errorEl.textContent = "A prompt is required.";
            errorEl.hidden = false;
            return;
          }
          if (label.value.trim()) body.label = label.value.trim();
          if (model.value.trim()) body.model = model.value.trim();
          if (!worktree.checked) body.isolation = "shared";
          if (protocol.value && protocol.value !== "ndjson") body.drive_protocol = protocol.value;
          if (posture.value) body.posture = posture.value;
          const tools = allowlist.value.split(",").map((t) => t.trim()).filter(Boolean);
          if (tools.length) body.tool_allowlist = tools;
          submit.disabled = true;
          try {
            const r = await post(`/api/workspaces/${enc(wsSel.value)}/agents`, body);
            banner(r.created === false ? `Attached to the existing run ${r.agent_id}` : `Launched ${r.agent_id}`, "ok");
            state.scheduleFleetRefresh(0);
            location.hash = `#/agents/${encodeURIComponent(r.agent_id)}`;
          } catch (err) {
            errorEl.textContent = err.message || String(err);
            errorEl.hidden = false;
          } finally {
            submit.disabled = false;
          }
        },
      },
    },
    field("Workspace", wsSel),
    field("Prompt", prompt, "What the agent should do.", "span-2"),
    h(
      "div",
      { class: "form-grid" },
      field("Label", label, "A short name shown in the fleet."),
      field("Model", model, "Empty = the workspace's default."),
      field("Drive protocol", protocol, protocols.length > 1 ? "How Prospero drives the agent." : "ACP is not enabled on this daemon."),
      field("Posture", posture, "What happens when the agent asks for permission."),
    ),
    h(
      "div",
      { class: "checks" },
      h("label", { class: "check" }, interactive, h("span", {}, "Interactive — keep the agent open for messages")),
      h("label", { class: "check" }, worktree, h("span", {}, "Isolate in its own git worktree")),
    ),
    h("details", { class: "advanced" }, h("summary", {}, "Advanced"), field("Tool allowlist", allowlist, "Comma-separated tools the agent may use without asking.")),
    models,
    errorEl,
    h("div", { class: "form-actions" }, h("a", { class: "btn", href: "#/" }, "Cancel"), submit),
  );
  root.append(form);
  setTimeout(() => prompt.focus(), 0);
  return null;
}
