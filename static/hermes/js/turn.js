/**
 * The DOM of one assistant turn (one run): reasoning in a collapsible
 * <details>, text segments rendered as sanitised Markdown, tool cards with
 * arguments and results, steers (a person's message sent into the run, drawn
 * where it landed), status receipts ("Retry attempt: …"), the error with
 * its category, and a footer with the outcome, usage and tokens/s.
 *
 * What the turn shows is the run's fold (`fold.js`): live events, a
 * snapshot's parts and the saved messages of the run all go through it, and
 * its parts (text segments, reasoning, tool cards) are drawn in the order it
 * keeps, which is journal order. So a tool card sits where the model called
 * it, whether the turn was drawn live, from a snapshot after a reload, or
 * from the saved messages afterwards.
 * Model output only ever reaches the page through `renderMarkdown` (sanitised)
 * or `textContent`.
 */
import { api, urls } from "./api.js";
import { Fold, RESUME_STATUS } from "./fold.js";
import { renderMarkdown } from "./markdown.js";
import { categoryText, outcomeText, resumeText, statusText } from "./wording.js";

const RENDER_INTERVAL_MS = 50; // re-render streaming Markdown at most this often
const HIGHLIGHT_LIVE_CHARS = 20000; // above this, highlight code only when idle

function el(tag, className, testid) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (testid) node.dataset.testid = testid;
  return node;
}

function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

export class TurnView {
  /** @param {string|null} runId */
  constructor(runId) {
    this.runId = runId;
    this.root = el("article", "msg assistant", "assistant-turn");
    if (runId) this.root.dataset.runId = runId;
    this.body = el("div", "turn-body");
    this.receipts = el("ul", "receipts", "status-list");
    this.receipts.hidden = true;
    this.stepItem = null; // the receipt showing the step in progress
    this.errorBox = el("div", "run-error", "run-error");
    this.errorBox.hidden = true;
    this.meta = el("footer", "run-meta", "run-meta");
    this.root.append(this.body, this.receipts, this.errorBox, this.meta);
    this.fold = new Fold();
    this.drawn = new Map(); // part of the fold -> its nodes
    this.renderTimer = null;
    this.dirty = new Set();
    this.decorated = false; // the run's outcome (status, usage, error) is shown
  }

  /** Mark the turn as streaming (a caret, `data-streaming` for tests and CSS). */
  setStreaming(streaming) {
    this.root.dataset.streaming = streaming ? "true" : "false";
    if (!streaming) this.flush();
  }

  /**
   * Go on from a session snapshot's folded turn: its parts drawn in their
   * order, its statuses listed; live events after its `last_seq` fold onto it.
   */
  drawSnapshot({ parts, statuses, last_seq: lastSeq }) {
    this.fold = Fold.fromSnapshot({ parts, statuses, lastSeq });
    for (const part of this.fold.parts) this.#draw(part);
    for (const message of this.fold.statuses) this.addStatus(message);
  }

  /** Fold one event and draw the part it created or changed. */
  apply(type, data, seq = 0) {
    const part = this.fold.add(type, data, seq);
    if (part) this.#draw(part);
    return part;
  }

