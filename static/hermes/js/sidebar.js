/**
 * The sidebar: the user's sessions (new, select, rename, delete, search) and a
 * "running" mark per session, kept current by the user's notification stream
 * `GET /api/stream/` (docs/architecture.md §5). Notifications are not journaled, so on every
 * (re)connect the list is fetched again instead of replayed. Where the browser
 * has SharedWorker, that stream is one for all the tabs (`shared-streams.js`).
 */
import { api, urls } from "./api.js";
import { sharedStreams } from "./shared-client.js";

const SEARCH_DEBOUNCE_MS = 200;
const REFRESH_DEBOUNCE_MS = 100; // a burst of notifications costs one fetch
const NOTE_RETRY_MAX_MS = 30000; // cap of the back-off while the stream is refused
const ENDED_KEPT = 500; // ended run ids remembered: far more than runs started in a sitting

export class Sidebar {
  /**
   * @param {object} options
   * @param {(id: number) => void} options.onSelect a session was picked
   * @param {(id: number) => void} options.onDeleted a session is gone (here or elsewhere)
   * @param {(id: number, session: object) => void} options.onRenamed
   * @param {(note: object) => void} options.onRun a `run` notification
   * @param {(note: object) => void} [options.onQueue] a session's pending messages changed
   * @param {(state: string) => void} [options.onConnection] the notification
   *   stream's state: live, reconnecting, closed (signed out)
   */
  constructor({ onSelect, onDeleted, onRenamed, onRun, onQueue, onConnection }) {
    this.list = document.getElementById("session-list");
    this.empty = document.getElementById("session-empty");
    this.search = document.getElementById("session-search");
    this.template = document.getElementById("tpl-session-item");
    this.onSelect = onSelect;
    this.onDeleted = onDeleted;
    this.onRenamed = onRenamed;
    this.onRun = onRun;
    this.onQueue = onQueue || (() => {});
    this.onConnection = onConnection || (() => {});
    this.noteFailures = 0;
    this.noteTimer = null;
    this.sessions = [];
    this.running = new Map(); // session id -> id of its queued or running run
    // Runs this tab heard end. A list fetched before a run ended can arrive
    // after its "finished" note, and a "started" note can arrive after its
    // "finished" one (the worker may end a short run before the note of its
    // start is sent): neither may bring the mark back.
    this.ended = new Set();
    this.listsAsked = 0; // list requests sent,
    this.listShown = 0; // the newest of them shown,
    this.listAnswers = 0; // and answers handled
    this.currentId = null;
    this.refreshTimer = null;
    this.notifications = null;
    this.renaming = false; // a title is being edited in place
    this.drawn = new Map(); // "session:<id>" or "group:<label>" -> its row in the list
    this.hits = new SearchHits(onSelect);
    this.search.addEventListener("input", () => {
      clearTimeout(this.searchTimer);
      this.searchTimer = setTimeout(() => {
        this.refresh().catch(() => {}); // typing again asks again
        this.hits.show(this.search.value.trim());
      }, SEARCH_DEBOUNCE_MS);
    });
    this.list.addEventListener("click", (event) => this.#onClick(event));
  }

  /**
   * Fetch the list again (search text applied). Answers can come back out of
   * order: one older than the list shown is dropped.
   */
  async refresh() {
    const asked = ++this.listsAsked;
    const data = await api(urls.sessions(this.search.value.trim()));
    if (asked > this.listShown) {
      this.listShown = asked;
      const before = this.sessions.find((s) => s.id === this.currentId);
      this.sessions = Array.isArray(data) ? data : data.results || [];
      // The open chat renamed elsewhere (another tab, or its generated title).
      const now = this.sessions.find((s) => s.id === this.currentId);
      if (before && now && before.title !== now.title) this.onRenamed(now.id, now);
      if (this.sessions.some((s) => "active_run_id" in s)) {
        // The list says which sessions have an active run (when the API sends it).
        this.running = new Map(
          this.sessions
            .filter((s) => s.active_run_id && !this.ended.has(s.active_run_id))
            .map((s) => [s.id, s.active_run_id]),
        );
      }
      this.render();
    }
    this.list.dataset.answers = String(++this.listAnswers); // tests wait on this
    return this.sessions;
  }

  scheduleRefresh() {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => this.refresh().catch(() => {}), REFRESH_DEBOUNCE_MS);
  }

