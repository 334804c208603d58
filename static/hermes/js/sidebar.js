/**
 * The sidebar: the user's sessions (new, select, rename, delete, search) and a
 * "running" mark per session, kept current by the user's notification stream
 * `GET /api/stream/` (DESIGN §5). Notifications are not journaled, so on every
 * (re)connect the list is fetched again instead of replayed. Where the browser
 * has SharedWorker, that stream is one for all the tabs (`shared-streams.js`).
 */
import { api, urls } from "./api.js";
import { sharedStreams } from "./shared-client.js";

const SEARCH_DEBOUNCE_MS = 200;
const REFRESH_DEBOUNCE_MS = 100; // a burst of notifications costs one fetch

export class Sidebar {
  /**
   * @param {object} options
   * @param {(id: number) => void} options.onSelect a session was picked
   * @param {(id: number) => void} options.onDeleted a session is gone (here or elsewhere)
   * @param {(id: number, session: object) => void} options.onRenamed
   * @param {(note: object) => void} options.onRun a `run` notification
   */
  constructor({ onSelect, onDeleted, onRenamed, onRun }) {
    this.list = document.getElementById("session-list");
    this.empty = document.getElementById("session-empty");
    this.search = document.getElementById("session-search");
    this.template = document.getElementById("tpl-session-item");
    this.onSelect = onSelect;
    this.onDeleted = onDeleted;
    this.onRenamed = onRenamed;
    this.onRun = onRun;
    this.sessions = [];
    this.running = new Set(); // session ids with a queued or running run
    this.currentId = null;
    this.refreshTimer = null;
    this.notifications = null;
    this.renaming = false; // a title is being edited in place
    this.search.addEventListener("input", () => {
      clearTimeout(this.searchTimer);
      this.searchTimer = setTimeout(() => this.refresh(), SEARCH_DEBOUNCE_MS);
    });
    this.list.addEventListener("click", (event) => this.#onClick(event));
  }

  /** Fetch the list again (search text applied). */
  async refresh() {
    const data = await api(urls.sessions(this.search.value.trim()));
    this.sessions = Array.isArray(data) ? data : data.results || [];
    if (this.sessions.some((s) => "active_run_id" in s)) {
      // The list says which sessions have an active run (when the API sends it).
      this.running = new Set(this.sessions.filter((s) => s.active_run_id).map((s) => s.id));
    }
    this.render();
    return this.sessions;
  }

  scheduleRefresh() {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => this.refresh().catch(() => {}), REFRESH_DEBOUNCE_MS);
  }

  render() {
    if (this.renaming) return; // redrawn when the rename ends; keep the input alive
    const items = this.sessions.map((session) => {
      const item = this.template.content.firstElementChild.cloneNode(true);
      item.dataset.sessionId = String(session.id);
      item.classList.toggle("current", session.id === this.currentId);
      const link = item.querySelector(".session-link");
      link.href = `/c/${session.id}/`;
      link.title = session.title;
      item.querySelector(".session-name").textContent = session.title || "New chat";
      item.querySelector(".running-dot").hidden = !this.running.has(session.id);
      return item;
    });
    this.list.replaceChildren(...items);
    this.empty.hidden = items.length > 0;
  }

  setCurrent(id) {
    this.currentId = id;
    for (const item of this.list.children) {
      item.classList.toggle("current", Number(item.dataset.sessionId) === id);
    }
  }

  setRunning(sessionId, running) {
    if (running) this.running.add(sessionId);
    else this.running.delete(sessionId);
    const item = this.list.querySelector(`[data-session-id="${sessionId}"]`);
    if (item) item.querySelector(".running-dot").hidden = !running;
  }

  upsert(session) {
    const index = this.sessions.findIndex((s) => s.id === session.id);
    if (index >= 0) this.sessions[index] = { ...this.sessions[index], ...session };
    else this.sessions.unshift(session);
    this.render();
  }

  /** Listen to the user's notifications; reconnects refetch the list. */
  listen() {
    const shared = sharedStreams();
    if (!shared) {
      this.#listenDirect();
      return;
    }
    const watched = shared.watchNotifications({
      onOpen: () => this.scheduleRefresh(),
      onNote: (event, data) => {
        if (event === "session") this.#onSessionNote(data);
        else if (event === "run") this.#onRunNote(data);
      },
      onClosed: () => {
        if (this.notifications === watched) this.notifications = null;
      },
      onFail: () => {
        if (this.notifications === watched) this.#listenDirect(); // the worker is gone
      },
    });
    this.notifications = watched;
  }

  /** This tab's own EventSource on `/api/stream/`. */
  #listenDirect() {
    const source = new EventSource(urls.notifications());
    this.notifications = source;
    source.addEventListener("open", () => this.scheduleRefresh());
    source.addEventListener("session", (event) => this.#onSessionNote(parse(event.data)));
    source.addEventListener("run", (event) => this.#onRunNote(parse(event.data)));
    source.addEventListener("error", () => {
      // CLOSED means an HTTP error (the endpoint is missing, or we were
      // logged out): the browser will not retry, and neither do we.
      if (source.readyState === EventSource.CLOSED) this.notifications = null;
    });
  }

  #onSessionNote(note) {
    if (note.action === "deleted") {
      this.sessions = this.sessions.filter((s) => s.id !== note.session_id);
      this.running.delete(note.session_id);
      this.render();
      this.onDeleted(note.session_id);
      return;
    }
    this.scheduleRefresh();
  }

  #onRunNote(note) {
    this.setRunning(note.session_id, note.action === "started");
    this.onRun(note);
  }

  #onClick(event) {
    const item = event.target.closest(".session-item");
    if (!item) return;
    const id = Number(item.dataset.sessionId);
    if (event.target.closest(".rename")) {
      event.preventDefault();
      this.#startRename(item, id);
    } else if (event.target.closest(".delete")) {
      event.preventDefault();
      this.#delete(id);
    } else if (event.target.closest(".session-link")) {
      if (event.metaKey || event.ctrlKey || event.shiftKey || event.button === 1) return;
      event.preventDefault();
      this.onSelect(id);
    }
  }

  #startRename(item, id) {
    const session = this.sessions.find((s) => s.id === id);
    const name = item.querySelector(".session-name");
    const input = document.createElement("input");
    input.className = "rename-input";
    input.dataset.testid = "rename-input";
    input.value = session ? session.title : name.textContent;
    input.maxLength = 200;
    name.replaceWith(input);
    this.renaming = true;
    input.focus();
    input.select();
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      this.renaming = false;
      const title = input.value.trim();
      if (save && title && (!session || title !== session.title)) {
        try {
          const updated = await api(urls.session(id), { method: "PATCH", body: { title } });
          this.upsert(updated);
          this.onRenamed(id, updated);
          return;
        } catch (error) {
          window.alert(`Rename failed: ${error.message}`);
        }
      }
      this.render();
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") finish(true);
      if (event.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(true));
  }

  async #delete(id) {
    const session = this.sessions.find((s) => s.id === id);
    if (!window.confirm(`Delete “${session ? session.title : "this chat"}”?`)) return;
    try {
      await api(urls.session(id), { method: "DELETE" });
    } catch (error) {
      if (error.status !== 404) {
        window.alert(`Delete failed: ${error.message}`);
        return;
      }
    }
    this.sessions = this.sessions.filter((s) => s.id !== id);
    this.running.delete(id);
    this.render();
    this.onDeleted(id);
  }
}

function parse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return {};
  }
}
