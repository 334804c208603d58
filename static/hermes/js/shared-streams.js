/**
 * The SharedWorker that lets every tab of one browser share its streaming
 * connections (a browser allows six HTTP/1.1 connections per host; two per tab
 * would exhaust them with three tabs). It holds:
 *
 * - ONE `EventSource` on `/api/stream/` (the user's notifications), opened while
 *   any tab listens, each message copied to every listening tab;
 * - ONE `EventSource` per run, however many tabs watch it. The worker keeps the
 *   run's events it has seen (everything after `base`, in seq order) while any
 *   tab watches it, so a tab that joins late with its own cursor `afterSeq` gets
 *   every buffered event after it, then the live ones. A cursor below `base` is
 *   filled from `events.json` (short requests, not another stream) first.
 *
 * The tabs stay the judges of correctness: each drops any seq it already
 * applied, and when the worker says a run's stream is closed (an HTTP error,
 * 204 after the end) the tab asks the run's status and re-watches with its
 * cursor, or reads the rest from `events.json` itself (`stream.js`).
 *
 * A port does not say when its tab goes away: tabs send `bye` on `pagehide`,
 * and a tab that has not answered a ping for `PORT_TTL_MS` is dropped. A run's
 * `EventSource` is closed (and its buffer forgotten) when no tab watches it.
 *
 * Messages, tab -> worker: hello, pong, bye, notify, unnotify,
 *   watch {key, runId, streamUrl, afterSeq, reopenBelow}, unwatch {key}.
 * Worker -> tab: welcome, ping, reset (the worker had forgotten this tab:
 *   send every subscription again), note-open, note {event, data}, note-closed,
 *   run-state {key, state}, run-events {key, events: [{type, data, seq}]},
 *   run-meter {key, data}, run-closed {key, status}.
 *
 * No imports: the same file also runs as a classic worker.
 */

const PING_MS = 10000; // how often the worker asks every tab whether it is still there
const PORT_TTL_MS = 30000; // a tab silent this long is gone (closed without `bye`)
const BACKFILL_PAGE = 1000; // events per `events.json` request
const BUFFER_SOFT_MAX = 20000; // past this, events every watcher has are forgotten

// The journaled types of stream.js, repeated: this worker imports nothing so it
// also runs where module workers do not.
const EVENT_TYPES = [
  "start",
  "token",
  "reasoning",
  "tool",
  "tool_complete",
  "approval_request",
  "approval",
  "status",
  "upstream",
  "usage",
  "error",
  "end",
];
const OPEN = 1; // EventSource.OPEN

const clients = new Map(); // MessagePort -> Client
const feeds = new Map(); // run id -> RunFeed
let notes = null; // the NoteFeed while any tab listens

function seqOf(eventId) {
  const seq = Number.parseInt(String(eventId || "").split(":").pop(), 10);
  return Number.isFinite(seq) ? seq : 0;
}

function parse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return {};
  }
}

class Client {
  constructor(port) {
    this.port = port;
    this.seen = Date.now();
    this.notify = false;
    this.subs = new Map(); // key -> Sub
  }

  post(message) {
    try {
      this.port.postMessage(message);
    } catch {
      /* a port whose tab is gone: dropped by the ping sweep */
    }
  }
}

class Sub {
  constructor(client, key, feed, cursor) {
    this.client = client;
    this.key = key;
    this.feed = feed;
    this.cursor = cursor; // the last seq this tab has (or was sent)
  }

  post(message) {
    this.client.post({ ...message, key: this.key });
  }
}

// --- the notification stream ----------------------------------------------------

class NoteFeed {
  constructor() {
    this.source = null;
    this.open();
  }

  listeners() {
    return [...clients.values()].filter((client) => client.notify);
  }

  broadcast(message) {
    for (const client of this.listeners()) client.post(message);
  }

  get isOpen() {
    return Boolean(this.source) && this.source.readyState === OPEN;
  }

  open() {
    const source = new EventSource("/api/stream/");
    this.source = source;
    source.addEventListener("open", () => this.broadcast({ type: "note-open" }));
    for (const event of ["session", "run"]) {
      source.addEventListener(event, (e) =>
        this.broadcast({ type: "note", event, data: parse(e.data) }),
      );
    }
    source.addEventListener("error", () => {
      if (source !== this.source || source.readyState !== EventSource.CLOSED) return;
      // An HTTP error (signed out, say): the browser will not retry. Tell the
      // tabs; a tab that listens again later opens it again.
      this.source = null;
      this.broadcast({ type: "note-closed" });
      for (const client of this.listeners()) client.notify = false;
      stopNotesIfUnused();
    });
  }

  close() {
    if (this.source) this.source.close();
    this.source = null;
  }
}

