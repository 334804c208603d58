/**
 * The chat page's entry point: wires the sidebar, the chat controller, the
 * composer, the model picker, the system prompt, the theme toggle and the
 * phone layout together. No inline handlers anywhere (the page's CSP forbids
 * inline script); everything is attached here.
 */
import { api, urls } from "./api.js";
import { ChatController } from "./chat.js";
import { handleCodeCopy } from "./markdown.js";
import { Sidebar } from "./sidebar.js";

const $ = (id) => document.getElementById(id);
const PHONE_QUERY = window.matchMedia("(max-width: 760px)");
const THEMES = ["auto", "light", "dark"];

const app = $("app");
const input = $("composer-input");
const picker = $("model-picker");
const promptBox = $("system-prompt");
const banner = $("connection");
let defaultModel = "";
let historyMode = "replace"; // how the next load updates the address bar

// --- chrome: sidebar on phones, theme ------------------------------------------

function setSidebarOpen(open) {
  app.classList.toggle("sidebar-open", open);
  $("scrim").hidden = !open || !PHONE_QUERY.matches;
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
}

function showTheme(theme) {
  $("theme-toggle").textContent = `Theme: ${theme}`;
  $("theme-toggle").dataset.theme = theme;
}

$("sidebar-toggle").addEventListener("click", () =>
  setSidebarOpen(!app.classList.contains("sidebar-open")),
);
$("scrim").addEventListener("click", () => setSidebarOpen(false));
$("theme-toggle").addEventListener("click", () => {
  const current = window.hermesTheme.current();
  const next = THEMES[(THEMES.indexOf(current) + 1) % THEMES.length];
  showTheme(window.hermesTheme.save(next));
});
showTheme(window.hermesTheme.current());

// --- the conversation ------------------------------------------------------------

function setBanner(text) {
  banner.textContent = text;
  banner.hidden = !text;
}

const chat = new ChatController({
  messages: $("messages"),
  emptyState: $("empty-state"),
  stopButton: $("stop"),
  selectedModel: () => picker.value,
  pendingSystemPrompt: () => promptBox.value.trim(),
  setError(text) {
    $("composer-error").textContent = text;
    $("composer-error").hidden = !text;
  },
  setControls({ running, sending, canRetry }) {
    app.dataset.runState = running ? "running" : sending ? "sending" : "idle";
    $("send").hidden = running;
    $("send").disabled = sending;
    $("stop").hidden = !running;
    if (!running) {
      $("stop").disabled = false;
      $("stop").textContent = "Stop";
    }
    $("retry").hidden = !canRetry;
  },
  onStreamState(state) {
    app.dataset.streamState = state;
    if (state === "offline" || !navigator.onLine) {
      setBanner("You are offline. The answer goes on; it resumes here when you are back.");
    } else {
      setBanner(state === "reconnecting" ? "Reconnecting…" : "");
    }
  },
  onSession(session, { created = false } = {}) {
    const id = session ? session.id : null;
    sidebar.setCurrent(id);
    if (created) sidebar.upsert(session);
    $("session-title").textContent = session ? session.title : "New chat";
    document.title = session ? `${session.title} · Hermes` : "Hermes";
    if (session) promptBox.value = session.system_prompt || "";
    selectModel(session && session.model ? session.model : defaultModel);
    const path = id ? `/c/${id}/` : "/";
    if (location.pathname !== path) {
      const method = historyMode === "push" ? "pushState" : "replaceState";
      history[method]({ sessionId: id }, "", path);
    }
  },
  onRenamed(session) {
    sidebar.upsert(session);
    if (session.id === chat.currentId) $("session-title").textContent = session.title;
  },
  onRunStarted(sessionId) {
    sidebar.setRunning(sessionId, true);
  },
  onRunFinished(sessionId) {
    sidebar.setRunning(sessionId, false);
  },
});

const sidebar = new Sidebar({
  onSelect: (id) => {
    if (PHONE_QUERY.matches) setSidebarOpen(false);
    openSession(id);
  },
  onDeleted: (id) => {
    if (id === chat.currentId) openSession(null, { push: false });
  },
  onRenamed: (id, session) => chat.ui.onRenamed(session),
  onRun: (note) => chat.onRunNote(note),
});

