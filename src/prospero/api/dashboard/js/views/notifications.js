// Notifications (docs/notifications.md): webhook targets (masked URLs, events, enabled toggle,
// remove), a Test button per target showing what the receiver answered, an add form, and the
// recent delivery log.

import { del, enc, get, patch, post } from "../api.js";
import { h, replace } from "../dom.js";
import { fmtDateTime, shortId } from "../format.js";
import { banner, busy, button, emptyState, field } from "../ui.js";

const EVENTS = ["decision_pending", "agent_finished", "agent_failed", "budget_warning", "budget_exceeded"];

function outcome(d) {
  if (d.state === "delivered") return `delivered (HTTP ${d.http_status})`;
  if (d.state === "pending") return "pending";
  return `failed: ${d.error || (d.http_status ? `HTTP ${d.http_status}` : "no answer")}`;
}

function deliveryRow(d, names) {
  const agent = d.agent_id
    ? h("a", { href: `#/agents/${encodeURIComponent(d.agent_id)}`, class: "mono" }, shortId(d.agent_id))
    : "—";
  return h(
    "tr",
    { dataset: { delivery: String(d.id), state: d.state, event: d.event } },
    h("td", { dataset: { label: "Time" } }, fmtDateTime(d.updated_at || d.created_at)),
    h("td", { dataset: { label: "Target" } }, names[d.target_id] || d.target_id),
    h("td", { dataset: { label: "Event" } }, d.event),
    h("td", { dataset: { label: "Agent" } }, agent),
    h("td", { dataset: { label: "Attempts" } }, String(d.attempts)),
    h("td", { dataset: { label: "Result" }, class: d.state === "failed" ? "form-error" : "" }, outcome(d)),
    h("td", { dataset: { label: "Summary" } }, d.summary),
  );
}

function addForm(onAdded) {
  const name = h("input", { class: "input", name: "name", required: true, maxlength: "100", placeholder: "ops-slack" });
  const url = h("input", { class: "input mono", name: "url", required: true, type: "url", placeholder: "https://hooks.slack.com/services/…" });
  const format = h("select", { class: "input", name: "format" }, ["slack", "discord", "json"].map((f) => h("option", { value: f }, f)));
  const boxes = EVENTS.map((e) => h("input", { type: "checkbox", name: "event", value: e, props: { checked: true } }));
  const errorEl = h("p", { class: "form-error", role: "alert", hidden: true });
  const submit = h("button", { type: "submit", class: "btn btn-primary", dataset: { action: "add-target" } }, "Add target");
  const form = h(
    "form",
    {
      class: "card form",
      id: "notify-form",
      on: {
        submit: async (e) => {
          e.preventDefault();
          errorEl.hidden = true;
          const events = boxes.filter((b) => b.checked).map((b) => b.value);
          const body = { name: name.value.trim(), url: url.value.trim(), format: format.value };
          if (events.length !== EVENTS.length) body.events = events;
          submit.disabled = true;
          try {
            const t = await post("/api/notifications/targets", body);
            banner(`Added ${t.name}`, "ok");
            form.reset();
            onAdded();
          } catch (err) {
            errorEl.textContent = err.message || String(err);
            errorEl.hidden = false;
          } finally {
            submit.disabled = false;
          }
        },
      },
    },
    h("div", { class: "form-grid" }, field("Name", name), field("Format", format)),
    field("Webhook URL", url, "A secret: shown masked once saved.", "span-2"),
    h(
      "div",
      { class: "checks" },
      EVENTS.map((e, i) => h("label", { class: "check" }, boxes[i], h("span", {}, e))),
    ),
    errorEl,
    h("div", { class: "form-actions" }, submit),
  );
  return form;
}

