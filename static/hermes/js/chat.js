/**
 * The chat controller: loads a session, sends messages, and follows at most
 * one run per tab (docs/architecture.md §5 "replay, then live").
 *
 * Loading a session: GET it (its `active_run` is a snapshot rebuilt from the
 * journal), then its messages, whose pages carry the status of their runs.
 * Saved messages are drawn, each finished answer with its footer; if a run is
 * active its snapshot's parts are drawn, in journal order, as a live turn and
 * a `RunStream` attaches after
 * `snapshot.last_seq` (from 0 when the snapshot was too large to send). After
 * `end` the messages are fetched again, so the text left on screen is the saved
 * one, and the run's status adds usage, tokens/s and its error, if any.
 *
 * While a run streams, what the user types is *queued* (the next turn, started
 * by the server when the run ends) or *steered* into the run (chat.pending).
 * Pending messages are listed under the conversation with a Cancel button;
 * the list is the server's, refetched on every `queue` notice, so every tab
 * and a reloaded page show the same one.
 */
import { ApiError, api, newIdempotencyKey, urls } from "./api.js";
import { Conversation } from "./conversation.js";
import { RunStream } from "./stream.js";
import { applyEvent } from "./turn.js";

const POST_ATTEMPTS = 3; // a send whose answer was lost is retried with the same key
const SETTLE_RETRY_MS = 3000; // refetch of a finished run's messages, while offline

export class ChatController {
  #posting = Promise.resolve(); // the last queue or steer post (`queue`)

  /**
   * @param {object} ui elements and callbacks of the page (see app.js)
   */
  constructor(ui) {
    this.ui = ui;
    this.conversation = new Conversation(ui.messages, ui.emptyState);
    this.conversation.onAction = (action) => this.branch(action);
    this.session = null;
    this.stream = null; // the one RunStream of this tab
    this.receipts = new Map(); // runId -> {statuses, error} seen live in this tab
    this.outcomes = new Map(); // runId -> status document of a finished run
    this.generation = 0; // bumps on every load; stale async work checks it
    this.sending = false;
    this.pendingSettle = null; // a finished run whose saved messages are not drawn yet
    this.lastOutcome = null; // status of the newest run, once it ended
    this.lastRunId = null; // and its id
    this.settleTimer = null;
    this.pendingAsked = 0; // the newest pending-list request; older answers are dropped
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
      this.#drawPending([]);
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
    this.#drawPending(session.pending_messages || []);
    this.conversation.renderHistory(messages, {
      liveRunId: active ? active.run_id : null,
      outcomes: this.outcomes,
      tools: session.tool_outcomes || {},
    });
    this.#showKnownOutcomes();
    if (active) {
      this.ui.onRunStarted(session.id, active.run_id);
      this.#attach(active.run_id, urls.events(active.run_id), active);
    } else {
      this.#decorateLastTurn(generation, session.last_run_id);
    }
    this.#updateControls();
  }

  /**
   * Send `content` as the next user message (creating the session if needed),
   * with `files` uploaded before (`{id, name, kind, size, url}`).
   */
  async send(content, files = []) {
    if (this.sending || this.running || (!content.trim() && !files.length)) return false;
    this.#beginSending();
    let shown = null; // the user's message, drawn before the server answers
    try {
      if (!this.session) await this.#createSession();
      const session = this.session;
      const generation = this.generation; // bumps when another chat is opened
      shown = this.conversation.addUser(content, null, files);
      this.conversation.scrollToEnd(true);
      const model = this.ui.selectedModel();
      const body = { content };
      if (model) body.model = model;
      if (files.length) body.attachments = files.map((file) => file.id);
      const started = await this.#start(session, body);
      if (!started) return false;
      // Another chat was opened meanwhile: the run goes on, that tab shows it
      // when it comes back. (Identity of `this.session` is no test: a saved
      // setting updates it in place, see `updateSession`.)
      if (this.generation !== generation || this.currentId !== session.id) return true;
      this.conversation.lastUser.runId = started.run_id;
      this.#follow(session, started);
      return true;
    } catch (error) {
      if (shown) this.conversation.takeBack(shown);
      // A per-user limit (429) says which, and when to try again.
      this.ui.setError(
        error.limit ? `Limit reached: ${error.message}` : `Not sent: ${error.message}`,
      );
      return false;
    } finally {
      this.sending = false;
      this.#updateControls();
    }
  }

