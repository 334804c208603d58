/**
 * Model output to safe DOM: marked renders Markdown, DOMPurify sanitises the
 * HTML before it touches the page (model output is untrusted: an
 * `<img onerror>` or a `<script>` in it must never run), highlight.js colours
 * code blocks, each of which gets a copy button.
 */
import DOMPurify from "../../vendor/dompurify/purify.es.js";
import hljs from "../../vendor/highlight/highlight.min.js";
import { Marked } from "../../vendor/marked/marked.esm.js";
import { copyText } from "./clipboard.js";

const markdown = new Marked({ gfm: true, breaks: false, async: false });

const PURIFY_OPTIONS = {
  USE_PROFILE: { html: true },
  FORBID_TAGS: ["style", "form", "button", "textarea", "select"],
  FORBID_ATTR: ["style"],
  RETURN_DOM_FRAGMENT: true,
};

// Links from a model open elsewhere and learn nothing about this page.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

/** Sanitised DOM of a Markdown text. */
export function markdownFragment(text) {
  const html = markdown.parse(text || "");
  return DOMPurify.sanitize(html, PURIFY_OPTIONS);
}

/**
 * Replace `element`'s content with `text` rendered as Markdown.
 * @param {HTMLElement} element
 * @param {string} text
 * @param {{highlight?: boolean}} options skip highlighting while text streams fast
 */
export function renderMarkdown(element, text, { highlight = true } = {}) {
  element.replaceChildren(markdownFragment(text));
  for (const code of element.querySelectorAll("pre > code")) {
    decorateCodeBlock(code, highlight);
  }
}

function decorateCodeBlock(code, highlight) {
  const language = (code.className.match(/language-([\w+#-]+)/) || [])[1];
  if (highlight && language && hljs.getLanguage(language)) {
    hljs.highlightElement(code); // reads textContent and writes escaped spans
  } else {
    code.classList.add("hljs");
  }
  const pre = code.parentElement;
  const bar = document.createElement("div");
  bar.className = "code-bar";
  const label = document.createElement("span");
  label.className = "code-lang";
  label.textContent = language || "text";
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "code-copy";
  copy.dataset.testid = "copy-code";
  copy.textContent = "Copy";
  bar.append(label, copy);
  pre.prepend(bar);
}

/** One delegated listener serves every copy button under `root`. */
export function handleCodeCopy(root) {
  root.addEventListener("click", async (event) => {
    const button = event.target.closest(".code-copy");
    if (!button) return;
    const code = button.closest("pre")?.querySelector("code");
    if (!code) return;
    const done = await copyText(code.textContent);
    button.textContent = done ? "Copied" : "Copy failed";
    setTimeout(() => {
      button.textContent = "Copy";
    }, 1500);
  });
}
