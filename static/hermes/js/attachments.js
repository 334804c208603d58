/**
 * Attachments on the page (docs/architecture.md §5, chat/attachments.py):
 * the composer's tray of files picked, dropped or pasted — each uploaded at
 * once (`POST /api/attachments/`) and shown as a chip with a remove button —
 * and the chips a sent message shows in the transcript (an image as a
 * thumbnail). The server checks every file again; the tray only spares the
 * user a round trip it knows would fail (too many files, too large, an image
 * for a model that does not take images).
 */
import { api, urls } from "./api.js";

const IMAGE_NAME = /\.(png|jpe?g|gif|webp)$/i;
// What the file picker offers when the model takes no images: text and code.
const TEXT_ACCEPT = [
  "text/*",
  ...".txt .md .py .js .ts .json .jsonl .csv .yaml .yml .toml .html .css .sql .sh .go .rs .java .c .cpp .h .rb .php .log .xml".split(" "),
].join(",");

/** "12.3 KB": a size for people. */
export function formatSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

function looksLikeImage(file) {
  return (file.type || "").startsWith("image/") && file.type !== "image/svg+xml"
    ? true
    : IMAGE_NAME.test(file.name || "");
}

/**
 * The files sent with a message, for the transcript: thumbnails of images,
 * chips of text files; every name is text, never markup.
 * @param {Array<{id, name, kind, size, url}>} files
 */
export function attachmentList(files) {
  const list = document.createElement("div");
  list.className = "attachment-list";
  list.dataset.testid = "message-attachments";
  for (const file of files) {
    const link = document.createElement("a");
    link.className = `attachment-chip ${file.kind}`;
    link.dataset.testid = "message-attachment";
    link.dataset.kind = file.kind;
    link.href = file.url;
    link.title = `${file.name} (${formatSize(file.size)})`;
    if (file.kind === "image") {
      link.target = "_blank";
      link.rel = "noopener";
      const img = document.createElement("img");
      img.src = file.url;
      img.alt = file.name;
      img.loading = "lazy";
      img.dataset.testid = "attachment-thumb";
      link.append(img);
    } else {
      link.download = file.name;
      link.append(chipLabel(file.name, file.size));
    }
    list.append(link);
  }
  return list;
}

function chipLabel(name, size) {
  const label = document.createElement("span");
  label.className = "chip-label";
  const badge = document.createElement("span");
  badge.className = "chip-badge";
  const dot = name.lastIndexOf(".");
  badge.textContent = (dot > 0 ? name.slice(dot + 1, dot + 5) : "file").toUpperCase();
  label.append(badge);
  const strong = document.createElement("span");
  strong.className = "chip-name";
  strong.dataset.testid = "attachment-name";
  strong.textContent = name;
  const small = document.createElement("span");
  small.className = "chip-size muted";
  small.dataset.testid = "attachment-size";
  small.textContent = formatSize(size);
  label.append(strong, small);
  return label;
}

export class AttachmentTray {
  /**
   * @param {{container: HTMLElement, input: HTMLInputElement, limits: {maxFiles: number,
   *   maxBytes: number}, modelTakesImages: () => boolean, modelName: () => string,
   *   onError: (text: string) => void}} options
   */
  constructor({ container, input, limits, modelTakesImages, modelName, onError }) {
    this.container = container;
    this.input = input;
    this.limits = limits;
    this.modelTakesImages = modelTakesImages;
    this.modelName = modelName;
    this.onError = onError;
    this.items = []; // {chip, name, size, kind, id|null, url}
    this.queue = Promise.resolve();
    input.addEventListener("change", () => {
      this.add([...input.files]);
      input.value = ""; // the same file can be picked again
    });
  }

  /** Which files the picker offers: no images for a model that takes none. */
  refreshAccept() {
    this.input.accept = this.modelTakesImages() ? "" : TEXT_ACCEPT;
    this.input.dataset.images = String(this.modelTakesImages());
    const images = this.items.filter((item) => item.kind === "image");
    if (images.length && !this.modelTakesImages()) {
      this.onError(
        `${this.modelName()} does not take images: remove ${images.map((i) => i.name).join(", ")} or choose a model that does.`,
      );
    }
  }

  get hasFiles() {
    return this.items.length > 0;
  }

  get uploading() {
    return this.items.some((item) => item.id === null);
  }

  get hasImages() {
    return this.items.some((item) => item.kind === "image");
  }

  /** The uploaded files, as a sent message lists them. */
  files() {
    return this.items
      .filter((item) => item.id !== null)
      .map(({ id, name, kind, size, url }) => ({ id, name, kind, size, url }));
  }

  /** Take files the user picked, dropped or pasted. */
  add(files) {
    const refused = [];
    for (const file of files) {
      if (this.items.length >= this.limits.maxFiles) {
        refused.push(`${file.name}: at most ${this.limits.maxFiles} files per message`);
      } else if (file.size > this.limits.maxBytes) {
        refused.push(
          `${file.name}: larger than ${formatSize(this.limits.maxBytes)}, the most a file may have`,
        );
      } else if (looksLikeImage(file) && !this.modelTakesImages()) {
        refused.push(`${file.name}: ${this.modelName()} does not take images`);
      } else {
        this.#upload(file);
      }
    }
    this.onError(refused.length ? `Not attached: ${refused.join("; ")}` : "");
  }

  /** Forget the files (they were sent with a message). */
  clear() {
    this.items = [];
    this.container.replaceChildren();
    this.container.hidden = true;
  }

  #upload(file) {
    const chip = document.createElement("span");
    chip.className = "attachment-chip pending";
    chip.dataset.testid = "composer-attachment";
    if (looksLikeImage(file)) {
      // A preview from the file itself (the page's CSP allows blob: images).
      const preview = document.createElement("img");
      preview.className = "chip-preview";
      preview.alt = "";
      preview.src = URL.createObjectURL(file);
      preview.addEventListener("load", () => URL.revokeObjectURL(preview.src), { once: true });
      chip.append(preview);
    }
    chip.append(chipLabel(file.name, file.size));
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "ghost icon chip-remove";
    remove.dataset.testid = "attachment-remove";
    remove.title = `Remove ${file.name}`;
    remove.textContent = "✕";
    chip.append(remove);
    this.container.append(chip);
    this.container.hidden = false;
    const item = {
      chip,
      name: file.name,
      size: file.size,
      kind: looksLikeImage(file) ? "image" : "text",
      id: null,
      url: "",
    };
    this.items.push(item);
    remove.addEventListener("click", () => this.#remove(item));
    const form = new FormData();
    form.append("file", file, file.name);
    // One upload at a time: the server numbers files in the order they
    // arrive, which is the order a message shows them in.
    this.queue = this.queue
      .then(() => api(urls.attachments(), { method: "POST", form }))
      .then((made) => {
        Object.assign(item, { id: made.id, kind: made.kind, url: made.url, size: made.size });
        chip.classList.remove("pending");
        chip.dataset.kind = made.kind;
        chip.dataset.id = String(made.id);
        if (!this.items.includes(item)) this.#forget(made.id); // removed meanwhile
      })
      .catch((error) => {
        this.#drop(item);
        this.onError(`Not attached: ${error.message}`);
      });
  }

  #remove(item) {
    this.#drop(item);
    if (item.id !== null) this.#forget(item.id);
  }

  #drop(item) {
    this.items = this.items.filter((other) => other !== item);
    item.chip.remove();
    this.container.hidden = this.items.length === 0;
  }

  #forget(id) {
    api(urls.attachment(id), { method: "DELETE" }).catch(() => {
      /* dropped by the server after a day anyway */
    });
  }
}
