// Keyboard shortcuts. Generic, driven by the page's markup so every view gets them:
//   j / k      next / previous item ([data-nav-item]: fleet rows, decision cards, timeline
//              entries), focused and scrolled into view
//   Enter / o  open the focused item (an agent row, a tool call into the inspector)
//   a / d      answer the focused permission request: allow once / reject once
//   /          focus the page's search ([data-search]: the fleet filter, transcript search)
//   n / N      next / previous transcript match
//   g f, g a, g u, g n   go to the fleet, approvals, usage, new agent
//   ?          this help;  Esc  close it / the inspector, leave a search box
// Keys typed into a form field, with Ctrl/Alt/Meta, or under a modal dialog are left alone.

import { h } from "./dom.js";

export const SHORTCUTS = [
  ["j / k", "Next / previous item (agents, approvals, timeline entries)"],
  ["Enter or o", "Open the focused item"],
  ["a / d", "Allow once / reject once the focused permission request"],
  ["/", "Search (fleet filter, transcript search)"],
  ["n / N", "Next / previous transcript match"],
  ["g then f, a, u, n", "Go to fleet, approvals, usage, new agent"],
  ["Esc", "Close the inspector or this help, leave a search box"],
  ["?", "Show this help"],
];

const GOTO = { f: "#/", a: "#/approvals", u: "#/usage", n: "#/spawn" };

let viewHandler = null;
let pendingG = 0;
let help = null;

/** A view's own keys: `fn(key, event)` returns true when it handled the key. Returns the
 *  function that removes it (call it on unmount). */
export function setViewKeys(fn) {
  viewHandler = fn;
  return () => {
    if (viewHandler === fn) viewHandler = null;
  };
}

function typing(el) {
  return !!el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
}

function visible(el) {
  return el.getClientRects().length > 0 && !el.closest("[hidden], details:not([open]) > :not(summary)");
}

export function navItems(root = document.getElementById("view")) {
  return root ? [...root.querySelectorAll("[data-nav-item]")].filter(visible) : [];
}

function move(dir) {
  const items = navItems();
  if (!items.length) return false;
  const cur = document.activeElement?.closest?.("[data-nav-item]");
  let i = items.indexOf(cur);
  if (i < 0) {
    // From where the reader is: the first item below the top of the viewport.
    i = items.findIndex((el) => el.getBoundingClientRect().bottom > 64);
    i = i < 0 ? 0 : dir > 0 ? i : Math.max(0, i - 1);
  } else i = Math.min(items.length - 1, Math.max(0, i + dir));
  const el = items[i];
  el.focus({ preventScroll: true });
  el.scrollIntoView({ block: "nearest" });
  return true;
}

function activate() {
  const item = document.activeElement?.closest?.("[data-nav-item]");
  if (!item) return false;
  const primary = item.querySelector("[data-primary], .tool-row, .agent-link");
  (primary || item).click();
  return true;
}

function answer(key) {
  const card = document.activeElement?.closest?.("[data-decision-id]");
  return !!(card && typeof card.answerKey === "function" && card.answerKey(key));
}

export function toggleHelp() {
  if (help) {
    help.close();
    return;
  }
  const dlg = h(
    "dialog",
    { class: "modal keys-help", "aria-label": "Keyboard shortcuts" },
    h(
      "div",
      { class: "modal-body" },
      h("h2", { class: "modal-title" }, "Keyboard shortcuts"),
      h("dl", { class: "keys-list" }, SHORTCUTS.map(([k, what]) => h("div", { class: "keys-row" }, h("dt", {}, h("kbd", {}, k)), h("dd", {}, what)))),
      h("div", { class: "modal-actions" }, h("button", { type: "button", class: "btn", on: { click: () => dlg.close() } }, "Close")),
    ),
  );
  dlg.addEventListener("close", () => {
    dlg.remove();
    help = null;
  });
  document.body.append(dlg);
  help = dlg;
  dlg.showModal();
}

function onKey(e) {
  if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey) return;
  const key = e.key;
  if (typing(e.target)) {
    if (key === "Escape") e.target.blur();
    return;
  }
  if (help) {
    if (key === "?") {
      e.preventDefault();
      toggleHelp();
    }
    return; // the dialog handles Esc itself
  }
  if (document.querySelector("dialog[open]")) return;
  if (pendingG && Date.now() - pendingG < 1500 && GOTO[key]) {
    pendingG = 0;
    e.preventDefault();
    location.hash = GOTO[key];
    return;
  }
  pendingG = 0;
  let done = false;
  if (viewHandler && viewHandler(key, e)) done = true;
  else if (key === "?") {
    toggleHelp();
    done = true;
  } else if (key === "/") {
    const box = document.querySelector("#view [data-search]");
    if (box) {
      box.focus();
      box.select?.();
      done = true;
    }
  } else if (key === "j") done = move(1);
  else if (key === "k") done = move(-1);
  else if (key === "Enter" || key === "o") done = key === "o" ? activate() : !!document.activeElement?.matches?.("[data-nav-item]") && activate();
  else if (key === "a" || key === "d") done = answer(key);
  else if (key === "g") {
    pendingG = Date.now();
    done = true;
  }
  if (done) e.preventDefault();
}

export function installKeys() {
  document.addEventListener("keydown", onKey);
}
