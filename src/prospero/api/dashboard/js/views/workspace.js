// Workspace page: what the workspace is (root, sources, health, agents) and its provider
// config editor (provider, base URL, API-key env var NAME, env rows). Saving sets every field
// the form shows, empty ones cleared (a PATCH naming each, so the workspace's own caliband
// endpoint, which the form does not edit, stays), restarts the workspace's caliband when the
// config changed, and shows the warnings the answer carries; removing only forgets it.

import { del, enc, patch } from "../api.js";
import { h, replace } from "../dom.js";
import * as state from "../state.js";
import { banner, busy, button, confirmDialog, emptyState, healthPill } from "../ui.js";

const PROVIDERS = ["anthropic", "openai", "google", "ollama", "bedrock", "vertex"];

function envRow(key = "", value = "") {
  const row = h(
    "div",
    { class: "env-row" },
    h("input", { class: "input mono env-key", placeholder: "KEY", "aria-label": "Variable name", props: { value: key } }),
    h("input", { class: "input mono env-value", placeholder: "value", "aria-label": "Variable value", props: { value } }),
  );
  row.append(button("Remove", () => row.remove(), "btn btn-ghost btn-sm", { "aria-label": "Remove variable" }));
  return row;
}

export function mount(root, { params }) {
  const name = params[0];
  const ws = state.workspaceByName(name);
  root.append(h("a", { class: "back", href: "#/" }, "← Fleet"));
  if (!ws) {
    root.append(emptyState("Unknown workspace", `No workspace named “${name}” in the fleet.`));
    return null;
  }
  const cfg = ws.config || {};
  const provider = h("input", { class: "input", name: "provider", list: "provider-list", placeholder: "caliband default", props: { value: cfg.provider || "" } });
  const providers = h("datalist", { id: "provider-list" }, PROVIDERS.map((p) => h("option", { value: p })));
  const baseUrl = h("input", { class: "input", name: "base_url", type: "url", placeholder: "https://… (optional)", props: { value: cfg.base_url || "" } });
  const keyEnv = h("input", {
    class: "input mono",
    name: "api_key_from_env",
    placeholder: "ANTHROPIC_API_KEY",
    pattern: "[A-Za-z_][A-Za-z0-9_]*",
    props: { value: cfg.api_key_from_env || "" },
  });
  let known = Object.keys(cfg.env || {}); // the variables stored, as last seen
  const envRows = h("div", { class: "env-rows" }, Object.entries(cfg.env || {}).map(([k, v]) => envRow(k, v)));
  const errorEl = h("p", { class: "form-error", role: "alert", hidden: true });
  const save = h("button", { type: "submit", class: "btn btn-primary", dataset: { action: "save" } }, "Save and restart caliband");

  const form = h(
    "form",
    {
      class: "card form ws-config",
      id: "ws-config-form",
      on: {
        submit: async (e) => {
          e.preventDefault();
          errorEl.hidden = true;
          const body = {
            provider: provider.value.trim() || null,
            base_url: baseUrl.value.trim() || null,
            api_key_from_env: keyEnv.value.trim() || null,
          };
          // the variables the form no longer lists are removed (null), the others set
          const env = Object.fromEntries(known.map((k) => [k, null]));
          for (const row of envRows.querySelectorAll(".env-row")) {
            const k = row.querySelector(".env-key").value.trim();
            const v = row.querySelector(".env-value").value;
            if (!k && !v) continue;
            if (!k) {
              errorEl.textContent = "Every environment value needs a name.";
              errorEl.hidden = false;
              return;
            }
            env[k] = v;
          }
          body.env = env;
          await busy(save, async () => {
            let saved;
            try {
              saved = await patch(`/api/workspaces/${enc(name)}/config`, body);
            } catch (err) {
              errorEl.textContent = err.message || String(err);
              errorEl.hidden = false;
              return;
            }
            known = Object.keys((saved && saved.config && saved.config.env) || {});
            banner(`Saved ${name}'s config; its caliband restarts with it.`, "ok");
            for (const warning of (saved && saved.warnings) || []) banner(`Warning: ${warning}`, "warn", { timeout: 0 });
            await state.refreshFleet();
          });
        },
      },
    },
    h("h2", { class: "card-title" }, "Provider configuration"),
    h("p", { class: "hint" }, "Saves every field shown (empty fields are cleared). The API key is read from prosperod's own environment: enter the variable's name, never the key."),
    h(
      "div",
      { class: "form-grid" },
      h("label", { class: "field" }, h("span", { class: "field-label" }, "Provider"), provider),
      h("label", { class: "field" }, h("span", { class: "field-label" }, "Base URL"), baseUrl),
      h("label", { class: "field" }, h("span", { class: "field-label" }, "API key from env var"), keyEnv),
    ),
    providers,
    h("div", { class: "field" }, h("span", { class: "field-label" }, "Environment"), envRows, button("Add variable", () => envRows.append(envRow()), "btn btn-sm", { dataset: { action: "add-env" } })),
    errorEl,
    h("div", { class: "form-actions" }, save),
  );

  const info = h("section", { class: "card ws-info" });
  function renderInfo() {
    const w = state.workspaceByName(name) || ws;
    replace(
      info,
      h("div", { class: "ws-title" }, h("h1", { class: "ws-name" }, w.name), healthPill(w.health)),
      h(
        "dl",
        { class: "kv-list" },
        h("div", { class: "kv" }, h("dt", {}, "Root"), h("dd", { class: "mono" }, w.root)),
        h("div", { class: "kv" }, h("dt", {}, "Sources"), h("dd", {}, (w.sources || []).map((s) => `${s.name} (${s.path})`).join(", ") || "—")),
        h("div", { class: "kv" }, h("dt", {}, "Caliband"), h("dd", { class: "mono" }, w.config?.caliband ? `${w.config.caliband.addr}${w.config.caliband.ca_file ? " (TLS)" : ""}` : "prosperod's default")),
        h("div", { class: "kv" }, h("dt", {}, "Agents"), h("dd", {}, String((w.agents || []).length))),
        w.health?.state === "unreachable" ? h("div", { class: "kv" }, h("dt", {}, "Reason"), h("dd", {}, w.health.reason || "")) : null,
      ),
      h(
        "div",
        { class: "page-actions" },
        h("a", { class: "btn btn-primary", href: `#/spawn?ws=${encodeURIComponent(w.name)}` }, "Launch agent"),
        removeBtn,
      ),
    );
  }
  const removeBtn = button(
    "Remove workspace",
    async () => {
      const ok = await confirmDialog({
        title: `Remove workspace ${name}?`,
        message: "Prospero forgets it. Its caliband and agents keep running; history stays in the store.",
        confirmLabel: "Remove workspace",
        danger: true,
      });
      if (!ok) return;
      await busy(removeBtn, async () => {
        await del(`/api/workspaces/${enc(name)}`);
        banner(`Removed workspace ${name}`, "ok");
        await state.refreshFleet();
        location.hash = "#/";
      });
    },
    "btn btn-danger",
    { dataset: { action: "remove-workspace" } },
  );
  renderInfo();
  root.append(info, form);
  const off = state.on("fleet", renderInfo);
  return () => off();
}
