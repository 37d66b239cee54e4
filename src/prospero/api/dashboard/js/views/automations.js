// Automations (docs/automations.md): the list (schedule, next fire, enabled toggle, run-now),
// each automation's run history linking to the agent it spawned, and a create form. The
// webhook secret a create answers is shown once, in the page, never again.

import { del, enc, get, post } from "../api.js";
import { h, replace } from "../dom.js";
import { fmtDateTime, shortId } from "../format.js";
import * as state from "../state.js";
import { banner, busy, button, emptyState, field } from "../ui.js";

function runRow(r) {
  const agent = r.agent_id
    ? h("a", { href: `#/agents/${encodeURIComponent(r.agent_id)}`, class: "mono", dataset: { testid: "run-agent" } }, shortId(r.agent_id))
    : h("span", { class: "form-error" }, r.error || "—");
  return h(
    "tr",
    { dataset: { run: r.id, state: r.state } },
    h("td", { dataset: { label: "Fired" } }, fmtDateTime(r.fired_at)),
    h("td", { dataset: { label: "Trigger" } }, r.trigger),
    h("td", { dataset: { label: "State" } }, r.state),
    h("td", { dataset: { label: "Agent" } }, agent),
  );
}

function createForm(onCreated) {
  const workspaces = state.store.fleet?.workspaces || [];
  const name = h("input", { class: "input", name: "name", required: true, maxlength: "100", placeholder: "nightly-triage" });
  const ws = h("select", { class: "input", name: "workspace" }, workspaces.map((w) => h("option", { value: w.name }, w.name)));
  const prompt = h("textarea", {
    class: "input",
    name: "prompt",
    rows: "4",
    required: true,
    placeholder: "Triage issue {{payload.issue.title}} (fired by {{trigger}} at {{now}})",
  });
  const cron = h("input", { class: "input mono", name: "schedule", placeholder: "0 3 * * *  (UTC; empty = none)" });
  const webhook = h("input", { type: "checkbox", name: "webhook" });
  const worktree = h("input", { type: "checkbox", name: "worktree", props: { checked: true } });
  const errorEl = h("p", { class: "form-error", role: "alert", hidden: true });
  const secretEl = h("div", { class: "card", hidden: true, dataset: { testid: "secret" } });
  const submit = h("button", { type: "submit", class: "btn btn-primary", dataset: { action: "create-automation" } }, "Create automation");
  const form = h(
    "form",
    {
      class: "card form",
      id: "automation-form",
      on: {
        submit: async (e) => {
          e.preventDefault();
          errorEl.hidden = true;
          const body = {
            name: name.value.trim(),
            workspace: ws.value,
            spawn: { prompt: prompt.value },
            webhook: webhook.checked,
          };
          if (cron.value.trim()) body.schedule = cron.value.trim();
          if (!worktree.checked) body.spawn.isolation = "shared";
          submit.disabled = true;
          try {
            const r = await post("/api/automations", body);
            banner(`Created ${r.automation.name}`, "ok");
            if (r.secret) {
              replace(
                secretEl,
                h("p", {}, "Webhook secret — shown only now, copy it:"),
                h("code", { class: "mono", dataset: { testid: "secret-value" } }, r.secret),
              );
              secretEl.hidden = false;
            }
            form.reset();
            onCreated();
          } catch (err) {
            errorEl.textContent = err.message || String(err);
            errorEl.hidden = false;
          } finally {
            submit.disabled = false;
          }
        },
      },
    },
    h("div", { class: "form-grid" }, field("Name", name), field("Workspace", ws)),
    field("Prompt template", prompt, "Placeholders: {{payload.a.b}}, {{trigger}}, {{now}}, {{automation.name}}, {{run.id}}.", "span-2"),
    h("div", { class: "form-grid" }, field("Schedule", cron, "5-field cron, UTC.")),
    h(
      "div",
      { class: "checks" },
      h("label", { class: "check" }, webhook, h("span", {}, "Signed webhook trigger (shows its secret once)")),
      h("label", { class: "check" }, worktree, h("span", {}, "Isolate each agent in its own git worktree")),
    ),
    errorEl,
    h("div", { class: "form-actions" }, submit),
  );
  return h("div", {}, form, secretEl);
}

