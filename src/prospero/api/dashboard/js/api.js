// HTTP client for prosperod's API: JSON in and out, the `{error, kind}` envelope turned into
// ApiError, and the sign-in session. A 401 asks the page to sign in (once for all concurrent
// requests): the token is POSTed to /api/session, which answers with an HttpOnly, SameSite=Strict
// session cookie; the page never keeps the token. Every request carries `X-Prospero-Client:
// dashboard` (prosperod refuses state changes that a cross-site page could have sent).

const CLIENT_HEADERS = { "X-Prospero-Client": "dashboard" };

let unauthorizedHandler = null;
let pendingAuth = null;

export class ApiError extends Error {
  constructor(status, message, kind = "") {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

/** fn(reason: string) -> Promise<boolean>: true once the user has signed in. */
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

async function readBody(resp) {
  const text = await resp.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** Exchange a token for the session cookie. Resolves on success; throws ApiError (401 wrong
 *  token, 429 too many attempts, ...). */
export async function signIn(token) {
  let resp;
  try {
    resp = await fetch("/api/session", {
      method: "POST",
      headers: { ...CLIENT_HEADERS, Accept: "application/json", "Content-Type": "application/json" },
      body: JSON.stringify({ token }),
      cache: "no-store",
      credentials: "same-origin",
    });
  } catch {
    throw new ApiError(0, "prosperod is unreachable", "network");
  }
  if (resp.status === 204) return;
  const data = await readBody(resp);
  throw new ApiError(resp.status, errorMessage(resp.status, data), (data && data.kind) || "");
}

/** Clear the session cookie. */
export async function signOut() {
  await fetch("/api/session", {
    method: "DELETE",
    headers: { ...CLIENT_HEADERS },
    cache: "no-store",
    credentials: "same-origin",
  });
}

/** {name, scope, via} of the current credentials, or null when signed out. */
export async function whoami() {
  try {
    const resp = await fetch("/api/session", {
      headers: { ...CLIENT_HEADERS, Accept: "application/json" },
      cache: "no-store",
      credentials: "same-origin",
    });
    return resp.ok ? await resp.json() : null;
  } catch {
    return null;
  }
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
    const headers = { ...CLIENT_HEADERS, Accept: "application/json" };
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
    const data = await readBody(resp);
    if (resp.status === 401 && attempt < 6) {
      if (await authenticate(errorMessage(401, data))) continue;
      throw new ApiError(401, "sign in with an API token to use this dashboard", "unauthorized");
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
export const patch = (path, body) => request("PATCH", path, body);
export const del = (path) => request("DELETE", path);

export const enc = encodeURIComponent;

/** URL of an SSE endpoint with the resume cursor (the session cookie authenticates it). */
export function streamUrl(path, from) {
  const at = path.indexOf("?");
  const base = at < 0 ? path : path.slice(0, at);
  const params = new URLSearchParams(at < 0 ? "" : path.slice(at + 1));
  params.set("from", String(from));
  return `${base}?${params.toString()}`;
}
