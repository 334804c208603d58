/**
 * The chat page's entry point: wires the sidebar, the chat controller, the
 * composer, the model picker, the system prompt, the theme toggle and the
 * phone layout together. No inline handlers anywhere (the page's CSP forbids
 * inline script); everything is attached here.
 */
import { api, urls } from "./api.js";
import { AttachmentTray } from "./attachments.js";
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
const modelInfo = new Map(); // model id -> its entry in /api/models/ ({vision, …})
let historyMode = "replace"; // how the next load updates the address bar

// --- chrome: sidebar on phones, theme ------------------------------------------

/** A model in the picker: its id, its provider, and the provider's API when
 *  that is not plain OpenAI-compatible (`anthropic`, `responses`). */
function modelLabel(m) {
  const kind = m.kind && m.kind !== m.provider && m.kind !== "openai";
  return `${m.id} · ${m.provider}${kind ? ` (${m.kind})` : ""}${m.vision ? " · images" : ""}`;
}

/** Whether the picked model takes images (unknown: the server decides). */
function modelTakesImages() {
  const known = modelInfo.get(picker.value);
  return known ? Boolean(known.vision) : modelInfo.size === 0;
}

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

// The run's stream and the notification stream: either one reconnecting (a
// restart, a 503 while the database is away) shows it; both recover by themselves.
const connection = { stream: "", notes: "" };

function showConnection() {
  if (connection.stream === "offline" || !navigator.onLine) {
    setBanner("You are offline. The answer goes on; it resumes here when you are back.");
  } else if (connection.stream === "reconnecting" || connection.notes === "reconnecting") {
    setBanner("Reconnecting…");
  } else {
    setBanner("");
  }
}

