// HTTP client for prosperod's API: JSON in and out, the `{error, kind}` envelope turned into
// ApiError, and bearer tokens. A 401 asks the page for a token (once for all concurrent
// requests), keeps it in this tab's sessionStorage and retries.

const TOKEN_KEY = "prospero.token";

let unauthorizedHandler = null;
let pendingAuth = null;

export class ApiError extends Error {
  constructor(status, message, kind = "") {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

export function getToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return "";
  }
}

export function setToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    /* storage disabled: the token lives only as long as this page */
  }
}

/** fn(reason: "missing" | "invalid") -> Promise<boolean>: true once a new token is stored. */
export function onUnauthorized(fn) {
  unauthorizedHandler = fn;
}

export function authenticate(reason) {
  if (!unauthorizedHandler) return Promise.resolve(false);
  if (!pendingAuth) {
    pendingAuth = Promise.resolve(unauthorizedHandler(reason)).finally(() => {
      pendingAuth = null;
    });
  }
  return pendingAuth;
}

function errorMessage(status, data) {
  if (data && typeof data === "object") {
    if (typeof data.error === "string" && data.error) return data.error;
    if (data.detail !== undefined) {
      if (typeof data.detail === "string") return data.detail;
      if (Array.isArray(data.detail)) {
        return data.detail
          .map((d) => `${(d.loc || []).slice(1).join(".") || "body"}: ${d.msg || ""}`)
          .join("; ");
      }
    }
  }
  if (typeof data === "string" && data) return data.slice(0, 300);
  return `HTTP ${status}`;
}

export async function request(method, path, body) {
  for (let attempt = 0; ; attempt += 1) {
    const token = getToken();
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, cache: "no-store", credentials: "same-origin" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch {
      throw new ApiError(0, "prosperod is unreachable", "network");
    }
    if (resp.status === 401 && attempt < 6) {
      if (getToken() !== token) continue; // someone entered a new token meanwhile
      if (await authenticate(token ? "invalid" : "missing")) continue;
      throw new ApiError(401, "an API token is required", "unauthorized");
    }
    const text = await resp.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = text;
      }
    }
    if (!resp.ok) {
      throw new ApiError(resp.status, errorMessage(resp.status, data), (data && data.kind) || "");
    }
    return data;
  }
}

export const get = (path) => request("GET", path);
export const post = (path, body) => request("POST", path, body);
export const put = (path, body) => request("PUT", path, body);
export const del = (path) => request("DELETE", path);

export const enc = encodeURIComponent;

/** URL of an SSE endpoint with the resume cursor and, when set, the token as a query param
 *  (EventSource cannot send headers; prosperod accepts ?access_token= on its two streams). */
export function streamUrl(path, from) {
  const at = path.indexOf("?");
  const base = at < 0 ? path : path.slice(0, at);
  const params = new URLSearchParams(at < 0 ? "" : path.slice(at + 1));
  params.set("from", String(from));
  const token = getToken();
  if (token) params.set("access_token", token);
  return `${base}?${params.toString()}`;
}
