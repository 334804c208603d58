/**
 * The tab's side of `shared-streams.js`: the SharedWorker that holds one
 * notification stream and one stream per run for every tab of this browser.
 *
 * `sharedStreams()` is null when there is no SharedWorker (an old browser, a
 * page that removed it) or the worker failed; callers then open their own
 * `EventSource`s as before. A worker failure (script error, no answer to a
 * hello) tells every subscription through `onFail`, which falls back the same
 * way, for the rest of the page's life.
 *
 * One worker per user name: a browser where another user signs in later gets
 * a worker of its own, never the first user's notification stream.
 */

const WORKER_URL = new URL("./shared-streams.js", import.meta.url);
const PROTOCOL = 1; // part of the worker's name: a new protocol gets a new worker
const HELLO_EVERY_MS = 20000; // the tab checks the worker is alive this often
const ANSWER_MS = 5000; // a hello unanswered this long (page visible) means it is not
const WATCHDOG_TICK_MS = 1000;

let instance; // undefined: not tried yet; null: unavailable

/** The page's connection to the shared worker, or null to use plain EventSources. */
export function sharedStreams() {
  if (instance === undefined) {
    instance = null;
    if (typeof SharedWorker === "function") {
      try {
        instance = new SharedStreams();
      } catch {
        instance = null;
      }
    }
  }
  return instance && !instance.failed ? instance : null;
}

class SharedStreams {
  constructor() {
    const user = document.getElementById("app")?.dataset.username || "";
    this.worker = new SharedWorker(WORKER_URL, {
      type: "module",
      name: `hermes-streams/${PROTOCOL}/${user}`,
    });
    this.port = this.worker.port;
    this.failed = false;
    this.subs = new Map(); // key -> subscription
    this.nextKey = 1;
    this.helloAt = 0; // when the unanswered hello was sent; 0: none pending
    this.lastHeard = Date.now();
    this.worker.addEventListener("error", () => this.#fail());
    this.port.addEventListener("message", (event) => this.#onMessage(event.data));
    this.port.addEventListener("messageerror", () => this.#fail());
    this.port.start();
    this.#hello();
    this.timer = setInterval(() => this.#watchdog(), WATCHDOG_TICK_MS);
    window.addEventListener("pagehide", () => this.#post({ type: "bye" }));
    // Back from the back/forward cache (after `bye`), from a freeze, or from the
    // background: a hello, answered with a reset if the worker dropped this tab.
    window.addEventListener("pageshow", (event) => {
      if (event.persisted) this.#comeBack();
    });
    document.addEventListener("resume", () => this.#comeBack());
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") this.#comeBack();
    });
  }

  /**
   * Follow a run through the worker.
   * @param {{runId: string, streamUrl: string, afterSeq: number, reopenBelow?: number}} options
   * @param {object} handlers onEvents(events), onMeter(data), onState(state),
   *   onClosed(status), onFail()
   * @returns {{readyState: number, close: () => void}}
   */
  watchRun({ runId, streamUrl, afterSeq, reopenBelow = 0 }, handlers) {
    const key = this.nextKey++;
    const sub = {
      key,
      kind: "run",
      readyState: EventSource.CONNECTING,
      cursor: afterSeq,
      handlers,
      message: () => ({ type: "watch", key, runId, streamUrl, afterSeq: sub.cursor }),
      close: () => this.#unsubscribe(sub, { type: "unwatch", key }),
    };
    this.subs.set(key, sub);
    this.#post({ ...sub.message(), reopenBelow });
    return sub;
  }

  /**
   * The user's notifications through the worker.
   * @param {object} handlers onOpen(), onNote(event, data), onClosed(), onFail()
   */
  watchNotifications(handlers) {
    const key = this.nextKey++;
    const sub = {
      key,
      kind: "notes",
      handlers,
      message: () => ({ type: "notify" }),
      close: () => this.#unsubscribe(sub, { type: "unnotify" }),
    };
    this.subs.set(key, sub);
    this.#post(sub.message());
    return sub;
  }

  #unsubscribe(sub, message) {
    if (this.subs.get(sub.key) !== sub) return;
    this.subs.delete(sub.key);
    sub.readyState = EventSource.CLOSED;
    this.#post(message);
  }

  #post(message) {
    if (this.failed) return;
    try {
      this.port.postMessage(message);
    } catch {
      this.#fail();
    }
  }

  #hello() {
    if (this.failed || this.helloAt) return;
    this.helloAt = Date.now();
    this.#post({ type: "hello" });
  }

  #watchdog() {
    if (this.failed || document.visibilityState !== "visible") return; // timers of hidden pages run late
    const now = Date.now();
    if (this.helloAt && now - this.helloAt > ANSWER_MS) this.#fail();
    else if (now - this.lastHeard > HELLO_EVERY_MS) this.#hello();
  }

  /** Visible again, or back from the cache: make sure the worker still knows this tab. */
  #comeBack() {
    this.helloAt = 0; // a hello sent while hidden or frozen is judged afresh
    this.#hello();
  }

  /** The worker forgot this tab: send every subscription again, with its cursor. */
  #resubscribe() {
    for (const sub of this.subs.values()) this.#post(sub.message());
  }

  #fail() {
    if (this.failed) return;
    this.failed = true;
    clearInterval(this.timer);
    const subs = [...this.subs.values()];
    this.subs.clear();
    try {
      this.port.postMessage({ type: "bye" });
      this.port.close();
    } catch {
      /* already unusable */
    }
    for (const sub of subs) {
      sub.readyState = EventSource.CLOSED;
      sub.handlers.onFail();
    }
  }

  #onMessage(message) {
    if (this.failed || !message) return;
    this.lastHeard = Date.now();
    this.helloAt = 0; // any word from the worker shows it is alive
    switch (message.type) {
      case "ping":
        this.#post({ type: "pong" });
        return;
      case "reset":
        this.#resubscribe();
        return;
      case "note-open":
      case "note":
      case "note-closed":
        this.#onNote(message);
        return;
      default:
        break;
    }
    const sub = this.subs.get(message.key);
    if (!sub || sub.kind !== "run") return;
    switch (message.type) {
      case "run-events":
        for (const event of message.events) sub.cursor = Math.max(sub.cursor, event.seq);
        sub.handlers.onEvents(message.events);
        break;
      case "run-meter":
        sub.handlers.onMeter(message.data);
        break;
      case "run-state":
        sub.readyState = message.state === "live" ? EventSource.OPEN : EventSource.CONNECTING;
        sub.handlers.onState(message.state);
        break;
      case "run-closed":
        this.subs.delete(sub.key); // the worker has dropped it already
        sub.readyState = EventSource.CLOSED;
        sub.handlers.onClosed(message.status);
        break;
      default:
        break;
    }
  }

  #onNote(message) {
    for (const sub of [...this.subs.values()]) {
      if (sub.kind !== "notes") continue;
      if (message.type === "note-open") sub.handlers.onOpen();
      else if (message.type === "note") sub.handlers.onNote(message.event, message.data);
      else {
        this.subs.delete(sub.key);
        sub.handlers.onClosed();
      }
    }
  }
}
