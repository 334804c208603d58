/**
 * The chat controller: loads a session, sends messages, and follows at most
 * one run per tab (DESIGN §5 "replay, then live").
 *
 * Loading a session: GET it (its `active_run` is a snapshot rebuilt from the
 * journal), then its messages. Saved messages are drawn; if a run is active its
 * snapshot is drawn as a live turn and a `RunStream` attaches after
 * `snapshot.last_seq` (from 0 when the snapshot was too large to send). After
 * `end` the messages are fetched again, so the text left on screen is the saved
 * one, and the run's status adds usage, tokens/s and its error, if any.
 */
import { ApiError, api, newIdempotencyKey, urls } from "./api.js";
import { Conversation } from "./conversation.js";
import { RunStream } from "./stream.js";
import { applyEvent } from "./turn.js";

const POST_ATTEMPTS = 3; // a send whose answer was lost is retried with the same key
const TITLE_CHARS = 60; // a new chat is named after the start of its first message
const SETTLE_RETRY_MS = 3000; // refetch of a finished run's messages, while offline

export class ChatController {
  /**
   * @param {object} ui elements and callbacks of the page (see app.js)
   */
  constructor(ui) {
    this.ui = ui;
    this.conversation = new Conversation(ui.messages, ui.emptyState);
    this.session = null;
    this.stream = null; // the one RunStream of this tab
    this.receipts = new Map(); // runId -> {statuses, error} seen live in this tab
    this.outcomes = new Map(); // runId -> status document of a finished run
    this.generation = 0; // bumps on every load; stale async work checks it
    this.sending = false;
    this.pendingSettle = null; // a finished run whose saved messages are not drawn yet
    this.settleTimer = null;
  }

  get currentId() {
    return this.session ? this.session.id : null;
  }

  get running() {
    return Boolean(this.stream && this.stream.active);
  }

  /** Show session `id` (null: a blank new chat), following its active run. */
  async load(id) {
    const generation = ++this.generation;
    this.#closeStream();
    this.pendingSettle = null;
    delete this.ui.messages.dataset.settled;
    this.ui.setError("");
    if (id === null) {
      this.session = null;
      this.conversation.clear();
      this.ui.onSession(null);
      this.#updateControls();
      return;
    }
    const session = await api(urls.session(id));
    const messages = await this.#allMessages(id);
    if (generation !== this.generation) return;
    this.session = session;
    this.ui.onSession(session);
    const active = session.active_run;
    this.conversation.renderHistory(messages, { liveRunId: active ? active.run_id : null });
    this.#showKnownOutcomes();
    if (active) {
      this.ui.onRunStarted(session.id);
      this.#attach(active.run_id, urls.events(active.run_id), active);
    } else {
      this.#decorateLastTurn(generation);
    }
    this.#updateControls();
  }

  /** Send `content` as the next user message (creating the session if needed). */
  async send(content) {
    if (this.sending || this.running || !content.trim()) return false;
    this.sending = true;
    this.#updateControls();
    this.ui.setError("");
    let shown = null; // the user's message, drawn before the server answers
    try {
      if (!this.session) await this.#createSession(content);
      const session = this.session;
      shown = this.conversation.addUser(content);
      this.conversation.scrollToEnd(true);
      const model = this.ui.selectedModel();
      const body = model ? { content, model } : { content };
      let started;
      try {
        started = await this.#postRun(session.id, body);
      } catch (error) {
        if (error instanceof ApiError && error.status === 409) {
          await this.load(session.id); // redraws without the message not sent
          this.ui.setError("This chat already has an answer in progress; showing it.");
          return false;
        }
        throw error;
      }
      if (this.session !== session) return true; // the user moved on; the run goes on
      this.conversation.lastUser.runId = started.run_id;
      this.ui.onRunStarted(session.id);
      this.#attach(started.run_id, started.stream_url, null);
      if (session.title === "New chat") this.#nameAfter(session, content);
      return true;
    } catch (error) {
      if (shown) this.conversation.takeBack(shown);
      this.ui.setError(`Not sent: ${error.message}`);
      return false;
    } finally {
      this.sending = false;
      this.#updateControls();
    }
  }

