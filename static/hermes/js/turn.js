/**
 * The DOM of one assistant turn (one run): reasoning in a collapsible
 * <details>, text segments rendered as sanitised Markdown, tool cards with
 * arguments and results, status receipts ("Retry attempt: …"), the error with
 * its category, and a footer with the outcome, usage and tokens/s.
 *
 * A turn is drawn either live, event by event, or from the saved messages of
 * its run; both produce the same segments in the same order, so the text a
 * reader saw streaming is the text the saved messages show afterwards.
 * Model output only ever reaches the page through `renderMarkdown` (sanitised)
 * or `textContent`.
 */
import { renderMarkdown } from "./markdown.js";

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
    this.reasoning = null; // {details, body, text}
    this.body = el("div", "turn-body");
    this.receipts = el("ul", "receipts", "status-list");
    this.receipts.hidden = true;
    this.errorBox = el("div", "run-error", "run-error");
    this.errorBox.hidden = true;
    this.meta = el("footer", "run-meta", "run-meta");
    this.root.append(this.body, this.receipts, this.errorBox, this.meta);
    this.segment = null; // the text segment tokens are appended to
    this.segments = [];
    this.cards = new Map(); // tool_call_id -> card parts
    this.renderTimer = null;
    this.dirty = new Set();
    this.decorated = false; // the run's outcome (status, usage, error) is shown
  }

  /** Mark the turn as streaming (a caret, `data-streaming` for tests and CSS). */
  setStreaming(streaming) {
    this.root.dataset.streaming = streaming ? "true" : "false";
    if (!streaming) this.flush();
  }

  appendText(text) {
    if (!text) return;
    if (!this.segment) {
      const node = el("div", "md", "assistant-text");
      this.segment = { node, text: "" };
      this.segments.push(this.segment);
      this.body.append(node);
    }
    this.segment.text += text;
    this.#schedule(this.segment);
  }

  appendReasoning(text) {
    if (!text) return;
    if (!this.reasoning) {
      const details = el("details", "reasoning", "reasoning");
      const summary = el("summary");
      summary.textContent = "Reasoning";
      const body = el("div", "reasoning-text", "reasoning-text");
      details.append(summary, body);
      this.root.prepend(details);
      this.reasoning = { details, body, text: "" };
    }
    this.reasoning.text += text;
    this.reasoning.body.textContent = this.reasoning.text;
  }

  /** A tool call: a card with its arguments; text after it starts a new segment. */
  addTool({ tool_call_id: id, name, args }) {
    if (this.cards.has(id)) return;
    const card = el("details", "tool-card", "tool-card");
    card.dataset.toolCallId = id;
    card.dataset.state = "running";
    const summary = el("summary", "tool-head");
    const label = el("span", "tool-name", "tool-name");
    label.textContent = name;
    const state = el("span", "tool-state", "tool-state");
    state.textContent = "running…";
    summary.append(label, state);
    const argsBox = el("pre", "tool-args", "tool-args");
    argsBox.textContent = prettyJson(args || "");
    const resultBox = el("pre", "tool-result", "tool-result");
    resultBox.hidden = true;
    card.append(summary, argsBox, resultBox);
    this.body.append(card);
    this.cards.set(id, { card, state, resultBox });
    this.segment = null;
  }

  completeTool({ tool_call_id: id, name, result, is_error: isError, duration_ms: ms }) {
    if (!this.cards.has(id)) this.addTool({ tool_call_id: id, name, args: "" });
    const { card, state, resultBox } = this.cards.get(id);
    card.dataset.state = isError ? "error" : "done";
    state.textContent = isError ? "failed" : ms != null ? `done · ${Math.round(ms)} ms` : "done";
    resultBox.hidden = false;
    resultBox.textContent = prettyJson(result ?? "");
  }

  addStatus(message) {
    const item = el("li", "receipt", "status");
    item.textContent = message;
    this.receipts.append(item);
    this.receipts.hidden = false;
  }

  /** The run's error, with its category (network, timeout, rate_limit, …). */
  setError({ category, message }) {
    const tag = el("span", "error-category", "error-category");
    tag.textContent = category || "error";
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
    if (status && status !== "completed") {
      parts.push(["outcome", terminalState && terminalState !== status ? `${status} (${terminalState})` : status]);
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
        return item;
      }),
    );
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
    return this.segments.map((s) => s.text).join("");
  }

  /** Render every pending segment now. */
  flush() {
    clearTimeout(this.renderTimer);
    this.renderTimer = null;
    const streaming = this.root.dataset.streaming === "true";
    for (const segment of this.dirty) {
      const highlight = !streaming || segment.text.length < HIGHLIGHT_LIVE_CHARS;
      renderMarkdown(segment.node, segment.text, { highlight });
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
 * results, in order) into `view`.
 */
export function fillFromMessages(view, messages) {
  for (const message of messages) {
    if (message.role === "assistant") {
      view.appendReasoning(message.reasoning);
      view.appendText(message.content);
      for (const call of message.tool_calls || []) {
        view.addTool({
          tool_call_id: call.id,
          name: call.function?.name ?? call.name ?? "tool",
          args: call.function?.arguments ?? call.arguments ?? "",
        });
      }
    } else if (message.role === "tool") {
      const card = view.cards.get(message.tool_call_id);
      view.completeTool({
        tool_call_id: message.tool_call_id,
        name: card ? card.card.querySelector(".tool-name").textContent : "tool",
        result: message.content,
        is_error: false,
      });
    }
  }
  view.flush();
}

/** Apply one journaled event to a live turn. */
export function applyEvent(view, type, data) {
  switch (type) {
    case "token":
      view.appendText(data.text);
      break;
    case "reasoning":
      view.appendReasoning(data.text);
      break;
    case "tool":
      view.addTool(data);
      break;
    case "tool_complete":
      view.completeTool(data);
      break;
    case "status":
      view.addStatus(data.message);
      break;
    case "error":
      view.setError(data);
      break;
    case "start":
      if (data.model) view.root.dataset.model = data.model;
      break;
    default:
      break; // usage and end are read by the page controller
  }
}