  /** The list: pinned chats first, then newest first under date headings
   * (today, yesterday, …). Rows already drawn are kept and updated in place,
   * and only rows whose place changed move: a refresh that changes nothing
   * leaves the pointer's hover and the keyboard's focus where they were. */
  render() {
    if (this.renaming) return; // redrawn when the rename ends; keep the input alive
    const nodes = [];
    const kept = new Map();
    let group = null;
    const now = new Date();
    const pinned = this.sessions.filter((s) => s.pinned);
    const others = this.sessions.filter((s) => !s.pinned);
    for (const session of [...pinned, ...others]) {
      const label = session.pinned ? "Pinned" : dateGroup(session.updated_at, now);
      if (label !== group) {
        group = label;
        const key = `group:${label}`;
        const heading = this.drawn.get(key) || groupHeading(label);
        kept.set(key, heading);
        nodes.push(heading);
      }
      const key = `session:${session.id}`;
      const item = this.drawn.get(key) || this.template.content.firstElementChild.cloneNode(true);
      this.#fill(item, session);
      kept.set(key, item);
      nodes.push(item);
    }
    this.drawn = kept;
    placeChildren(this.list, nodes);
    // While searching, the message hits below say whether anything matched.
    this.empty.hidden = this.sessions.length > 0 || Boolean(this.search.value.trim());
  }

