/**
 * The conversation pane: user messages as plain text, assistant turns as
 * `TurnView`s grouped by run, and scrolling that follows the stream only while
 * the reader is at the bottom.
 */
import { TurnView, fillFromMessages } from "./turn.js";

const STICK_PX = 80; // "at the bottom" tolerance for following the stream

export class Conversation {
  /**
   * @param {HTMLElement} container the scrolling message list
   * @param {HTMLElement} emptyState shown while there is nothing to read
   */
  constructor(container, emptyState) {
    this.container = container;
    this.emptyState = emptyState;
    this.turns = new Map(); // runId -> TurnView
    this.lastUser = null; // {content, runId} of the last user message
    // Follow the stream while the reader is at the bottom; stop when they
    // scroll up to read, resume when they come back down.
    this.follow = true;
    container.addEventListener("scroll", () => {
      this.follow = this.atBottom();
    });
    new MutationObserver(() => this.scrollToEnd()).observe(container, {
      childList: true,
      subtree: true,
      characterData: true,
    });
  }

  clear() {
    this.container.replaceChildren(this.emptyState);
    this.emptyState.hidden = false;
    this.turns.clear();
    this.lastUser = null;
  }

  /**
   * Draw saved messages. Assistant and tool messages of `liveRunId` are left
   * out: the live turn shows them (partials the worker already saved are part
   * of its snapshot text, and drawing both would double them).
   */
  renderHistory(messages, { liveRunId = null } = {}) {
    this.clear();
    let group = null; // {runId, messages}
    const flush = () => {
      if (group && group.messages.length) {
        const view = this.addTurn(group.runId);
        fillFromMessages(view, group.messages);
        view.setStreaming(false);
      }
      group = null;
    };
    for (const message of messages) {
      if (message.role === "user") {
        flush();
        this.addUser(message.content, message.run);
      } else if (message.role === "assistant" || message.role === "tool") {
        if (message.run && message.run === liveRunId) continue;
        if (!group || group.runId !== message.run) {
          flush();
          group = { runId: message.run, messages: [] };
        }
        group.messages.push(message);
      }
      // System messages are the session's prompt: shown in the settings panel.
    }
    flush();
    this.scrollToEnd(true);
  }

  addUser(content, runId = null) {
    this.emptyState.hidden = true;
    const article = document.createElement("article");
    article.className = "msg user";
    article.dataset.testid = "user-message";
    const bubble = document.createElement("div");
    bubble.className = "bubble";
    bubble.textContent = content; // the user's own words, never parsed as HTML
    article.append(bubble);
    if (runId) article.dataset.runId = runId;
    this.container.append(article);
    this.lastUser = { content, runId };
    return article;
  }

  /** Remove a user message the server did not take. */
  takeBack(article) {
    if (!article.isConnected) return;
    article.remove();
    const users = this.container.querySelectorAll("[data-testid=user-message]");
    const last = users[users.length - 1];
    this.lastUser = last ? { content: last.textContent, runId: last.dataset.runId || null } : null;
    this.emptyState.hidden = this.container.children.length > 1;
  }

  /** A new (empty) assistant turn for `runId`, replacing one drawn before. */
  addTurn(runId) {
    this.emptyState.hidden = true;
    const old = runId ? this.turns.get(runId) : null;
    if (old) old.root.remove();
    const view = new TurnView(runId);
    this.container.append(view.root);
    if (runId) this.turns.set(runId, view);
    return view;
  }

  /** The turn drawn last, if it is the newest thing in the conversation. */
  lastTurn() {
    const last = this.container.lastElementChild;
    for (const view of this.turns.values()) if (view.root === last) return view;
    return null;
  }

  atBottom() {
    const c = this.container;
    return c.scrollHeight - c.scrollTop - c.clientHeight < STICK_PX;
  }

  scrollToEnd(force = false) {
    if (force) this.follow = true;
    if (this.follow) this.container.scrollTop = this.container.scrollHeight;
  }
}
