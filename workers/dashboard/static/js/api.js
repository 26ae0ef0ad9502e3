// The JSON API client: relative URLs (the app may be mounted under a prefix), the
// token from sessionStorage in a header (never in a URL), JSON bodies on POST.

const TOKEN_KEY = "chronoq.token";

/** An error answer of the API: status, the ChronoqError class name, its message. */
export class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

/**
 * Call the API: GET when body is undefined, else POST with a JSON body.
 * A 401 also fires "chronoq:unauthorized" on window (the app shows the sign-in form).
 * @throws {ApiError} on any non-2xx answer or a network failure.
 */
export async function api(path, body) {
  const headers = { Accept: "application/json" };
  const t = token.get();
  if (t) headers["X-Chronoq-Token"] = t;
  const init = { method: "GET", headers, credentials: "omit", cache: "no-store" };
  if (body !== undefined) {
    init.method = "POST";
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, "NetworkError", `The dashboard server did not answer (${e.message}).`);
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null; // an empty or non-JSON body: described by the status below
  }
  if (!response.ok) {
    const kind = (data && data.error) || `HTTP ${response.status}`;
    const message = (data && data.message) || response.statusText || "request failed";
    const error = new ApiError(response.status, kind, message);
    if (response.status === 401) window.dispatchEvent(new CustomEvent("chronoq:unauthorized", { detail: error }));
    throw error;
  }
  return data;
}

/** path + "?" + the non-empty entries of query. */
export function withQuery(path, query) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v !== null && v !== undefined && v !== "") params.set(k, String(v));
  }
  const qs = params.toString();
  return qs ? `${path}?${qs}` : path;
}