  #fill(item, session) {
    item.dataset.sessionId = String(session.id);
    item.classList.toggle("current", session.id === this.currentId);
    const link = item.querySelector(".session-link");
    link.href = `/c/${session.id}/`;
    link.title = session.title;
    item.querySelector(".session-name").textContent = session.title || "New chat";
    item.querySelector(".running-dot").hidden = !this.running.has(session.id);
    item.classList.toggle("pinned", Boolean(session.pinned));
    const pin = item.querySelector(".pin");
    pin.title = session.pinned ? "Unpin" : "Pin";
    pin.textContent = session.pinned ? "★" : "☆";
    pin.setAttribute("aria-pressed", String(Boolean(session.pinned)));
  }

  setCurrent(id) {
    this.currentId = id;
    for (const item of this.list.children) {
      item.classList.toggle("current", Number(item.dataset.sessionId) === id);
    }
  }

  /**
   * Mark session `sessionId` running (or not) with run `runId`. A run that
   * ended is never marked again; an end clears only its own run's mark.
   */
  setRunning(sessionId, running, runId = null) {
    if (running) {
      if (runId && this.ended.has(runId)) return;
      this.running.set(sessionId, runId);
    } else {
      if (runId) this.#remember(runId);
      const marked = this.running.get(sessionId);
      if (runId && marked && marked !== runId) return; // a newer run goes on
      this.running.delete(sessionId);
    }
    const item = this.list.querySelector(`[data-session-id="${sessionId}"]`);
    if (item) item.querySelector(".running-dot").hidden = !this.running.has(sessionId);
  }

  #remember(runId) {
    this.ended.add(runId);
    if (this.ended.size > ENDED_KEPT) this.ended.delete(this.ended.values().next().value);
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
      onOpen: () => this.#noteOpen(),
      onNote: (event, data) => {
        if (event === "session") this.#onSessionNote(data);
        else if (event === "run") this.#onRunNote(data);
      },
      onClosed: () => {
        if (this.notifications === watched) this.#noteLost();
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
    source.addEventListener("open", () => this.#noteOpen());
    source.addEventListener("session", (event) => this.#onSessionNote(parse(event.data)));
    source.addEventListener("run", (event) => this.#onRunNote(parse(event.data)));
    source.addEventListener("error", () => {
      if (this.notifications !== source) return;
      // CONNECTING: the browser retries by itself. CLOSED: an HTTP error (a
      // 503 while the database restarts, or signed out); it will not retry.
      if (source.readyState === EventSource.CLOSED) this.#noteLost();
      else this.onConnection("reconnecting");
    });
  }

  #noteOpen() {
    this.noteFailures = 0;
    this.onConnection("live");
    this.scheduleRefresh(); // notifications are not journaled: refetch the list
  }

  /**
   * The stream was refused: try again with back-off. The list fetch says
   * whether the server is back (then listen again) or we were signed out
   * (401/403: stop).
   */
  #noteLost() {
    if (this.notifications) this.notifications.close();
    this.notifications = null;
    this.onConnection("reconnecting");
    this.noteFailures += 1;
    const delay = Math.min(NOTE_RETRY_MAX_MS, 500 * 2 ** this.noteFailures);
    clearTimeout(this.noteTimer);
    this.noteTimer = setTimeout(async () => {
      try {
        await this.refresh();
      } catch (error) {
        if (error.status === 401 || error.status === 403) {
          this.onConnection("closed");
        } else {
          this.#noteLost();
        }
        return;
      }
      if (!this.notifications) this.listen();
    }, delay);
  }

  #onSessionNote(note) {
    if (note.action === "queue") {
      this.onQueue(note); // its pending messages changed; the list did not
      return;
    }
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
    this.setRunning(note.session_id, note.action === "started", note.run_id || null);
    this.onRun(note);
  }

  #onClick(event) {
    const item = event.target.closest(".session-item");
    if (!item) return;
    const id = Number(item.dataset.sessionId);
    if (event.target.closest(".rename")) {
      event.preventDefault();
      this.#startRename(item, id);
    } else if (event.target.closest(".pin")) {
      event.preventDefault();
      this.#togglePin(id);
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
      input.replaceWith(name); // the row is reused by render(), which sets the title
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

  async #togglePin(id) {
    const session = this.sessions.find((s) => s.id === id);
    const pinned = !(session && session.pinned);
    try {
      this.upsert(await api(urls.session(id), { method: "PATCH", body: { pinned } }));
    } catch (error) {
      window.alert(`${pinned ? "Pin" : "Unpin"} failed: ${error.message}`);
    }
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

function groupHeading(label) {
  const heading = document.createElement("li");
  heading.className = "session-group";
  heading.dataset.testid = "session-group";
  heading.setAttribute("role", "presentation");
  heading.textContent = label;
  return heading;
}

/** Make `parent`'s children exactly `nodes`, in order, moving only the nodes
 * out of place (a node removed and put back loses hover and focus). */
function placeChildren(parent, nodes) {
  let cursor = parent.firstChild;
  for (const node of nodes) {
    if (node === cursor) cursor = cursor.nextSibling;
    else parent.insertBefore(node, cursor);
  }
  while (cursor) {
    const next = cursor.nextSibling;
    cursor.remove();
    cursor = next;
  }
}

/**
 * Messages whose text holds the search words (`GET /api/search/`), under the
 * chats the search found by title. A hit opens its chat scrolled to it.
 */
class SearchHits {
  constructor(onSelect) {
    this.box = document.getElementById("search-hits");
    this.list = document.getElementById("search-hit-list");
    this.none = document.getElementById("search-none");
    this.more = document.getElementById("search-more");
    this.onSelect = onSelect;
    this.asked = 0; // the newest search asked: older answers are dropped
    this.next = null;
    this.more.addEventListener("click", () => this.#load(this.next, this.asked, true));
    this.list.addEventListener("click", (event) => {
      const link = event.target.closest(".search-hit-link");
      if (!link || event.metaKey || event.ctrlKey || event.shiftKey) return;
      event.preventDefault();
      this.onSelect(Number(link.dataset.sessionId), {
        reveal: Number(link.dataset.messageId),
      });
    });
  }

  show(query) {
    const asked = ++this.asked;
    if (!query) {
      this.box.hidden = true;
      this.list.replaceChildren();
      return;
    }
    this.#load(urls.search(query), asked, false);
  }

  async #load(url, asked, append) {
    let page;
    try {
      page = await api(url);
    } catch {
      return; // the title search above still shows; typing again retries
    }
    if (asked !== this.asked) return;
    const items = page.results.map((hit) => hitItem(hit));
    if (append) this.list.append(...items);
    else this.list.replaceChildren(...items);
    this.next = page.next;
    this.more.hidden = !page.next;
    this.none.hidden = this.list.children.length > 0;
    this.box.hidden = false;
    this.list.dataset.answers = String(asked); // tests wait on this
  }
}

function hitItem(hit) {
  const item = document.createElement("li");
  item.className = "search-hit-item";
  item.dataset.testid = "search-hit";
  const link = document.createElement("a");
  link.className = "search-hit-link";
  link.href = `/c/${hit.session_id}/`;
  link.dataset.sessionId = String(hit.session_id);
  link.dataset.messageId = String(hit.message_id);
  const title = document.createElement("span");
  title.className = "search-hit-title";
  title.textContent = hit.session_title;
  const snippet = document.createElement("span");
  snippet.className = "search-hit-snippet";
  snippet.dataset.testid = "search-hit-snippet";
  snippet.append(...snippetNodes(hit.snippet));
  link.append(title, snippet);
  item.append(link);
  return item;
}

/**
 * The server's snippet (escaped text, `<mark>` around hits) as DOM nodes:
 * text and marks only, whatever else the string might hold.
 */
function snippetNodes(html) {
  const body = new DOMParser().parseFromString(`<body>${html}`, "text/html").body;
  return [...body.childNodes].map((node) => {
    if (node.nodeName !== "MARK") return document.createTextNode(node.textContent);
    const mark = document.createElement("mark");
    mark.textContent = node.textContent;
    return mark;
  });
}

/**
 * The sidebar's heading for a chat last active at `iso`, by the reader's
 * calendar days: Today, Yesterday, Previous 7 days, Previous 30 days, Older.
 */
export function dateGroup(iso, now = new Date()) {
  const then = new Date(iso);
  if (Number.isNaN(then.getTime())) return "Older";
  const today = new Date(now.getFullYear(), now.getMonth(), now.getDate());
  const day = new Date(then.getFullYear(), then.getMonth(), then.getDate());
  const days = Math.round((today - day) / 86400000); // DST days still round right
  if (days <= 0) return "Today";
  if (days === 1) return "Yesterday";
  if (days <= 7) return "Previous 7 days";
  if (days <= 30) return "Previous 30 days";
  return "Older";
}

function parse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return {};
  }
}
