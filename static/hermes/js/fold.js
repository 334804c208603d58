/**
 * One fold of a run's journal, the page's copy of `journal/fold.py` (the rules
 * are written there; docs/architecture.md §3 "The folded turn"). No DOM here:
 * `TurnView` draws what this folds, and a browser test feeds this module and
 * the Python fold the same journals and compares the results.
 *
 * `parts` keep journal order (text and reasoning segments, tool cards completed
 * in place, `steer` parts: a person's message where it landed, `resume` parts
 * where a cut answer was asked for again), `statuses` in order, `usage` added up, the last `error` (else the
 * `end`'s), `end`, the `start`'s model and the highest seq folded.
 */

/** `journal.events.RESUME_STATUS`: a status that begins so is a resume. */
export const RESUME_STATUS = "Retry attempt: stream-resume";

function isNumber(value) {
  return typeof value === "number";
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** `total` with `more` added: numbers add, nested objects merge, others replace. */
export function usageSum(total, more) {
  if (more === null || more === undefined) return total;
  const out = { ...(total || {}) };
  for (const [key, value] of Object.entries(more)) {
    const old = out[key];
    if (isObject(value) && isObject(old)) out[key] = usageSum(old, value);
    else if (isNumber(value) && isNumber(old)) out[key] = old + value;
    else if (value !== null || !(key in out)) out[key] = value;
  }
  return out;
}

export class Fold {
  constructor() {
    this.parts = [];
    this.statuses = [];
    this.usage = null;
    this.error = null;
    this.model = null;
    this.end = null;
    this.lastSeq = 0;
    this.tools = new Map(); // tool_call_id -> its part
    this.errorEvent = false;
  }

  /** A fold that goes on from a turn already folded (a session's snapshot). */
  static fromSnapshot({ parts = [], statuses = [], lastSeq = 0 }) {
    const fold = new Fold();
    for (const part of parts) {
      const copy = { ...part };
      fold.parts.push(copy);
      if (copy.kind === "tool") fold.tools.set(copy.tool_call_id, copy);
    }
    fold.statuses.push(...statuses);
    fold.lastSeq = lastSeq;
    return fold;
  }

  /** Fold one event; the part it created or changed, if any. */
  add(type, data, seq = 0) {
    this.lastSeq = Math.max(this.lastSeq, seq);
    switch (type) {
      case "token":
        return this.#append("text", data.text || "");
      case "reasoning":
        return this.#append("reasoning", data.text || "");
      case "tool":
        return this.#tool(data);
      case "tool_complete":
        return this.#complete(data);
      case "approval_request":
      case "approval":
        return this.#approval(type, data);
      case "steer": {
        const part = { kind: "steer", text: data.text || "" };
        this.parts.push(part);
        return part;
      }
      case "status": {
        const message = data.message ?? "";
        this.statuses.push(message);
        if (!message.startsWith(RESUME_STATUS)) break;
        // The answer was cut and asked for again: mark where it went on.
        const part = { kind: "resume", text: message };
        this.parts.push(part);
        return part;
      }
      case "usage":
        this.usage = usageSum(this.usage, data);
        break;
      case "error":
        this.error = data;
        this.errorEvent = true;
        break;
      case "end":
        this.end = data;
        if (!this.errorEvent && data.error) this.error = data.error;
        break;
      case "start":
        this.model = data.model || this.model;
        break;
      default:
        break;
    }
    return null;
  }

  get text() {
    return this.parts
      .filter((p) => p.kind === "text")
      .map((p) => p.text)
      .join("");
  }

  /** The folded turn as plain data, the shape `Fold.turn()` has in Python. */
  turn() {
    return {
      parts: this.parts.map((p) => ({ ...p })),
      statuses: [...this.statuses],
      usage: this.usage,
      error: this.error,
      model: this.model,
      end: this.end,
      last_seq: this.lastSeq,
    };
  }

  #append(kind, text) {
    if (!text) return null;
    const last = this.parts[this.parts.length - 1];
    if (last && last.kind === kind) {
      last.text += text;
      return last;
    }
    const part = { kind, text };
    this.parts.push(part);
    return part;
  }

  #tool(data) {
    const id = data.tool_call_id;
    if (this.tools.has(id)) return null;
    const part = {
      kind: "tool",
      tool_call_id: id,
      name: data.name ?? "",
      args: data.args ?? "",
      result: null,
      is_error: false,
      duration_ms: null,
    };
    this.tools.set(id, part);
    this.parts.push(part);
    return part;
  }

  #approval(type, data) {
    const part =
      this.tools.get(data.tool_call_id) || this.#tool({ ...data, args: data.args ?? "" });
    const state = type === "approval_request" ? "pending" : data.decision;
    part.approval = { state, note: data.note ?? "" };
    return part;
  }

  #complete(data) {
    const part = this.tools.get(data.tool_call_id) || this.#tool({ ...data, args: "" });
    part.result = data.result ?? "";
    part.is_error = Boolean(data.is_error);
    part.duration_ms = data.duration_ms ?? null;
    return part;
  }
}

/** Fold a whole journal: `[{event, data, seq}]` (the `events.json` shape). */
export function foldEvents(events) {
  const fold = new Fold();
  for (const { event, data, seq } of events) fold.add(event, data, seq);
  return fold.turn();
}
