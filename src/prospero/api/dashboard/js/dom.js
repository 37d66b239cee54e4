// Safe DOM construction. Everything that comes from the API (agent output above all) is
// untrusted: it only ever reaches the page as text nodes, `textContent`, form values or
// attribute values set with setAttribute: never parsed as markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function setAttr(el, key, value) {
  if (value === undefined || value === null || value === false) return;
  if (/^on/i.test(key) || key === "style" || key === "srcdoc") {
    throw new Error(`refusing to set attribute ${key}`);
  }
  if ((key === "href" || key === "src" || key === "action") && !isSafeUrl(String(value))) {
    throw new Error(`refusing unsafe ${key}`);
  }
  el.setAttribute(key, value === true ? "" : String(value));
}

// Only in-app links: hash routes and same-origin absolute paths.
export function isSafeUrl(url) {
  return url.startsWith("#") || (url.startsWith("/") && !url.startsWith("//"));
}

/** An absolute http(s) or mailto URL, normalised; null for anything else (javascript:,
 *  data:, relative or malformed URLs, URLs with spaces or control characters). */
export function safeExternalUrl(url) {
  const raw = String(url ?? "").trim();
  if (!/^(https?:\/\/|mailto:)/i.test(raw) || /[\u0000-\u0020\u007f]/.test(raw)) return null;
  try {
    const u = new URL(raw);
    return ["http:", "https:", "mailto:"].includes(u.protocol) ? u.href : null;
  } catch {
    return null;
  }
}

/** A link out of the dashboard (agent text's links): opened in a new tab without referrer or
 *  opener; null when `url` is not a safe external URL (the caller shows the text instead). */
export function externalLink(url, title, children) {
  const href = safeExternalUrl(url);
  if (!href) return null;
  const el = document.createElement("a");
  el.setAttribute("href", href);
  el.setAttribute("rel", "noopener noreferrer nofollow");
  el.setAttribute("target", "_blank");
  el.setAttribute("class", "ext-link");
  if (title) el.setAttribute("title", String(title));
  return append(el, [children]);
}

function build(el, attrs, children) {
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (key === "class") {
        if (Array.isArray(value)) el.classList.add(...value.filter(Boolean));
        else if (value) el.setAttribute("class", value);
      } else if (key === "text") {
        el.textContent = value == null ? "" : String(value);
      } else if (key === "on") {
        for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
      } else if (key === "dataset") {
        for (const [k, v] of Object.entries(value)) if (v != null) el.dataset[k] = String(v);
      } else if (key === "props") {
        for (const [k, v] of Object.entries(value)) {
          if (/html/i.test(k) || /^on/i.test(k)) throw new Error(`refusing property ${k}`);
          el[k] = v; // value, checked, disabled, open, ... (DOM properties)
        }
      } else {
        setAttr(el, key, value);
      }
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** h("div", {class: "x", on: {click}}, "text", child) */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function replace(el, ...children) {
  clear(el);
  return append(el, children);
}

export function $(sel, root = document) {
  return root.querySelector(sel);
}

/** Make `parent`'s children exactly `nodes`, in order, moving only what must move (a node that
 *  stays keeps its focus and state). */
export function reconcile(parent, nodes) {
  const keep = new Set(nodes);
  for (const child of [...parent.childNodes]) if (!keep.has(child)) child.remove();
  nodes.forEach((node, i) => {
    if (parent.childNodes[i] !== node) parent.insertBefore(node, parent.childNodes[i] || null);
  });
}
