/**
 * The JSON API as the page calls it: same-origin fetch with the session cookie,
 * the CSRF header Django wants on unsafe methods, and errors as `ApiError`s that
 * carry the status and the server's JSON body (docs/architecture.md §5).
 */

/** The `csrftoken` cookie (Django's default name); empty if absent. */
export function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

export class ApiError extends Error {
  /**
   * @param {number} status HTTP status, or 0 when the request never got an answer
   * @param {object|null} body the parsed JSON body, if any
   */
  constructor(status, body, message) {
    super(message || describe(status, body));
    this.name = "ApiError";
    this.status = status;
    this.body = body;
  }

  get offline() {
    return this.status === 0;
  }

  /**
   * The per-user limit a 429 names ("runs_per_minute", "sessions", "streams",
   * "requests"; docs/security.md, "Limits"), or null for any other error.
   */
  get limit() {
    if (this.status !== 429) return null;
    return (this.body && this.body.limit) || "requests";
  }
}

function describe(status, body) {
  if (!body && status === 429) return "too many requests; try again in a minute";
  if (!body) return status ? `HTTP ${status}` : "network error";
  if (typeof body.error === "string") return body.error;
  if (typeof body.detail === "string") return body.detail;
  // DRF validation errors: {field: ["message", ...], ...}
  const parts = Object.entries(body).map(
    ([field, value]) => `${field}: ${Array.isArray(value) ? value.join(" ") : value}`,
  );
  return parts.join("; ") || `HTTP ${status}`;
}

/**
 * Call the API and return the parsed JSON (null for an empty answer).
 * @param {string} url
 * `file` sends a Blob (a file the user picked) as the request body, as it is;
 * `form` sends a FormData (multipart, its boundary set by the browser).
 * @param {{method?: string, body?: object, file?: Blob, form?: FormData,
 *   headers?: object, signal?: AbortSignal}} options
 */
export async function api(
  url,
  { method = "GET", body, file, form, headers = {}, signal } = {},
) {
  const init = {
    method,
    credentials: "same-origin",
    headers: { Accept: "application/json", ...headers },
    signal,
  };
  if (method !== "GET" && method !== "HEAD") {
    init.headers["X-CSRFToken"] = csrfToken();
  }
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  } else if (file !== undefined) {
    init.headers["Content-Type"] = file.type || "application/octet-stream";
    init.body = file;
  } else if (form !== undefined) {
    init.body = form;
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, null, "network error: the server could not be reached");
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null; // an HTML error page (a proxy's, say): report the status only
    }
  }
  if (response.status === 401 || response.status === 403) {
    if (data && /credentials|authenticat/i.test(describe(response.status, data))) {
      window.location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
    }
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

/** A fresh Idempotency-Key for one user action (reused if its POST is retried). */
export function newIdempotencyKey() {
  if (window.crypto && typeof window.crypto.randomUUID === "function") {
    return window.crypto.randomUUID();
  }
  const bytes = new Uint8Array(16);
  window.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export const urls = {
  sessions: (query = "") =>
    query ? `/api/sessions/?q=${encodeURIComponent(query)}` : "/api/sessions/",
  session: (id) => `/api/sessions/${id}/`,
  search: (query) => `/api/search/?q=${encodeURIComponent(query)}`,
  messages: (id) => `/api/sessions/${id}/messages/`,
  // The active branch only: what the conversation pane draws.
  activeBranch: (id) => `/api/sessions/${id}/messages/?branch=active`,
  select: (id, messageId) => `/api/sessions/${id}/messages/${messageId}/select/`,
  runs: (sessionId) => `/api/sessions/${sessionId}/runs/`,
  // Queue and steer: messages typed while a run streams (chat.pending).
  pending: (sessionId) => `/api/sessions/${sessionId}/pending/`,
  pendingOne: (sessionId, id) => `/api/sessions/${sessionId}/pending/${id}/`,
  run: (runId) => `/api/runs/${runId}/`,
  cancel: (runId) => `/api/runs/${runId}/cancel/`,
  approval: (runId) => `/api/runs/${runId}/approval/`,
  events: (runId) => `/api/runs/${runId}/events/`,
  eventsJson: (runId, afterSeq) => `/api/runs/${runId}/events.json?after_seq=${afterSeq}`,
  exportAs: (id, kind) => `/api/sessions/${id}/export/?as=${kind}`,
  importSession: () => "/api/sessions/import/",
  models: () => "/api/models/",
  attachments: () => "/api/attachments/",
  attachment: (id) => `/api/attachments/${id}/`,
  notifications: () => "/api/stream/",
};
