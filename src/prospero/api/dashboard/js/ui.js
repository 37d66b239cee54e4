// Shared UI pieces: status pills, banners, toasts, confirmation and token dialogs.

import { signIn } from "./api.js";
import { h, replace } from "./dom.js";

export function statusPill(status) {
  return h("span", { class: ["pill", `st-${status || "unknown"}`], dataset: { status } }, status || "?");
}

/** The agent's status, or "awaiting approval" while a permission request of a live agent
 *  waits for a human (its status alone reads running). */
export function agentPill(status, pending) {
  if (pending > 0 && !["killed", "done", "failed", "crashed"].includes(status)) {
    return h(
      "span",
      {
        class: ["pill", "st-awaiting"],
        dataset: { status, awaiting: String(pending) },
        title: `${status}: ${pending} permission request${pending === 1 ? "" : "s"} waiting for an answer`,
      },
      "awaiting approval",
    );
  }
  return statusPill(status);
}

export function healthPill(health) {
  const state = health?.state || "unknown";
  const attrs = { class: ["pill", `health-${state}`] };
  if (state === "unreachable" && health.reason) attrs.title = health.reason;
  return h("span", attrs, state);
}

export function tag(text, cls = "", title) {
  return h("span", { class: ["tag", cls], title }, text);
}

/** Clustered: which replica drives the agent (its lease holder); nothing when none does. */
export function ownerBadge(owner) {
  if (!owner) return null;
  return h(
    "span",
    { class: ["tag", "tag-owner"], title: `replica ${owner} holds this agent's lease`, dataset: { owner } },
    `driven by ${owner}`,
  );
}

export function button(label, onClick, cls = "btn", attrs = {}) {
  return h("button", { type: "button", class: cls, on: { click: onClick }, ...attrs }, label);
}

/** Run an async action with the button disabled; errors become a banner. */
export async function busy(btn, fn) {
  btn.disabled = true;
  btn.classList.add("is-busy");
  try {
    return await fn();
  } catch (e) {
    banner(e.message || String(e), "error");
    return undefined;
  } finally {
    btn.disabled = false;
    btn.classList.remove("is-busy");
  }
}

// ------------------------------------------------------------------------------ banners

export function banner(message, kind = "error", { timeout } = {}) {
  const host = document.getElementById("banners");
  if (!host) return null;
  const el = h(
    "div",
    { class: ["banner", `banner-${kind}`], role: kind === "error" ? "alert" : "status" },
    h("span", { class: "banner-text" }, message),
    h(
      "button",
      {
        type: "button",
        class: "banner-close",
        "aria-label": "Dismiss",
        on: { click: () => el.remove() },
      },
      "×",
    ),
  );
  host.append(el);
  while (host.children.length > 4) host.firstChild.remove();
  const ms = timeout ?? (kind === "error" ? 0 : 4000);
  if (ms) setTimeout(() => el.remove(), ms);
  return el;
}

export function clearBanners() {
  const host = document.getElementById("banners");
  if (host) replace(host);
}

// ------------------------------------------------------------------------------ dialogs

function modal(buildBody, { onClose } = {}) {
  const dlg = h("dialog", { class: "modal" });
  document.body.append(dlg);
  const close = (value) => {
    if (dlg.open) dlg.close();
    dlg.remove();
    if (onClose) onClose(value);
  };
  dlg.addEventListener("cancel", (e) => {
    e.preventDefault();
    close(false);
  });
  buildBody(dlg, close);
  dlg.showModal();
  return dlg;
}

/** Resolve true when the user confirms. */
export function confirmDialog({ title, message, confirmLabel = "Confirm", danger = false }) {
  return new Promise((resolve) => {
    modal(
      (dlg, close) => {
        const ok = h(
          "button",
          {
            type: "button",
            class: danger ? "btn btn-danger" : "btn btn-primary",
            dataset: { action: "confirm" },
            on: { click: () => close(true) },
          },
          confirmLabel,
        );
        dlg.append(
          h(
            "div",
            { class: "modal-body", role: "document" },
            h("h2", { class: "modal-title" }, title),
            h("p", { class: "modal-text" }, message),
            h(
              "div",
              { class: "modal-actions" },
              h(
                "button",
                {
                  type: "button",
                  class: "btn",
                  dataset: { action: "cancel" },
                  on: { click: () => close(false) },
                },
                "Cancel",
              ),
              ok,
            ),
          ),
        );
        setTimeout(() => ok.focus(), 0);
      },
      { onClose: resolve },
    );
  });
}

let tokenDialogOpen = null;

/** The sign-in form: the token is exchanged for prosperod's session cookie (POST /api/session)
 *  and never stored by the page. Resolves true once signed in, false when cancelled. */
export function tokenDialog(reason) {
  if (tokenDialogOpen) return tokenDialogOpen;
  tokenDialogOpen = new Promise((resolve) => {
    modal(
      (dlg, close) => {
        const input = h("input", {
          type: "password",
          id: "token-input",
          class: "input",
          autocomplete: "off",
          spellcheck: "false",
          placeholder: "pspo_…",
          required: true,
        });
        const error = h("p", { class: "form-error", role: "alert", hidden: true });
        const submit = h("button", { type: "submit", class: "btn btn-primary" }, "Sign in");
        const form = h(
          "form",
          {
            class: "modal-body",
            id: "token-form",
            on: {
              submit: async (e) => {
                e.preventDefault();
                const value = input.value.trim();
                if (!value) return;
                submit.disabled = true;
                error.hidden = true;
                try {
                  await signIn(value);
                  close(true);
                } catch (err) {
                  error.textContent =
                    err.status === 401 ? "Invalid token" : err.message || "Sign-in failed";
                  error.hidden = false;
                  input.select();
                } finally {
                  submit.disabled = false;
                }
              },
            },
          },
          h("h2", { class: "modal-title" }, "Sign in to prosperod"),
          h(
            "p",
            { class: "modal-text" },
            "This prosperod requires an API token (prospero token new). The dashboard exchanges " +
              "it for a session cookie and does not keep it.",
          ),
          reason && /expired|revoked/.test(reason)
            ? h("p", { class: "modal-text", id: "sign-in-reason" }, reason)
            : null,
          error,
          h("label", { class: "field" }, h("span", { class: "field-label" }, "Token"), input),
          h(
            "div",
            { class: "modal-actions" },
            h("button", { type: "button", class: "btn", on: { click: () => close(false) } }, "Cancel"),
            submit,
          ),
        );
        dlg.classList.add("token-dialog");
        dlg.append(form);
        setTimeout(() => input.focus(), 0);
      },
      {
        onClose: (v) => {
          tokenDialogOpen = null;
          resolve(v);
        },
      },
    );
  });
  return tokenDialogOpen;
}

export function emptyState(title, text, ...actions) {
  return h(
    "div",
    { class: "empty" },
    h("div", { class: "empty-title" }, title),
    text ? h("p", { class: "empty-text" }, text) : null,
    actions.length ? h("div", { class: "empty-actions" }, ...actions) : null,
  );
}

// A labelled form control, with an optional hint under it.
export function field(label, control, hint, cls = "") {
  return h(
    "label",
    { class: ["field", cls] },
    h("span", { class: "field-label" }, label),
    control,
    hint ? h("span", { class: "hint" }, hint) : null,
  );
}

export function kv(label, value, cls = "") {
  return h("div", { class: ["kv", cls] }, h("dt", {}, label), h("dd", {}, value));
}