  /** The nodes of `part`: made (at the end, where the fold put it) or updated. */
  #draw(part) {
    let drawn = this.drawn.get(part);
    if (!drawn) {
      drawn = this.#make(part);
      this.drawn.set(part, drawn);
      this.body.append(drawn.root);
    }
    if (part.kind === "text") {
      this.#schedule(drawn);
    } else if (part.kind === "reasoning" || part.kind === "steer") {
      drawn.body.textContent = part.text;
    } else if (part.kind === "resume") {
      drawn.root.textContent = resumeText(part.text);
      drawn.root.title = part.text; // the journal's own words
    } else {
      this.#drawTool(part, drawn);
    }
  }

  #make(part) {
    if (part.kind === "text") {
      const node = el("div", "md", "assistant-text");
      return { root: node, node, part };
    }
    if (part.kind === "resume") {
      const mark = el("p", "resume-mark", "resume-mark");
      mark.setAttribute("role", "note");
      return { root: mark };
    }
    if (part.kind === "steer") {
      const box = el("div", "steer-part", "steer");
      const label = el("span", "steer-label");
      label.textContent = "You steered";
      const body = el("div", "steer-text", "steer-text"); // the user's words, as text
      box.append(label, body);
      return { root: box, body };
    }
    if (part.kind === "reasoning") {
      const details = el("details", "reasoning", "reasoning");
      const summary = el("summary");
      summary.textContent = "Reasoning";
      const body = el("div", "reasoning-text", "reasoning-text");
      details.append(summary, body);
      return { root: details, body };
    }
    const card = el("details", "tool-card", "tool-card");
    card.dataset.toolCallId = part.tool_call_id;
    const summary = el("summary", "tool-head");
    const label = el("span", "tool-name", "tool-name");
    const state = el("span", "tool-state", "tool-state");
    summary.append(label, state);
    const argsBox = el("pre", "tool-args", "tool-args");
    const resultBox = el("pre", "tool-result", "tool-result");
    const approvalBox = el("div", "tool-approval", "tool-approval");
    approvalBox.hidden = true;
    card.append(summary, argsBox, approvalBox, resultBox);
    return { root: card, label, state, argsBox, approvalBox, resultBox };
  }

  #drawTool(part, { root, label, state, argsBox, approvalBox, resultBox }) {
    const done = part.result !== null && part.result !== undefined;
    const ms = part.duration_ms;
    const approval = part.approval || null;
    label.textContent = part.name;
    argsBox.textContent = prettyJson(part.args || "");
    const denied = done && approval !== null && approval.state === "deny";
    root.dataset.state = !done ? "running" : denied ? "denied" : part.is_error ? "error" : "done";
    root.dataset.approval = approval ? approval.state : "";
    this.#drawApproval(approval, approvalBox, done, part.tool_call_id);
    if (approval && approval.state === "pending" && !done) {
      root.open = true; // the arguments are what a person decides on
      state.textContent = "waiting for approval";
    } else if (!done) state.textContent = "running…";
    else if (denied) state.textContent = "denied";
    else if (part.is_error) state.textContent = "failed";
    else state.textContent = ms != null ? `done · ${Math.round(ms)} ms` : "done";
    resultBox.hidden = !done;
    resultBox.textContent = done ? prettyJson(part.result) : "";
  }

  /**
   * A pending call: a note and three choices, each sent once to the API; the
   * decision itself is drawn when its journaled `approval` event arrives.
   * A decided call: what was decided, and the note.
   */
  #drawApproval(approval, box, done, callId) {
    box.hidden = !approval;
    if (!approval) return;
    if (approval.state !== "pending") {
      const line = el("p", "approval-decision", "approval-decision");
      const said = approval.state === "approve" ? "Approved" : "Denied";
      line.textContent = approval.note ? `${said}: ${approval.note}` : said;
      box.replaceChildren(line);
      return;
    }
    if (done || box.dataset.pending === "true") return;
    box.dataset.pending = "true";
    const note = el("input", "approval-note", "approval-note");
    note.type = "text";
    note.placeholder = "Note (optional)";
    note.maxLength = 2000;
    const buttons = [
      ["approve", "Approve", "primary"],
      ["always", "Always allow in this chat", ""],
      ["deny", "Deny", "danger"],
    ].map(([decision, text, kind]) => {
      const button = el("button", kind, `approval-${decision}`);
      button.type = "button";
      button.textContent = text;
      button.addEventListener("click", () =>
        this.#decide(decision, note, buttons, callId),
      );
      return button;
    });
    const message = el("p", "approval-error", "approval-error");
    message.hidden = true;
    box.replaceChildren(note, ...buttons, message);
  }

  async #decide(decision, note, buttons, callId) {
    for (const button of buttons) button.disabled = true;
    try {
      // The call this card shows: a decision never lands on another call.
      await api(urls.approval(this.runId), {
        method: "POST",
        body: { decision, note: note.value, tool_call_id: callId },
      });
    } catch (error) {
      // 409: decided elsewhere (another tab); its `approval` event redraws this.
      const message = note.parentNode?.querySelector(".approval-error");
      if (message && error?.status !== 409) {
        message.textContent = error?.message || "The decision was not sent.";
        message.hidden = false;
        for (const button of buttons) button.disabled = false;
      }
    }
  }

  /** A status receipt; a step's progress ("Step 2 of at most 8") replaces the last one. */
  addStatus(message) {
    const step = /^Step \d+ of at most \d+$/.test(message);
    const item = (step && this.stepItem) || el("li", "receipt", "status");
    item.textContent = statusText(message);
    item.title = message; // the journal's own words
    if (step) {
      item.dataset.kind = "step";
      this.stepItem = item;
    }
    if (item.parentNode !== this.receipts) this.receipts.append(item);
    this.receipts.hidden = false;
  }

  /** The run's error, with its category (network, timeout, rate_limit, …). */
  setError({ category, message }) {
    const tag = el("span", "error-category", "error-category");
    tag.textContent = categoryText(category);
    tag.title = category || "";
    this.errorBox.dataset.category = category || "";
    const text = el("span", "error-message", "error-message");
    text.textContent = message || "";
    this.errorBox.replaceChildren(tag, text);
    this.errorBox.hidden = false;
  }

  /**
   * The footer: outcome, model, usage and tokens/s (only what was reported).
   * @param {{status?: string, terminal_state?: string, model?: string,
   *   usage?: object, tokensPerS?: number}} info
   */
  setMeta({ status, terminal_state: terminalState, model, usage, tokensPerS }) {
    this.root.dataset.status = status || "";
    const parts = [];
    const cutOff = terminalState === "output-limit";
    if ((status && status !== "completed") || cutOff) {
      parts.push(["outcome", outcomeText(status, terminalState)]);
    }
    if (model) parts.push(["model", model]);
    if (tokensPerS) parts.push(["speed", `${tokensPerS.toFixed(1)} tok/s`]);
    // The `usage` event says input/output; a run's status keeps the provider's
    // prompt/completion names.
    const input = usage ? usage.input_tokens ?? usage.prompt_tokens : null;
    const output = usage ? usage.output_tokens ?? usage.completion_tokens : null;
    if (input != null || output != null) {
      parts.push(["usage", `${input ?? "?"} in · ${output ?? "?"} out`]);
    }
    this.meta.replaceChildren(
      ...parts.map(([key, value]) => {
        const item = el("span", `meta-${key}`, `run-${key}`);
        item.textContent = value;
        if (key === "outcome") item.title = terminalState || status;
        return item;
      }),
    );
    if (cutOff) this.meta.append(this.#continueButton());
  }

  /** Continue an answer cut at its output limit: the page sends "Continue". */
  #continueButton() {
    const button = el("button", "continue-answer", "continue-answer");
    button.type = "button";
    button.textContent = "Continue";
    button.title = "Ask the model to go on from where the answer was cut off";
    button.addEventListener("click", () => {
      this.root.dispatchEvent(new CustomEvent("hermes:continue", { bubbles: true }));
    });
    return button;
  }

  /** Live-only `metering`: the current pace while the run streams. */
  setPace(tokensPerS) {
    if (!tokensPerS) return;
    let pace = this.meta.querySelector(".meta-pace");
    if (!pace) {
      pace = el("span", "meta-pace", "run-pace");
      this.meta.append(pace);
    }
    pace.textContent = `${tokensPerS.toFixed(1)} tok/s`;
  }

  /** The whole text of the turn's segments, as the model wrote it. */
  get text() {
    return this.fold.text;
  }

  /** Render every pending segment now. */
  flush() {
    clearTimeout(this.renderTimer);
    this.renderTimer = null;
    const streaming = this.root.dataset.streaming === "true";
    for (const { node, part } of this.dirty) {
      const highlight = !streaming || part.text.length < HIGHLIGHT_LIVE_CHARS;
      renderMarkdown(node, part.text, { highlight });
    }
    this.dirty.clear();
  }

  #schedule(segment) {
    this.dirty.add(segment);
    if (this.root.dataset.streaming !== "true") {
      this.flush();
    } else if (!this.renderTimer) {
      this.renderTimer = setTimeout(() => this.flush(), RENDER_INTERVAL_MS);
    }
  }
}