const chat = new ChatController({
  messages: $("messages"),
  emptyState: $("empty-state"),
  stopButton: $("stop"),
  pendingList: $("pending"),
  selectedModel: () => picker.value,
  pendingSystemPrompt: () => promptBox.value.trim(),
  setError(text) {
    $("composer-error").textContent = text;
    $("composer-error").hidden = !text;
  },
  setControls({ running, sending, canRetry }) {
    app.dataset.runState = running ? "running" : sending ? "sending" : "idle";
    // While an answer is written the composer stays open: Send queues the
    // message as the next turn, Steer sends it into the answer (chat.pending).
    $("send").textContent = running ? "Queue" : "Send";
    $("send").title = running ? "Send as the next turn, when this answer ends (Enter)" : "";
    $("send").disabled = sending;
    $("steer").hidden = !running;
    input.placeholder = running
      ? "Queue a message (Enter) or steer the answer (Ctrl+Enter)"
      : "Send a message (Enter to send, Shift+Enter for a new line)";
    $("stop").hidden = !running;
    if (!running) {
      $("stop").disabled = false;
      $("stop").textContent = "Stop";
    }
    $("retry").hidden = !canRetry;
  },
  onStreamState(state) {
    app.dataset.streamState = state;
    connection.stream = state;
    showConnection();
  },
  onSession(session, { created = false } = {}) {
    const id = session ? session.id : null;
    sidebar.setCurrent(id);
    if (created) sidebar.upsert(session);
    $("session-title").textContent = session ? session.title : "New chat";
    document.title = session ? `${session.title} · Hermes` : "Hermes";
    if (session) promptBox.value = session.system_prompt || "";
    selectModel(session && session.model ? session.model : defaultModel);
    tray.refreshAccept();
    picker.dataset.sessionModel = session ? session.model : "";
    showExport(id);
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
  onRunStarted(sessionId, runId) {
    sidebar.setRunning(sessionId, true, runId);
  },
  onRunFinished(sessionId, runId) {
    sidebar.setRunning(sessionId, false, runId);
  },
});

const sidebar = new Sidebar({
  onSelect: (id, { reveal = null } = {}) => {
    if (PHONE_QUERY.matches) setSidebarOpen(false);
    openSession(id, { reveal });
  },
  onDeleted: (id) => {
    if (id === chat.currentId) openSession(null, { push: false });
  },
  onRenamed: (id, session) => chat.ui.onRenamed(session),
  onRun: (note) => chat.onRunNote(note),
  onQueue: (note) => chat.onQueueNote(note),
  onConnection: (state) => {
    app.dataset.notesState = state;
    connection.notes = state;
    showConnection();
  },
});

/** Show session `id` (null: a blank new chat); `push` adds a history entry. */
/** Show chat `id`; `reveal`: a message id to scroll to (a search hit). */
async function openSession(id, { push = true, reveal = null } = {}) {
  historyMode = push ? "push" : "replace";
  try {
    if (reveal && id === chat.currentId && chat.conversation.reveal(reveal)) return;
    await chat.load(id);
    // A hit on another branch switches to that branch (chat.reveal).
    if (reveal && id === chat.currentId) await chat.reveal(reveal);
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

// --- attachments: the attach button, drag and drop, paste -----------------------

const tray = new AttachmentTray({
  container: $("composer-attachments"),
  input: $("attach-file"),
  limits: {
    maxFiles: Number(app.dataset.attachmentMaxFiles) || 5,
    maxBytes: Number(app.dataset.attachmentMaxBytes) || 5 * 1024 * 1024,
  },
  modelTakesImages,
  modelName: () => picker.value || "this model",
  onError: (text) => chat.ui.setError(text),
});
$("attach").addEventListener("click", () => $("attach-file").click());
const composer = $("composer");
composer.addEventListener("dragover", (event) => {
  if (![...(event.dataTransfer?.types || [])].includes("Files")) return;
  event.preventDefault(); // a drop here attaches, not opens the file
  composer.classList.add("dropping");
});
composer.addEventListener("dragleave", (event) => {
  if (!composer.contains(event.relatedTarget)) composer.classList.remove("dropping");
});
composer.addEventListener("drop", (event) => {
  composer.classList.remove("dropping");
  const files = [...(event.dataTransfer?.files || [])];
  if (!files.length) return;
  event.preventDefault();
  tray.add(files);
});
input.addEventListener("paste", (event) => {
  const files = [...(event.clipboardData?.files || [])];
  if (!files.length) return;
  // A copied image (a screenshot) attaches; copied text is pasted as usual.
  if (!event.clipboardData.types.includes("text/plain")) event.preventDefault();
  tray.add(files);
});

/** Send the message; while an answer is written, queue it (`kind` "queue")
 *  or steer the answer with it ("steer"). */
async function submit(kind = "queue") {
  if (chat.running) {
    await queueOrSteer(kind);
    return;
  }
  const content = input.value;
  if (!content.trim() && !tray.hasFiles) return;
  if (tray.uploading) {
    chat.ui.setError("Wait for the files to finish uploading.");
    return;
  }
  if (tray.hasImages && !modelTakesImages()) {
    chat.ui.setError(
      `${picker.value} does not take images: remove them or choose a model that does.`,
    );
    return;
  }
  const files = tray.files();
  input.value = "";
  autoGrow();
  const sent = await chat.send(content, files);
  if (sent) tray.clear();
  else if (!input.value) input.value = content; // keep what was not sent
}

/** Queue and steer carry text only (chat.pending): attached files wait for Send. */
async function queueOrSteer(kind) {
  const content = input.value;
  if (!content.trim()) return;
  input.value = "";
  autoGrow();
  const taken = await chat.queue(content, kind);
  if (!taken && !input.value) input.value = content; // keep what was not taken
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  submit();
});
// An answer cut at its output limit offers Continue: the person's next
// message asks the model to go on (a message of theirs, shown as such).
document.addEventListener("hermes:continue", () => {
  chat.send("Continue from where you stopped.");
});
input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    const steer = event.ctrlKey || event.metaKey;
    if (steer && !chat.running) return;
    submit(steer ? "steer" : "queue");
  }
});
input.addEventListener("input", autoGrow);
$("stop").addEventListener("click", () => chat.stop());
$("steer").addEventListener("click", () => submit("steer"));
$("retry").addEventListener("click", () => chat.retry());
$("new-session").addEventListener("click", () => {
  if (PHONE_QUERY.matches) setSidebarOpen(false);
  openSession(null);
});