export function mount(root) {
  const listEl = h("div", { dataset: { testid: "targets" } });
  const logEl = h("div", { dataset: { testid: "deliveries" } });
  let alive = true;
  let names = {};

  async function loadLog() {
    let rows;
    try {
      rows = await get("/api/notifications/deliveries?limit=50");
    } catch (e) {
      replace(logEl, emptyState("The delivery log is not available", e.message || String(e)));
      return;
    }
    if (!alive) return;
    replace(
      logEl,
      rows.length
        ? h(
            "div",
            { class: "card table-wrap" },
            h(
              "table",
              { class: "agents stacked deliveries-table" },
              h("thead", {}, h("tr", {}, ["Time", "Target", "Event", "Agent", "Attempts", "Result", "Summary"].map((c) => h("th", {}, c)))),
              h("tbody", {}, rows.map((d) => deliveryRow(d, names))),
            ),
          )
        : emptyState("Nothing sent yet", "Deliveries and test messages show here."),
    );
  }

  async function load() {
    let items;
    try {
      items = await get("/api/notifications/targets");
    } catch (e) {
      replace(listEl, emptyState("Notifications are not available", e.message || String(e)));
      return;
    }
    if (!alive) return;
    names = Object.fromEntries(items.map((t) => [t.id, t.name]));
    if (!items.length) {
      replace(listEl, emptyState("No targets", "Add a Slack, Discord or JSON webhook below."));
    } else {
      const rows = items.map((t) => {
        const result = h("span", { class: "hint", dataset: { testid: "test-result" } });
        const toggle = h("input", {
          type: "checkbox",
          dataset: { action: "toggle" },
          props: { checked: t.enabled },
          "aria-label": `${t.name} enabled`,
          on: {
            change: async () => {
              try {
                await patch(`/api/notifications/targets/${enc(t.id)}`, { enabled: toggle.checked });
              } catch (e) {
                banner(e.message || String(e), "error");
              }
              load();
            },
          },
        });
        const testBtn = button("Test", async () => {
          await busy(testBtn, async () => {
            const r = await post(`/api/notifications/targets/${enc(t.id)}/test`);
            result.textContent = outcome(r.delivery);
            result.dataset.state = r.delivery.state;
            await loadLog();
          });
        }, "btn btn-sm", { dataset: { action: "test" } });
        const delBtn = button("Remove", async () => {
          await busy(delBtn, async () => {
            await del(`/api/notifications/targets/${enc(t.id)}`);
            await load();
          });
        }, "btn btn-sm btn-ghost", { dataset: { action: "remove" } });
        const events = t.events.length === EVENTS.length ? "all" : t.events.join(", ");
        return h(
          "tr",
          { dataset: { target: t.name } },
          h("td", { dataset: { label: "Name" } }, h("strong", {}, t.name)),
          h("td", { dataset: { label: "Format" } }, t.format),
          h("td", { class: "mono", dataset: { label: "URL" } }, t.url),
          h("td", { dataset: { label: "Events" } }, events),
          h("td", { dataset: { label: "Workspaces" } }, t.workspaces ? t.workspaces.join(", ") : "all"),
          h("td", { dataset: { label: "Enabled" } }, toggle),
          h("td", { class: "actions" }, testBtn, delBtn, result),
        );
      });
      replace(
        listEl,
        h(
          "div",
          { class: "card table-wrap" },
          h(
            "table",
            { class: "agents stacked targets-table" },
            h("thead", {}, h("tr", {}, ["Name", "Format", "URL", "Events", "Workspaces", "Enabled", ""].map((c) => h("th", {}, c)))),
            h("tbody", {}, rows),
          ),
        ),
      );
    }
    await loadLog();
  }

  root.append(
    h(
      "section",
      { class: "page-head" },
      h("div", {}, h("h1", {}, "Notifications"), h("p", { class: "page-sub" }, "Tell Slack, Discord or any webhook when a decision is pending, a run ends or a budget stops an agent.")),
    ),
    listEl,
    h("h2", { class: "section-title" }, "Recent deliveries"),
    logEl,
    h("h2", { class: "section-title" }, "New target"),
    addForm(load),
  );
  replace(listEl, emptyState("Loading…", ""));
  load();
  const timer = setInterval(load, 15000);
  return () => {
    alive = false;
    clearInterval(timer);
  };
}