/** Show session `id` (null: a blank new chat); `push` adds a history entry. */
async function openSession(id, { push = true } = {}) {
  historyMode = push ? "push" : "replace";
  try {
    await chat.load(id);
  } catch (error) {
    if (error.status === 404) {
      historyMode = "replace";
      await chat.load(null);
      chat.ui.setError("That chat does not exist (or is not yours).");
    } else {
      chat.ui.setError(`Could not open the chat: ${error.message}`);
    }
  }
  input.focus({ preventScroll: true });
}

handleCodeCopy($("messages"));

// --- composer ----------------------------------------------------------------------

function autoGrow() {
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, 240)}px`;
}

async function submit() {
  const content = input.value;
  if (!content.trim()) return;
  input.value = "";
  autoGrow();
  const sent = await chat.send(content);
  if (!sent && !input.value) input.value = content; // keep what was not sent
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  submit();
});
input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    if (!chat.running) submit();
  }
});
input.addEventListener("input", autoGrow);
$("stop").addEventListener("click", () => chat.stop());
$("retry").addEventListener("click", () => chat.retry());
$("new-session").addEventListener("click", () => {
  if (PHONE_QUERY.matches) setSidebarOpen(false);
  openSession(null);
});

// --- model picker and system prompt ---------------------------------------------------

function selectModel(model) {
  if (model && ![...picker.options].some((o) => o.value === model)) {
    picker.append(new Option(model, model)); // a model the list no longer offers
  }
  picker.value = model || (picker.options[0] ? picker.options[0].value : "");
}

async function loadModels() {
  try {
    const data = await api(urls.models());
    defaultModel = data.default || "";
    picker.replaceChildren(
      ...data.models.map((m) => new Option(`${m.id} · ${m.provider}`, m.id)),
    );
  } catch {
    picker.replaceChildren(new Option("default model", "")); // no /api/models/
  }
  selectModel(chat.session && chat.session.model ? chat.session.model : defaultModel);
}

picker.addEventListener("change", async () => {
  if (!chat.session) return;
  try {
    chat.session = { ...chat.session, ...(await patchSession({ model: picker.value })) };
  } catch (error) {
    chat.ui.setError(`Model not changed: ${error.message}`);
  }
});

function patchSession(body) {
  return api(urls.session(chat.currentId), { method: "PATCH", body });
}

$("save-settings").addEventListener("click", async () => {
  const saved = $("settings-saved");
  if (chat.session) {
    try {
      await patchSession({ system_prompt: promptBox.value });
    } catch (error) {
      chat.ui.setError(`System prompt not saved: ${error.message}`);
      return;
    }
  }
  saved.textContent = chat.session ? "Saved" : "Used for the next new chat";
  saved.hidden = false;
  setTimeout(() => {
    saved.hidden = true;
  }, 2000);
});

// --- coming back: sleep, network, back/forward cache --------------------------------

document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") chat.resync();
});
window.addEventListener("online", () => {
  setBanner("");
  chat.resync();
  sidebar.refresh().catch(() => {});
});
window.addEventListener("offline", () => chat.offline());
window.addEventListener("pageshow", (event) => {
  if (event.persisted) chat.resync();
});
window.addEventListener("popstate", () => {
  const match = location.pathname.match(/^\/c\/(\d+)\/$/);
  openSession(match ? Number(match[1]) : null, { push: false });
});

// --- start ----------------------------------------------------------------------------

async function start() {
  const initial = Number(app.dataset.initialSession) || null;
  await loadModels();
  let sessions = [];
  try {
    sessions = await sidebar.refresh();
  } catch (error) {
    chat.ui.setError(`Could not list chats: ${error.message}`);
  }
  sidebar.listen();
  const first = initial ?? (sessions[0] ? sessions[0].id : null);
  await openSession(first, { push: false });
  setSidebarOpen(false);
  app.dataset.ready = "true";
}

start();