export function mount(root) {
  const listEl = h("div", { dataset: { testid: "automations" } });
  const runsEl = h("div", { dataset: { testid: "automation-runs" } });
  let selected = null;
  let alive = true;

  async function showRuns(a) {
    selected = a.id;
    let runs = [];
    try {
      runs = await get(`/api/automations/${enc(a.id)}/runs`);
    } catch (e) {
      banner(e.message || String(e), "error");
      return;
    }
    if (!alive || selected !== a.id) return;
    replace(
      runsEl,
      h("h2", { class: "section-title" }, `Runs of ${a.name}`),
      runs.length
        ? h(
            "div",
            { class: "card table-wrap" },
            h(
              "table",
              { class: "agents stacked automation-runs" },
              h("thead", {}, h("tr", {}, ["Fired", "Trigger", "State", "Agent / error"].map((c) => h("th", {}, c)))),
              h("tbody", {}, runs.map(runRow)),
            ),
          )
        : emptyState("No runs yet", "Run it now, wait for its schedule, or call its webhook."),
    );
  }

  async function load() {
    let items;
    try {
      items = await get("/api/automations");
    } catch (e) {
      replace(listEl, emptyState("Automations are not available", e.message || String(e)));
      return;
    }
    if (!alive) return;
    if (!items.length) {
      replace(listEl, emptyState("No automations", "Create one below: a prompt template fired on a schedule, by a signed webhook or by hand."));
      return;
    }
    const rows = items.map((a) => {
      const toggle = h("input", {
        type: "checkbox",
        dataset: { action: "toggle" },
        props: { checked: a.enabled },
        "aria-label": `${a.name} enabled`,
        on: {
          change: async () => {
            try {
              await post(`/api/automations/${enc(a.id)}/${toggle.checked ? "enable" : "disable"}`);
            } catch (e) {
              banner(e.message || String(e), "error");
            }
            load();
          },
        },
      });
      const runBtn = button("Run now", async () => {
        await busy(runBtn, async () => {
          const run = await post(`/api/automations/${enc(a.id)}/run`);
          banner(run.agent_id ? `Spawned ${run.agent_id}` : `Run failed: ${run.error}`, run.agent_id ? "ok" : "error");
          await load();
          await showRuns(a);
        });
      }, "btn btn-sm", { dataset: { action: "run-now" } });
      const runsBtn = button("Runs", () => showRuns(a), "btn btn-sm btn-ghost", { dataset: { action: "runs" } });
      const delBtn = button("Delete", async () => {
        await busy(delBtn, async () => {
          await del(`/api/automations/${enc(a.id)}`);
          if (selected === a.id) replace(runsEl);
          await load();
        });
      }, "btn btn-sm btn-ghost", { dataset: { action: "delete" } });
      return h(
        "tr",
        { dataset: { automation: a.name } },
        h("td", { dataset: { label: "Name" } }, h("strong", {}, a.name)),
        h("td", { dataset: { label: "Workspace" } }, a.workspace),
        h("td", { class: "mono", dataset: { label: "Schedule" } }, a.schedule || "—"),
        h("td", { dataset: { label: "Next fire", testid: "next-fire" } }, a.next_fire ? fmtDateTime(a.next_fire) : "—"),
        h("td", { dataset: { label: "Webhook" } }, a.webhook ? "yes" : "no"),
        h("td", { dataset: { label: "Last fired" } }, a.last_fired ? fmtDateTime(a.last_fired) : "—"),
        h("td", { dataset: { label: "Enabled" } }, toggle),
        h("td", { class: "actions" }, runBtn, runsBtn, delBtn),
      );
    });
    replace(
      listEl,
      h(
        "div",
        { class: "card table-wrap" },
        h(
          "table",
          { class: "agents stacked automations-table" },
          h("thead", {}, h("tr", {}, ["Name", "Workspace", "Schedule (UTC)", "Next fire", "Webhook", "Last fired", "Enabled", ""].map((c) => h("th", {}, c)))),
          h("tbody", {}, rows),
        ),
      ),
    );
  }

  root.append(
    h(
      "section",
      { class: "page-head" },
      h("div", {}, h("h1", {}, "Automations"), h("p", { class: "page-sub" }, "Spawn agents on a schedule, from a signed webhook, or by hand.")),
    ),
    listEl,
    runsEl,
    h("h2", { class: "section-title" }, "New automation"),
    createForm(load),
  );
  replace(listEl, emptyState("Loading…", ""));
  load();
  const timer = setInterval(load, 30000);
  return () => {
    alive = false;
    clearInterval(timer);
  };
}