  /** Ask the server to stop the running answer; `end` arrives on the stream. */
  async stop() {
    if (!this.running) return;
    this.ui.stopButton.disabled = true;
    this.ui.stopButton.textContent = "Stopping…";
    try {
      await api(urls.cancel(this.stream.runId), { method: "POST" });
    } catch (error) {
      if (error.status !== 409) this.ui.setError(`Could not stop: ${error.message}`);
      this.stream?.check();
    }
  }

  /** Send the last user message again (after a failed or stopped answer). */
  retry() {
    const last = this.conversation.lastUser;
    if (last) return this.send(last.content);
    return Promise.resolve(false);
  }

  /** The page came back (visible, online, restored): re-attach what needs it. */
  async resync() {
    if (this.pendingSettle) {
      this.#settle();
      return;
    }
    if (this.stream && this.stream.active) {
      this.stream.check();
      return;
    }
    if (!this.session || this.sending) return;
    try {
      const session = await api(urls.session(this.session.id));
      if (session.active_run) await this.load(session.id);
    } catch {
      /* offline still: the next `online` event tries again */
    }
  }

  /** The network went away: suspend the stream until `resync()`. */
  offline() {
    if (this.stream) this.stream.suspend();
  }

  /** A `run` notification: a run started elsewhere in this session is followed. */
  onRunNote(note) {
    if (note.session_id !== this.currentId || this.sending) return;
    if (note.action === "started" && !this.running) {
      this.load(note.session_id).catch(() => {});
    }
  }

  // --- runs -----------------------------------------------------------------