function startNotes(client) {
  client.notify = true;
  if (!notes || !notes.source) {
    if (notes) notes.close();
    notes = new NoteFeed();
  } else if (notes.isOpen) {
    client.post({ type: "note-open" }); // it missed the `open` the others saw
  }
}

function stopNotesIfUnused() {
  if (notes && ![...clients.values()].some((client) => client.notify)) {
    notes.close();
    notes = null;
  }
}

// --- run streams ----------------------------------------------------------------------

class RunFeed {
  constructor(runId, streamUrl, afterSeq) {
    this.runId = runId;
    this.streamUrl = streamUrl || `/api/runs/${encodeURIComponent(runId)}/events/`;
    this.base = afterSeq; // `events` holds every event with base < seq <= tail
    this.tail = afterSeq;
    this.events = []; // {type, data, seq}, seq ascending
    this.ended = false;
    this.subs = new Set();
    this.source = null;
    this.backfilling = false;
  }

  get state() {
    if (this.ended || (this.source && this.source.readyState === OPEN)) return "live";
    return "connecting";
  }

  add(sub, reopenBelow) {
    this.subs.add(sub);
    sub.post({ type: "run-state", state: this.state });
    if (!this.ended && (!this.source || (reopenBelow > this.tail && reopenBelow > 0))) {
      // none yet, or a tab saw the journal ahead of this stream for a while: a
      // connection that went silent (a sleeping laptop, a dead proxy) is replaced.
      this.open();
    }
    this.deliver(sub);
  }

  remove(sub) {
    this.subs.delete(sub);
    sub.client.subs.delete(sub.key);
    if (this.subs.size === 0) this.drop();
  }

  drop() {
    this.closeSource();
    if (feeds.get(this.runId) === this) feeds.delete(this.runId);
  }

  closeSource() {
    if (this.source) this.source.close();
    this.source = null;
  }

  open() {
    this.closeSource();
    const url = new URL(this.streamUrl, self.location.origin);
    if (this.tail > 0) url.searchParams.set("after_seq", String(this.tail));
    const source = new EventSource(url.href);
    this.source = source;
    this.broadcast({ type: "run-state", state: "connecting" });
    source.addEventListener("open", () => {
      if (source === this.source) this.broadcast({ type: "run-state", state: "live" });
    });
    for (const type of EVENT_TYPES) {
      if (type === "error") continue;
      source.addEventListener(type, (e) => this.onFrame(source, type, e));
    }
    source.addEventListener("metering", (e) => {
      if (source === this.source) this.broadcast({ type: "run-meter", data: parse(e.data) });
    });
    source.addEventListener("error", (e) => {
      // `error` is both a journaled event type and the connection's error.
      if (e instanceof MessageEvent && typeof e.data === "string") {
        this.onFrame(source, "error", e);
      } else if (source === this.source) {
        this.onConnectionError(source);
      }
    });
  }

  onConnectionError(source) {
    if (source.readyState !== EventSource.CLOSED) {
      this.broadcast({ type: "run-state", state: "reconnecting" }); // the browser retries
      return;
    }
    // The browser gave up (an HTTP error, or 204 at the end): every tab asks the
    // run's status and watches again, or reads the rest from `events.json`.
    this.source = null;
    for (const sub of [...this.subs]) {
      sub.post({ type: "run-closed", status: 0 });
      this.remove(sub);
    }
  }

  onFrame(source, type, event) {
    if (source !== this.source) return;
    const seq = seqOf(event.lastEventId);
    if (seq <= this.tail) return; // a resumed stream repeating what we have
    const record = { type, data: parse(event.data), seq };
    this.events.push(record);
    this.tail = seq;
    if (type === "end") {
      this.ended = true;
      this.closeSource(); // nothing follows `end`; do not let it reconnect
    }
    for (const sub of this.subs) {
      if (sub.cursor >= this.base && sub.cursor < seq) {
        sub.cursor = seq;
        sub.post({ type: "run-events", events: [record] });
      }
    }
    this.trim();
  }

  broadcast(message) {
    for (const sub of this.subs) sub.post(message);
  }

  /** Send `sub` every buffered event after its cursor (after a backfill if needed). */
  deliver(sub) {
    if (sub.cursor < this.base) {
      this.backfill();
      return;
    }
    const events = this.events.slice(this.indexAfter(sub.cursor));
    if (events.length) {
      sub.cursor = events[events.length - 1].seq;
      sub.post({ type: "run-events", events });
    }
    if (this.ended && sub.cursor >= this.tail && events.length === 0) {
      // It has everything, `end` included, yet watches: let it settle by itself.
      sub.post({ type: "run-closed", status: 204 });
      this.remove(sub);
    }
  }