/**
 * Draw the saved messages of one run (assistant texts, tool calls, tool
 * results, steers, in order) into `view`, through its fold like live events.
 * `tools` (the run's part of the session's `tool_outcomes`) gives, by call id,
 * what a tool message does not keep: whether the call failed (`is_error`) and
 * a person's decision on it (`approval`: the journaled `{decision, note}`).
 */
export function fillFromMessages(view, messages, tools = {}) {
  let cut = false; // the last message was a partial kept when a stream was cut
  for (const message of messages) {
    if (message.role === "user" && message.steer) {
      view.apply("steer", { text: message.content });
    } else if (message.role === "assistant") {
      // A partial followed by more of the run: the answer was asked for again
      // there (the journal's stream-resume status, whose reason is not kept).
      if (cut) view.apply("status", { message: RESUME_STATUS });
      cut = message.complete === false && !(message.tool_calls || []).length;
      view.apply("reasoning", { text: message.reasoning });
      view.apply("token", { text: message.content });
      for (const call of message.tool_calls || []) {
        view.apply("tool", {
          tool_call_id: call.id,
          name: call.function?.name ?? call.name ?? "tool",
          args: call.function?.arguments ?? call.arguments ?? "",
        });
      }
    } else if (message.role === "tool") {
      const known = tools[message.tool_call_id] || {};
      if (known.approval) {
        view.apply("approval", { ...known.approval, tool_call_id: message.tool_call_id });
      }
      view.apply("tool_complete", {
        tool_call_id: message.tool_call_id,
        name: "tool",
        result: message.content,
        is_error: Boolean(known.is_error),
      });
    }
  }
  view.flush();
}

/** Apply one journaled event to a live turn. */
export function applyEvent(view, type, data, seq = 0) {
  view.apply(type, data, seq);
  if (type === "status") view.addStatus(data.message);
  else if (type === "error") view.setError(data);
  else if (type === "start" && data.model) view.root.dataset.model = data.model;
  // usage and end are read by the page controller
}
