/**
 * One run's event stream, every journaled event applied exactly once
 * (docs/architecture.md §3 events, §5 cursor rules).
 *
 * 1. Open an EventSource after a cursor: `?after_seq=N` when N > 0, no cursor
 *    when N = 0, so the browser's own reconnects resume by `Last-Event-ID`.
 * 2. Each journaled frame has `id: <run>:<seq>`; a seq not above the last one
 *    applied is dropped (a reconnect may replay what was already shown).
 * 3. While the browser reconnects by itself (readyState CONNECTING) let it.
 *    When it gives up (CLOSED: an HTTP error, or 204 at the end) ask the run's
 *    status: a finished run's remaining events come from `events.json`, a live
 *    one is re-attached with `after_seq=<last applied>`.
 * 4. `check()` (on visibilitychange, online, pageshow) re-attaches a dead or
 *    suspended (offline) stream and catches up one that fell silent behind
 *    the journal.
 * 5. After `end` the stream closes and reports it.
 * 6. Where the browser has SharedWorker, the connection is the worker's
 *    (`shared-streams.js`): one per run for all the tabs of this browser. The
 *    tab watches with its cursor and applies events exactly as above; when the
 *    worker reports the stream closed, the tab recovers as in 3; when the
 *    worker fails, the tab opens its own EventSource after its cursor.
 */
import { api, urls } from "./api.js";
import { sharedStreams } from "./shared-client.js";