  indexAfter(seq) {
    let lo = 0;
    let hi = this.events.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.events[mid].seq <= seq) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /** Read the journal from the lowest waiting cursor up to `base`, in pages. */
  async backfill() {
    if (this.backfilling) return;
    this.backfilling = true;
    try {
      for (;;) {
        const waiting = [...this.subs].filter((sub) => sub.cursor < this.base);
        if (waiting.length === 0 || feeds.get(this.runId) !== this) return;
        const from = Math.min(...waiting.map((sub) => sub.cursor));
        const until = this.base;
        const older = [];
        let after = from;
        while (after < until) {
          const response = await fetch(
            `/api/runs/${encodeURIComponent(this.runId)}/events.json?after_seq=${after}&limit=${BACKFILL_PAGE}`,
            { credentials: "same-origin", headers: { Accept: "application/json" } },
          );
          if (!response.ok) throw Object.assign(new Error("backfill"), { status: response.status });
          const page = await response.json();
          const events = page.events || [];
          for (const e of events) {
            if (e.seq > after && e.seq <= until) older.push({ type: e.event, data: e.data, seq: e.seq });
          }
          if (events.length === 0) break;
          after = events[events.length - 1].seq;
          if (page.next_after_seq === null || page.next_after_seq === undefined) break;
        }
        if (after < until) throw Object.assign(new Error("journal short"), { status: 0 });
        if (feeds.get(this.runId) !== this) return;
        this.events = older.concat(this.events);
        this.base = Math.min(this.base, from);
        for (const sub of waiting) if (this.subs.has(sub)) this.deliver(sub);
      }
    } catch (error) {
      for (const sub of [...this.subs]) {
        if (sub.cursor < this.base) {
          sub.post({ type: "run-closed", status: error.status || 0 });
          this.remove(sub);
        }
      }
    } finally {
      this.backfilling = false;
    }
  }

  /** Bound the buffer: past the soft maximum, forget what every watcher has. */
  trim() {
    if (this.events.length <= BUFFER_SOFT_MAX) return;
    const cut = this.indexAfter(Math.min(...[...this.subs].map((sub) => sub.cursor)));
    if (cut <= 0) return;
    this.base = this.events[cut - 1].seq; // a later, older cursor is backfilled
    this.events = this.events.slice(cut);
  }
}

function watch(client, { key, runId, streamUrl, afterSeq, reopenBelow }) {
  const cursor = Math.max(0, Number(afterSeq) || 0);
  const reopen = Number(reopenBelow) || 0;
  const old = client.subs.get(key);
  if (old && old.feed.runId === runId && feeds.get(runId) === old.feed) {
    old.cursor = cursor; // sent again (a reset): the tab's cursor decides
    old.feed.add(old, reopen);
    return;
  }
  if (old) old.feed.remove(old);
  let feed = feeds.get(runId);
  if (!feed) {
    feed = new RunFeed(runId, streamUrl, cursor);
    feeds.set(runId, feed);
  }
  const sub = new Sub(client, key, feed, cursor);
  client.subs.set(key, sub);
  feed.add(sub, reopen);
}

function unwatch(client, key) {
  const sub = client.subs.get(key);
  if (sub) sub.feed.remove(sub);
}

// --- tabs --------------------------------------------------------------------------

function dropClient(client) {
  clients.delete(client.port);
  for (const sub of [...client.subs.values()]) sub.feed.remove(sub);
  client.notify = false;
  stopNotesIfUnused();
}

function onMessage(port, message) {
  if (!message || typeof message.type !== "string") return;
  let client = clients.get(port);
  if (!client) {
    if (message.type === "bye") return;
    // A tab this worker dropped (frozen past the TTL, back from the
    // back/forward cache after its `bye`) is back: it sends everything again.
    client = new Client(port);
    clients.set(port, client);
    client.post({ type: "reset" });
  }
  client.seen = Date.now();
  switch (message.type) {
    case "hello":
      client.post({ type: "welcome" });
      break;
    case "bye":
      dropClient(client);
      break;
    case "notify":
      startNotes(client);
      break;
    case "unnotify":
      client.notify = false;
      stopNotesIfUnused();
      break;
    case "watch":
      watch(client, message);
      break;
    case "unwatch":
      unwatch(client, message.key);
      break;
    default:
      break; // pong: `seen` is all it is for
  }
}

self.addEventListener("connect", (event) => {
  const port = event.ports[0];
  clients.set(port, new Client(port));
  port.addEventListener("message", (e) => onMessage(port, e.data));
  port.start();
});

setInterval(() => {
  const now = Date.now();
  for (const client of [...clients.values()]) {
    if (now - client.seen > PORT_TTL_MS) dropClient(client);
    else client.post({ type: "ping" });
  }
}, PING_MS);