  /**
   * While a run streams: `queue` the message as the next turn (the server
   * starts it when the run ends, however it ends), or `steer` it into the
   * running turn at its next model-call boundary. False if not taken (the
   * run had ended: then it is for Send).
   */
  async queue(content, kind = "queue") {
    const session = this.session;
    if (!session || !content.trim()) return false;
    const body = { content, kind };
    if (kind === "steer" && this.stream) body.run_id = this.stream.runId;
    const model = this.ui.selectedModel();
    if (model && kind === "queue") body.model = model;
    this.ui.setError("");
    // One post at a time, in the order typed: two in flight at once could
    // reach the server, and take their places in the queue, the other way round.
    const posted = this.#posting.then(() =>
      api(urls.pending(session.id), { method: "POST", body }),
    );
    this.#posting = posted.catch(() => {});
    try {
      await posted;
      await this.refreshPending();
      return true;
    } catch (error) {
      this.ui.setError(
        error.status === 409
          ? "The answer already ended: press Enter to send the message."
          : error.limit
            ? `Limit reached: ${error.message}`
            : `Not queued: ${error.message}`,
      );
      return false;
    }
  }

  /** Refetch the session's pending messages (a `queue` notice, a landed steer). */
  async refreshPending() {
    const session = this.session;
    if (!session) return;
    const asked = ++this.pendingAsked;
    try {
      const list = await api(urls.pending(session.id));
      if (asked === this.pendingAsked && this.currentId === session.id) {
        this.#drawPending(list.results);
      }
    } catch {
      /* offline: the next notice or reload draws it */
    }
  }

  /** A `session` notice with `action: "queue"`: its pending messages changed. */
  onQueueNote(note) {
    if (note.session_id === this.currentId) this.refreshPending();
  }

  #drawPending(items) {
    const list = this.ui.pendingList;
    list.replaceChildren(
      ...items.map((item) => {
        const row = document.createElement("li");
        row.className = "pending-item";
        row.dataset.testid = "pending-item";
        row.dataset.kind = item.kind;
        row.dataset.pendingId = String(item.id);
        const kind = document.createElement("span");
        kind.className = "pending-kind";
        kind.textContent = item.kind === "steer" ? "Steer · at the next step" : "Queued · next turn";
        const text = document.createElement("span");
        text.className = "pending-text";
        text.dataset.testid = "pending-text";
        text.textContent = item.content; // the user's words, never parsed as HTML
        const cancel = document.createElement("button");
        cancel.type = "button";
        cancel.className = "ghost pending-cancel";
        cancel.dataset.testid = "pending-cancel";
        cancel.textContent = "Cancel";
        cancel.addEventListener("click", () => this.#cancelPending(item.id, cancel));
        row.append(kind, text, cancel);
        return row;
      }),
    );
    list.hidden = items.length === 0;
  }

  async #cancelPending(id, button) {
    const session = this.session;
    if (!session) return;
    button.disabled = true;
    try {
      await api(urls.pendingOne(session.id, id), { method: "DELETE" });
    } catch (error) {
      // 409: it started or landed meanwhile; the refetch shows where it went.
      if (error.status !== 409) this.ui.setError(`Not cancelled: ${error.message}`);
    }
    await this.refreshPending();
  }

  /**
   * Answer the last question again (after a failed or stopped answer): a new
   * run over the same user message (`retry_of`), which is not sent twice.
   */
  async retry() {
    const runId = this.lastRunId;
    if (!runId || !this.session || this.sending || this.running) return false;
    this.#beginSending();
    try {
      const session = this.session;
      const generation = this.generation;
      const model = this.ui.selectedModel();
      const body = model ? { retry_of: runId, model } : { retry_of: runId };
      const started = await this.#start(session, body);
      if (!started) return false;
      if (this.generation !== generation || this.currentId !== session.id) return true;
      // Retry is Regenerate: the new answer is a version beside the one
      // retried, drawn in its place as a reload draws it.
      this.sending = false;
      if (this.currentId === session.id) await this.load(session.id);
      return true;
    } catch (error) {
      this.ui.setError(
        error.limit ? `Limit reached: ${error.message}` : `Not retried: ${error.message}`,
      );
      return false;
    } finally {
      this.sending = false;
      this.#updateControls();
    }
  }

  /**
   * Branches (docs/architecture.md §2): show another version (`select`), or
   * start a run that adds one: `regenerate` answers a question again, `edit`
   * sends a new version of it. Then the session is drawn again as a reload
   * draws it: the active branch, and the new run followed from its snapshot.
   */
  async branch(action) {
    const session = this.session;
    if (!session || this.sending || this.running) return false;
    this.#beginSending();
    try {
      if (action.kind === "select") {
        await api(urls.select(session.id, action.id), { method: "POST" });
      } else {
        const body =
          action.kind === "edit"
            ? { content: action.content, edit_of: action.id }
            : { regenerate: action.id };
        const model = this.ui.selectedModel();
        if (model) body.model = model;
        if (!(await this.#start(session, body))) return false;
      }
      this.sending = false;
      if (this.currentId === session.id) await this.load(session.id);
      return true;
    } catch (error) {
      this.ui.setError(
        error.limit ? `Limit reached: ${error.message}` : `Not done: ${error.message}`,
      );
      return false;
    } finally {
      this.sending = false;
      this.#updateControls();
    }
  }

  /**
   * Scroll saved message `messageId` of the open chat into view (a search
   * hit). One on another branch makes that branch the active one first
   * (`select`, as "‹ 1 / 2 ›" does) and draws it; false if it cannot be shown.
   */
  async reveal(messageId) {
    if (this.conversation.reveal(messageId)) return true;
    const session = this.session;
    if (!session || this.sending || this.running) return false;
    await api(urls.select(session.id, messageId), { method: "POST" });
    if (this.currentId !== session.id) return false;
    await this.load(session.id);
    return this.currentId === session.id && this.conversation.reveal(messageId);
  }

  /**
   * Merge a saved change (model, system prompt, title) into the open session,
   * in place: a send in flight holds the same session and goes on with it.
   */
  updateSession(saved) {
    if (this.session && saved && this.session.id === saved.id) {
      Object.assign(this.session, saved);
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

  #beginSending() {
    this.sending = true;
    this.#updateControls();
    this.ui.setError("");
  }

  /**
   * POST the run; null when the chat turned out to be busy (409: it is shown
   * as it is, with the server's reason).
   */
  async #start(session, body) {
    try {
      return await this.#postRun(session.id, body);
    } catch (error) {
      if (!(error instanceof ApiError) || error.status !== 409) throw error;
      await this.load(session.id); // redraws without the message not sent
      this.ui.setError(
        error.body && error.body.run_id
          ? "This chat already has an answer in progress; showing it."
          : `Not sent: ${error.message}`,
      );
      return null;
    }
  }

  /** Follow a run this tab just started. */
  #follow(session, started) {
    this.ui.onRunStarted(session.id, started.run_id);
    this.#attach(started.run_id, started.stream_url, null);
  }

  #attach(runId, streamUrl, snapshot) {
    this.#closeStream();
    this.lastOutcome = null;
    this.lastRunId = null;
    const view = this.conversation.addTurn(runId);
    view.setStreaming(true);
    let afterSeq = 0;
    if (snapshot && !snapshot.too_large) {
      view.drawSnapshot(snapshot); // its parts in journal order, then its statuses
      afterSeq = snapshot.last_seq;
    }
    const live = { runId, sessionId: this.currentId, view };
    this.stream = new RunStream({
      runId,
      streamUrl,
      afterSeq,
      onEvent: (type, data, seq) => this.#onEvent(live, type, data, seq),
      onEnd: (end) => this.#onEnd(live, end),
      onMeter: (data) => view.setPace(data.tokens_per_s),
      onState: (state) => this.ui.onStreamState(state),
    }).start();
    this.#updateControls();
  }

  #onEvent(live, type, data, seq) {
    applyEvent(live.view, type, data, seq);
    if (type === "steer") this.refreshPending(); // it landed: no longer pending
  }

  /** The turn's fold has the statuses, error, model and usage it streamed. */
  #onEnd(live, end) {
    const { fold } = live.view;
    live.view.setStreaming(false);
    this.receipts.set(live.runId, { statuses: fold.statuses, error: fold.error });
    if (end) live.view.setMeta({ ...end, model: fold.model, usage: fold.usage });
    this.ui.onRunFinished(live.sessionId, live.runId);
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
      // Fetched after the messages: its tool outcomes cover every call they hold.
      const session = await api(urls.session(live.sessionId));
      if (generation !== this.generation) return;
      this.conversation.renderHistory(messages, {
        outcomes: this.outcomes,
        tools: session.tool_outcomes || {},
      });
      // An answer that ended with no text has no message: its turn stays, to
      // show how it ended.
      if (!this.conversation.turns.has(live.runId)) this.conversation.addTurn(live.runId);
      this.#showKnownOutcomes();
      await this.#decorate(live.runId, generation);
      if (this.pendingSettle === live) this.pendingSettle = null;
      await this.#followQueued(session, live.runId, generation);
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

  /**
   * After a run ended: the server may have started the next turn from a
   * queued message (in the transaction of the end); follow it as a reload
   * would. Otherwise draw what is still pending.
   */
  async #followQueued(session, endedRunId, generation) {
    const sessionId = session.id;
    if (generation !== this.generation || this.currentId !== sessionId) return;
    // A newer run: still going (followed) or already ended (drawn, with its footer).
    const newer = session.active_run || session.last_run_id !== endedRunId;
    if (newer && !this.running && !this.sending) {
      await this.load(sessionId);
    } else {
      this.#drawPending(session.pending_messages || []);
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
    this.lastRunId = runId; // what Retry answers again
    this.ui.messages.dataset.settled = runId; // tests wait on this
    this.#updateControls();
  }

  /**
   * Turns redrawn from messages get back the outcomes already known: those the
   * message pages carry (every finished answer keeps its footer after a
   * reload) and those this tab learnt.
   */
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
  #decorateLastTurn(generation, latestRunId = null) {
    const last = this.conversation.lastTurn();
    const runId = latestRunId || (last ? last.runId : this.conversation.lastUser?.runId);
    this.lastOutcome = null;
    this.lastRunId = null;
    if (!runId) return;
    // The newest run may have ended with no text (then no message names it).
    if (!last || last.runId !== runId) this.conversation.addTurn(runId);
    this.#decorate(runId, generation).catch(() => {});
  }

  #closeStream() {
    if (this.stream) this.stream.close();
    this.stream = null;
    this.ui.onStreamState("closed");
  }

  // --- requests ---------------------------------------------------------------

  /** Every saved message; the finished runs' statuses on the pages are kept. */
  async #allMessages(sessionId) {
    const messages = [];
    let url = urls.activeBranch(sessionId);
    while (url) {
      const page = await api(url);
      messages.push(...page.results);
      for (const [runId, status] of Object.entries(page.runs || {})) {
        if (status.terminal) this.outcomes.set(runId, status); // it will not change
      }
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

  async #createSession() {
    // No title: the server names the chat after its first message, and then
    // its generated title; a title sent here would count as the user's.
    const body = {};
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

  #updateControls() {
    const failed = ["failed", "interrupted", "cancelled"].includes(this.lastOutcome);
    this.ui.setControls({
      running: this.running,
      sending: this.sending,
      canRetry: !this.running && !this.sending && failed && Boolean(this.lastRunId),
    });
  }
}