// --- export and import -------------------------------------------------------------

function showExport(id) {
  $("export-row").hidden = !id;
  $("export-markdown").href = id ? urls.exportAs(id, "markdown") : "#";
  $("export-json").href = id ? urls.exportAs(id, "json") : "#";
}

$("import-session").addEventListener("click", () => $("import-file").click());
$("import-file").addEventListener("change", async () => {
  const field = $("import-file");
  const file = field.files && field.files[0];
  field.value = ""; // the same file can be picked again
  if (!file) return;
  try {
    const made = await api(urls.importSession(), {
      method: "POST",
      file: new Blob([file], { type: "application/x-ndjson" }),
    });
    sidebar.upsert(made.session);
    await openSession(made.session.id);
  } catch (error) {
    const where = error.body && error.body.line ? "" : ` (${file.name})`;
    chat.ui.setError(`Not imported${where}: ${error.message}`);
  }
});

// --- keyboard shortcuts (listed in the page's "?" help) -----------------------------

const shortcuts = $("shortcuts");

function typingIn(target) {
  return target instanceof Element && target.closest("input, textarea, select, [contenteditable]");
}

function toggleShortcuts() {
  if (shortcuts.open) shortcuts.close();
  else shortcuts.showModal();
}

$("shortcuts-open").addEventListener("click", toggleShortcuts);
document.addEventListener("keydown", (event) => {
  if (event.isComposing || event.defaultPrevented) return;
  const mod = event.ctrlKey || event.metaKey;
  const key = event.key;
  let action = null;
  if (mod && event.shiftKey && key.toLowerCase() === "o") {
    action = () => openSession(null);
  } else if (mod && key === "/") {
    action = toggleShortcuts;
  } else if (key === "Escape" && event.shiftKey) {
    action = () => input.focus();
  } else if (key === "Escape" && chat.running && !shortcuts.open) {
    // Not while renaming a chat: there Escape cancels the rename.
    if (event.target instanceof Element && event.target.closest(".rename-input")) return;
    action = () => chat.stop();
  } else if (!mod && !typingIn(event.target) && !shortcuts.open) {
    if (key === "?") action = toggleShortcuts;
    else if (key === "/") action = () => input.focus();
  }
  if (!action) return;
  event.preventDefault();
  action();
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
    modelInfo.clear();
    for (const m of data.models) modelInfo.set(m.id, m);
    picker.replaceChildren(
      ...data.models.map((m) => {
        const option = new Option(modelLabel(m), m.id);
        option.dataset.vision = String(Boolean(m.vision));
        return option;
      }),
    );
  } catch {
    picker.replaceChildren(new Option("default model", "")); // no /api/models/
  }
  selectModel(chat.session && chat.session.model ? chat.session.model : defaultModel);
  tray.refreshAccept();
}

picker.addEventListener("change", async () => {
  chat.ui.setError("");
  tray.refreshAccept();
  const id = chat.currentId;
  if (!id) return;
  try {
    const saved = await patchSession(id, { model: picker.value });
    chat.updateSession(saved); // in place: a message sent meanwhile keeps its stream
    if (saved.id === chat.currentId) picker.dataset.sessionModel = saved.model;
  } catch (error) {
    chat.ui.setError(`Model not changed: ${error.message}`);
  }
});

function patchSession(id, body) {
  return api(urls.session(id), { method: "PATCH", body });
}

$("save-settings").addEventListener("click", async () => {
  const saved = $("settings-saved");
  if (chat.session) {
    try {
      chat.updateSession(await patchSession(chat.currentId, { system_prompt: promptBox.value }));
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