  #attach(runId, streamUrl, snapshot) {
    this.#closeStream();
    this.lastOutcome = null;
    const view = this.conversation.addTurn(runId);
    view.setStreaming(true);
    let afterSeq = 0;
    if (snapshot && !snapshot.too_large) {
      view.appendReasoning(snapshot.reasoning);
      view.appendText(snapshot.text);
      for (const tool of snapshot.tools || []) {
        view.addTool(tool);
        if (tool.result !== null && tool.result !== undefined) view.completeTool(tool);
      }
      for (const message of snapshot.statuses || []) view.addStatus(message);
      afterSeq = snapshot.last_seq;
    }
    const live = { runId, sessionId: this.currentId, view, statuses: [], error: null };
    live.statuses.push(...((snapshot && snapshot.statuses) || []));
    this.stream = new RunStream({
      runId,
      streamUrl,
      afterSeq,
      onEvent: (type, data) => this.#onEvent(live, type, data),
      onEnd: (end) => this.#onEnd(live, end),
      onMeter: (data) => view.setPace(data.tokens_per_s),
      onState: (state) => this.ui.onStreamState(state),
    }).start();
    this.#updateControls();
  }

  #onEvent(live, type, data) {
    applyEvent(live.view, type, data);
    if (type === "status") live.statuses.push(data.message);
    if (type === "error") live.error = data;
    if (type === "end" && data.error && !live.error) live.error = data.error;
  }

  #onEnd(live, end) {
    live.view.setStreaming(false);
    this.receipts.set(live.runId, { statuses: live.statuses, error: live.error });
    if (end) live.view.setMeta(end);
    this.ui.onRunFinished(live.sessionId);
    this.#updateControls();
    this.pendingSettle = live;
    this.#settle();
  }

  /**
   * Redraw the conversation from the saved messages after a run ended. Without
   * a network it is tried again later (and on `online`): the saved text, not
   * the streamed one, is what stays on screen.
   */
  async #settle() {
    const live = this.pendingSettle;
    clearTimeout(this.settleTimer);
    if (!live || this.currentId !== live.sessionId) return;
    const generation = this.generation;
    try {
      const messages = await this.#allMessages(live.sessionId);
      if (generation !== this.generation) return;
      this.conversation.renderHistory(messages);
      this.#showKnownOutcomes();
      await this.#decorate(live.runId, generation);
      if (this.pendingSettle === live) this.pendingSettle = null;
    } catch (error) {
      if (error.status === 0) {
        this.settleTimer = setTimeout(() => this.#settle(), SETTLE_RETRY_MS);
      } else {
        this.ui.setError(`Could not refresh the conversation: ${error.message}`);
      }
    } finally {
      this.#updateControls();
    }
  }

  /** Outcome, usage, tokens/s and the error of a finished run's turn. */
  async #decorate(runId, generation) {
    let status = this.outcomes.get(runId);
    if (!status) {
      status = await api(urls.run(runId));
      if (status.terminal) this.outcomes.set(runId, status); // it will not change
    }
    if (generation !== this.generation || !status.terminal) return; // a run just started
    const view = this.conversation.turns.get(runId);
    if (view) this.#showOutcome(view, status);
    this.lastOutcome = status.status;
    this.ui.messages.dataset.settled = runId; // tests wait on this
    this.#updateControls();
  }

  /** Turns redrawn from messages get back the outcomes already known. */
  #showKnownOutcomes() {
    for (const [runId, view] of this.conversation.turns) {
      const status = this.outcomes.get(runId);
      if (status) this.#showOutcome(view, status);
    }
  }

  #showOutcome(view, status) {
    if (view.decorated) return;
    view.decorated = true;
    const seen = this.receipts.get(view.runId) || { statuses: [], error: null };
    for (const message of seen.statuses) view.addStatus(message);
    const error = seen.error || status.error;
    if (error) view.setError(error);
    view.setMeta({
      status: status.status,
      terminal_state: status.terminal_state,
      model: status.model,
      usage: status.usage,
      tokensPerS: (status.diagnostics || {}).tokens_per_s,
    });
  }

  /** On load: the newest turn gets its run's outcome (errors survive reloads). */
  #decorateLastTurn(generation) {
    const last = this.conversation.lastTurn();
    const runId = last ? last.runId : this.conversation.lastUser?.runId;
    this.lastOutcome = null;
    if (!runId) return;
    if (!last) this.conversation.addTurn(runId); // a run that ended with no text
    this.#decorate(runId, generation).catch(() => {});
  }

  #closeStream() {
    if (this.stream) this.stream.close();
    this.stream = null;
    this.ui.onStreamState("closed");
  }

  // --- requests ---------------------------------------------------------------

  async #allMessages(sessionId) {
    const messages = [];
    let url = urls.messages(sessionId);
    while (url) {
      const page = await api(url);
      messages.push(...page.results);
      url = page.next;
    }
    return messages;
  }

  /** POST the run; a lost answer is retried with the same Idempotency-Key. */
  async #postRun(sessionId, body) {
    const key = newIdempotencyKey();
    for (let attempt = 1; ; attempt += 1) {
      try {
        return await api(urls.runs(sessionId), {
          method: "POST",
          body,
          headers: { "Idempotency-Key": key },
        });
      } catch (error) {
        const transient = error.status === 0 || error.status >= 500;
        if (!transient || attempt >= POST_ATTEMPTS) throw error;
      }
    }
  }

  async #createSession(firstMessage) {
    const body = { title: titleFrom(firstMessage) };
    const model = this.ui.selectedModel();
    if (model) body.model = model;
    const prompt = this.ui.pendingSystemPrompt();
    if (prompt) body.system_prompt = prompt;
    const session = await api(urls.sessions(), { method: "POST", body });
    this.generation += 1;
    this.session = session;
    this.conversation.clear();
    this.ui.onSession(session, { created: true });
  }

  async #nameAfter(session, content) {
    try {
      const updated = await api(urls.session(session.id), {
        method: "PATCH",
        body: { title: titleFrom(content) },
      });
      if (this.session && this.session.id === updated.id) this.session.title = updated.title;
      this.ui.onRenamed(updated);
    } catch {
      /* keeps its default name */
    }
  }

  #updateControls() {
    const failed = ["failed", "interrupted", "cancelled"].includes(this.lastOutcome);
    this.ui.setControls({
      running: this.running,
      sending: this.sending,
      canRetry: !this.running && !this.sending && failed && !!this.conversation.lastUser,
    });
  }
}

function titleFrom(text) {
  const line = text.trim().split("\n")[0];
  return line.length > TITLE_CHARS ? `${line.slice(0, TITLE_CHARS - 1)}…` : line || "New chat";
}