/** Journaled event types (docs/architecture.md §3); `error` needs care, see `#onError`. */
export const EVENT_TYPES = [
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
const RECOVER_MAX_DELAY_MS = 15000; // cap of the back-off while the server is unreachable
const STALL_GRACE_MS = 2500; // events in flight get this long before a catch-up read

/** The seq of an SSE id `<run>:<seq>`; 0 if it has none. */
export function seqOf(eventId) {
  const seq = Number.parseInt(String(eventId || "").split(":").pop(), 10);
  return Number.isFinite(seq) ? seq : 0;
}

export class RunStream {
  /**
   * @param {object} options
   * @param {string} options.runId
   * @param {string} options.streamUrl the run's `stream_url`
   * @param {number} [options.afterSeq] events up to this seq are already shown
   * @param {(type: string, data: object, seq: number) => void} options.onEvent
   * @param {(end: object|null) => void} options.onEnd once, after `end` (null if
   *   the run vanished or its journal was pruned)
   * @param {(data: object) => void} [options.onMeter] live-only `metering` frames
   * @param {(state: string) => void} [options.onState] connecting, live,
   *   reconnecting, ended, closed
   */
  constructor({ runId, streamUrl, afterSeq = 0, onEvent, onEnd, onMeter, onState }) {
    this.runId = runId;
    this.streamUrl = streamUrl || urls.events(runId);
    this.lastSeq = afterSeq;
    this.finished = false;
    this.closed = false;
    this.onEvent = onEvent;
    this.onEnd = onEnd;
    this.onMeter = onMeter || (() => {});
    this.onState = onState || (() => {});
    this.source = null;
    this.recovering = false;
    this.failures = 0;
    this.retryTimer = null;
    this.stallTarget = 0; // a seq the journal had while this stream showed less
  }

  start() {
    this.#open();
    return this;
  }

  /** Stop listening for good (another session was opened, the page goes). */
  close() {
    this.closed = true;
    clearTimeout(this.retryTimer);
    this.#closeSource();
    this.onState("closed");
  }

  /**
   * The network is gone (the `offline` event): drop the connection now rather
   * than wait for it to time out; `check()` re-attaches when it is back.
   */
  suspend() {
    if (!this.active) return;
    clearTimeout(this.retryTimer);
    this.#closeSource();
    this.onState("offline");
  }

  get active() {
    return !this.finished && !this.closed;
  }

  /** Re-attach a dead stream; catch up one that fell silent behind the journal. */
  async check() {
    if (!this.active) return;
    if (!this.source || this.source.readyState === EventSource.CLOSED) {
      this.#recover();
      return;
    }
    let status;
    try {
      status = await api(urls.run(this.runId));
    } catch {
      return; // unreachable: the browser is reconnecting, `online` brings us back
    }
    if (!this.active || (!status.terminal && status.last_seq <= this.lastSeq)) return;
    const target = status.last_seq;
    setTimeout(() => {
      if (this.active && this.lastSeq < target) {
        this.stallTarget = target; // a shared stream behind it is replaced
        this.#recover();
      }
    }, STALL_GRACE_MS);
  }

  #open() {
    if (!this.active) return;
    this.#closeSource();
    const shared = sharedStreams();
    if (shared) {
      this.#openShared(shared);
      return;
    }
    const url =
      this.lastSeq > 0 ? `${this.streamUrl}?after_seq=${this.lastSeq}` : this.streamUrl;
    const source = new EventSource(url);
    this.source = source;
    this.onState("connecting");
    source.addEventListener("open", () => {
      this.failures = 0;
      this.onState("live");
    });
    for (const type of EVENT_TYPES) {
      if (type === "error") continue;
      source.addEventListener(type, (event) => this.#onFrame(type, event));
    }
    source.addEventListener("metering", (event) => this.onMeter(parse(event.data)));
    // `error` is both a journaled event type and EventSource's connection
    // error; only the former is a MessageEvent with data.
    source.addEventListener("error", (event) => this.#onError(source, event));
  }

  /** Watch the run through the shared worker (one connection for all tabs). */
  #openShared(shared) {
    const reopenBelow = this.stallTarget;
    this.stallTarget = 0;
    this.onState("connecting");
    const watched = shared.watchRun(
      { runId: this.runId, streamUrl: this.streamUrl, afterSeq: this.lastSeq, reopenBelow },
      {
        onEvents: (events) => {
          for (const event of events) {
            if (watched !== this.source) return; // closed meanwhile (`end`, or a switch)
            this.#apply(event.type, event.data, event.seq);
          }
        },
        onMeter: (data) => {
          if (watched === this.source) this.onMeter(data);
        },
        onState: (state) => {
          if (watched !== this.source || !this.active) return;
          if (state === "live") this.failures = 0;
          this.onState(state);
        },
        onClosed: () => {
          if (watched === this.source && this.active) this.#recoverAfterClose();
        },
        onFail: () => {
          // The worker is gone: this tab opens its own EventSource from here on.
          if (watched !== this.source || !this.active) return;
          this.source = null;
          this.#open();
        },
      },
    );
    this.source = watched;
  }

  #onError(source, event) {
    if (event instanceof MessageEvent && typeof event.data === "string") {
      this.#onFrame("error", event);
      return;
    }
    if (source !== this.source || !this.active) return;
    if (source.readyState === EventSource.CLOSED) {
      this.#recoverAfterClose();
    } else {
      this.onState("reconnecting"); // the browser retries after the `retry:` delay
    }
  }

  #onFrame(type, event) {
    this.#apply(type, parse(event.data), seqOf(event.lastEventId));
  }

  #apply(type, data, seq) {
    if (!this.active || seq <= this.lastSeq) return;
    this.lastSeq = seq;
    this.onEvent(type, data, seq);
    if (type === "end") this.#finish(data);
  }

  #finish(end) {
    if (this.finished) return;
    this.finished = true;
    clearTimeout(this.retryTimer);
    this.#closeSource();
    this.onState("ended");
    this.onEnd(end);
  }

  #closeSource() {
    if (this.source) {
      this.source.close();
      this.source = null;
    }
  }

  /**
   * The stream was refused (a 503 while the database restarts, say): recover at
   * once the first time, then with back-off until a stream opens again.
   */
  #recoverAfterClose() {
    this.#closeSource();
    this.onState("reconnecting");
    const delay = this.failures ? Math.min(RECOVER_MAX_DELAY_MS, 500 * 2 ** this.failures) : 0;
    this.failures += 1;
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => this.#recover(), delay);
  }

  /** The browser gave up: ask the run's status and resume from the journal. */
  async #recover() {
    if (this.recovering || !this.active) return;
    this.recovering = true;
    clearTimeout(this.retryTimer);
    this.#closeSource();
    this.onState("reconnecting");
    try {
      const status = await api(urls.run(this.runId));
      if (status.terminal) {
        await this.#drain();
        this.failures = 0;
      } else {
        this.#open(); // `open` (or the shared stream's "live") resets the failures
      }
    } catch (error) {
      if (error.status === 404 || error.status === 410) {
        this.#finish(null); // the run is gone, or only its transcript is left
      } else {
        this.failures += 1;
        const delay = Math.min(RECOVER_MAX_DELAY_MS, 500 * 2 ** this.failures);
        this.retryTimer = setTimeout(() => this.#recover(), delay);
      }
    } finally {
      this.recovering = false;
    }
  }

  /** Apply a finished run's events after the cursor from `events.json`, in pages. */
  async #drain() {
    while (this.active) {
      const page = await api(urls.eventsJson(this.runId, this.lastSeq));
      for (const event of page.events) this.#apply(event.event, event.data, event.seq);
      if (page.next_after_seq === null || page.events.length === 0) break;
    }
    if (this.active) this.#finish(null); // terminal without an `end`: nothing more to read
  }
}

function parse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return {};
  }
}
