/**
 * How runs read on the page. The journal and the API keep their machine names
 * (`cancelled-by-user`, `Retry attempt: stream-resume 1/3; body cut`,
 * `rate_limit`; docs/architecture.md §3); the page says what happened in words,
 * and keeps the machine name in a tooltip for whoever reports a problem.
 */

/** A finished run by its terminal state; the status decides when the state is new. */
const TERMINAL_STATES = {
  "cancelled-by-user": "Stopped",
  "worker-shutdown": "Interrupted: the server restarted during this answer",
  "lost-worker": "Interrupted: the process writing this answer stopped responding",
  "worker-error": "Failed: something went wrong on the server",
  "provider-error": "Failed: the model could not finish this answer",
  "database-unavailable": "Failed: the database was out of reach",
  "settled-by-admin": "Ended by an administrator",
  "step-limit": "Stopped: the answer reached its limit of model steps",
  "tool-call-limit": "Stopped: the answer reached its limit of tool calls",
  "token-limit": "Stopped: the answer used up its token budget",
  "time-limit": "Stopped: the answer reached its time limit",
  "output-limit": "Cut off: the answer reached its output limit",
  "journal-backlog": "Failed: the model wrote faster than its answer could be stored",
};

const STATUSES = {
  queued: "Waiting to start",
  running: "Answering",
  completed: "Completed",
  failed: "Failed",
  cancelled: "Stopped",
  interrupted: "Interrupted",
};

/** Error categories of docs/architecture.md §6, as a heading of the error. */
const CATEGORIES = {
  network: "Connection to the model lost",
  timeout: "The model took too long",
  rate_limit: "The model's rate limit was reached",
  provider: "The model's service failed",
  auth: "The model's service refused our credentials",
  invalid_request: "The model's service refused the request",
  cancelled: "Stopped",
  database: "The database was out of reach",
  limit: "The answer reached one of its limits",
};

const RESUME = /^Retry attempt: stream-resume (\d+)\/(\d+)(?:; (.*))?$/;

/** The footer's outcome of a run that did not complete. */
export function outcomeText(status, terminalState) {
  return TERMINAL_STATES[terminalState] || STATUSES[status] || humanise(status || "ended");
}

/** A journaled `status` message, as a sentence. */
export function statusText(message) {
  const resume = RESUME.exec(message || "");
  if (!resume) return message || "";
  const [, attempt, limit, reason] = resume;
  const why = reason ? ` (${reason})` : "";
  return `The connection to the model dropped${why}; continuing the answer, attempt ${attempt} of ${limit}.`;
}

/** The mark drawn in an answer where a cut stream was asked for again. */
export function resumeText(message) {
  const resume = RESUME.exec(message || "");
  const why = resume && resume[3] ? ` (${resume[3]})` : "";
  return (
    `The connection to the model dropped here${why} and the answer was asked ` +
    "for again. If it starts over, use Regenerate."
  );
}

/** The heading of a run's error, by its category. */
export function categoryText(category) {
  return CATEGORIES[category] || humanise(category || "error");
}

function humanise(name) {
  const words = String(name).replace(/[-_]+/g, " ").trim();
  return words.charAt(0).toUpperCase() + words.slice(1);
}
