/**
 * The conversation pane: user messages as plain text, assistant turns as
 * `TurnView`s grouped by run (with the steers that landed in them), and scrolling that follows the stream only while
 * the reader is at the bottom.
 */
import { attachmentList } from "./attachments.js";
import { copyText } from "./clipboard.js";
import { TurnView, fillFromMessages } from "./turn.js";

const STICK_PX = 80; // "at the bottom" tolerance for following the stream
const COPIED_SHOWN_MS = 1500; // "Copied" shows this long on the button

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
    container.addEventListener("click", (event) => this.#onCopyAnswer(event));
    container.addEventListener("click", (event) => this.#onBranchClick(event));
    // Set by the controller: {kind: "select"|"regenerate"|"edit", id, content?}.
    this.onAction = () => {};
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
   *
   * `tools` (the session's `tool_outcomes`) says, by run and call, which tool
   * calls failed and what a person decided, which saved messages cannot say.
   * `outcomes` (run id -> status document) gives a question whose run ended
   * before any text, and that a later question follows, a turn of its own:
   * its error and a Retry (a new answer to that question), as the page showed
   * when the run ended. The newest question's is the controller's.
   */
  renderHistory(messages, { liveRunId = null, outcomes = new Map(), tools = {} } = {}) {
    this.clear();
    let group = null; // {runId, messages}
    let question = null; // the last question, while nothing answers it
    const flush = () => {
      if (group && group.messages.length) {
        const view = this.addTurn(group.runId);
        view.root.dataset.messageIds = group.messages.map((m) => m.id).join(" ");
        fillFromMessages(view, group.messages, tools[group.runId] || {});
        view.setStreaming(false);
        this.#addBranchControls(view.root, group.messages[0], "regenerate");
        question = null;
      }
      group = null;
    };
    for (const message of messages) {
      if (message.role === "user" && message.steer) {
        // A steer is drawn inside its run's answer, where it landed.
        if (message.run && message.run === liveRunId) continue;
        if (!group || group.runId !== message.run) {
          flush();
          group = { runId: message.run, messages: [] };
        }
        group.messages.push(message);
      } else if (message.role === "user") {
        flush();
        if (question) this.#addUnanswered(question, outcomes.get(question.run));
        const article = this.addUser(message.content, message.run, message.attachments);
        article.dataset.messageId = String(message.id);
        // Beside the question, not in it: its text stays the user's words only.
        const bar = this.#addBranchControls(this.container, message, "edit");
        bar.classList.add("user-bar");
        bar.dataset.testid = "user-branch";
        question = message;
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

  /**
   * The turn of a question whose run left no message: drawn when that run
   * ended without completing (its outcome and error are added by the
   * controller, from `status`), with Retry, which answers the question again.
   */
  #addUnanswered(question, status) {
    if (!question.run || !status || !status.terminal) return;
    if (!["failed", "interrupted", "cancelled"].includes(status.status)) return;
    const view = this.addTurn(question.run);
    view.setStreaming(false);
    const bar = document.createElement("div");
    bar.className = "branch-bar";
    const retry = document.createElement("button");
    retry.type = "button";
    retry.className = "ghost branch-action regenerate turn-retry";
    retry.dataset.testid = "turn-retry";
    retry.dataset.target = String(question.id);
    retry.title = "Answer this question again";
    retry.textContent = "Retry";
    bar.append(retry);
    view.root.append(bar);
  }

  /** A user message: its words and the files sent with it (chips, thumbnails). */
  addUser(content, runId = null, attachments = []) {
    this.emptyState.hidden = true;
    const article = document.createElement("article");
    article.className = "msg user";
    article.dataset.testid = "user-message";
    const bubble = document.createElement("div");
    bubble.className = "bubble";
    bubble.textContent = content; // the user's own words, never parsed as HTML
    bubble.hidden = !content;
    article.append(bubble);
    if (attachments && attachments.length) article.append(attachmentList(attachments));
    if (runId) article.dataset.runId = runId;
    this.container.append(article);
    this.lastUser = { content, runId };
    return article;
  }

  /**
   * "‹ 2 / 3 ›" on a message with other versions (regenerated answers, edited
   * questions), and its action: Edit on a question, Regenerate on an answer.
   */
  #addBranchControls(root, message, action) {
    // Appended to `root`: a turn, or (for a question) the pane after it.
    const bar = document.createElement("div");
    bar.className = "branch-bar";
    const ids = message.sibling_ids || [message.id];
    const index = ids.indexOf(message.id);
    if (ids.length > 1) {
      const nav = document.createElement("span");
      nav.className = "branch-nav";
      nav.dataset.testid = "branch-nav";
      const label = document.createElement("span");
      label.dataset.testid = "branch-label";
      label.textContent = `${index + 1} / ${ids.length}`;
      nav.append(
        branchStep("‹", "Previous version", ids[index - 1], "branch-prev"),
        label,
        branchStep("›", "Next version", ids[index + 1], "branch-next"),
      );
      bar.append(nav);
    }
    const target = action === "edit" ? message.id : message.parent;
    if (target) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = `ghost branch-action ${action}`;
      button.dataset.testid = action;
      button.dataset.target = String(target);
      button.textContent = action === "edit" ? "Edit" : "Regenerate";
      bar.append(button);
    }
    root.append(bar);
    return bar;
  }

  #onBranchClick(event) {
    const step = event.target.closest(".branch-step");
    if (step && step.dataset.target) {
      this.onAction({ kind: "select", id: Number(step.dataset.target) });
      return;
    }
    const button = event.target.closest(".branch-action");
    if (!button) return;
    const id = Number(button.dataset.target);
    if (button.classList.contains("regenerate")) {
      this.onAction({ kind: "regenerate", id });
    } else {
      this.#openEditor(button.closest(".branch-bar").previousElementSibling, id);
    }
  }

  /** The question's text in a box, sent as a new version of it. */
  #openEditor(article, id) {
    if (!article || article.querySelector(".edit-box")) return;
    const bubble = article.querySelector(".bubble");
    const box = document.createElement("form");
    box.className = "edit-box";
    const text = document.createElement("textarea");
    text.dataset.testid = "edit-text";
    text.value = bubble.textContent;
    const send = document.createElement("button");
    send.type = "submit";
    send.dataset.testid = "edit-send";
    send.textContent = "Send";
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.className = "ghost";
    cancel.textContent = "Cancel";
    box.append(text, send, cancel);
    bubble.hidden = true;
    bubble.after(box);
    text.focus();
    cancel.addEventListener("click", () => {
      box.remove();
      bubble.hidden = false;
    });
    box.addEventListener("submit", (event) => {
      event.preventDefault();
      if (text.value.trim()) this.onAction({ kind: "edit", id, content: text.value });
    });
  }

  /**
   * Scroll saved message `messageId` into view and mark it (a search hit
   * opened); false if it is not drawn.
   */
  reveal(messageId) {
    const id = String(messageId);
    const target = this.container.querySelector(
      `[data-message-id="${id}"], [data-message-ids~="${id}"]`,
    );
    if (!target) return false;
    for (const old of this.container.querySelectorAll(".search-hit")) {
      old.classList.remove("search-hit");
    }
    target.classList.add("search-hit");
    target.scrollIntoView({ block: "center" });
    this.container.dataset.revealed = id; // tests wait on this
    return true;
  }

  /** Remove a user message the server did not take. */
  takeBack(article) {
    if (!article.isConnected) return;
    article.remove();
    const users = this.container.querySelectorAll("[data-testid=user-message]");
    const last = users[users.length - 1];
    this.lastUser = last
      ? { content: last.querySelector(".bubble").textContent, runId: last.dataset.runId || null }
      : null;
    this.emptyState.hidden = this.container.children.length > 1;
  }

  /** A new (empty) assistant turn for `runId`, replacing one drawn before. */
  addTurn(runId) {
    this.emptyState.hidden = true;
    const old = runId ? this.turns.get(runId) : null;
    if (old) old.root.remove();
    const view = new TurnView(runId);
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "ghost answer-copy";
    copy.dataset.testid = "copy-answer";
    copy.textContent = "Copy";
    copy.title = "Copy the whole answer (Markdown)";
    view.root.append(copy);
    this.container.append(view.root);
    if (runId) this.turns.set(runId, view);
    return view;
  }

  /** The Copy button of a turn: its whole text, as the model wrote it. */
  async #onCopyAnswer(event) {
    const button = event.target.closest(".answer-copy");
    if (!button) return;
    const root = button.closest("[data-testid=assistant-turn]");
    const view = [...this.turns.values()].find((turn) => turn.root === root);
    if (!view) return;
    const done = await copyText(view.text);
    button.textContent = done ? "Copied" : "Copy failed";
    setTimeout(() => {
      button.textContent = "Copy";
    }, COPIED_SHOWN_MS);
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

function branchStep(text, title, target, testid) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "ghost branch-step";
  button.dataset.testid = testid;
  button.title = title;
  button.textContent = text;
  button.disabled = target === undefined;
  if (target !== undefined) button.dataset.target = String(target);
  return button;
}
