/** The account page: the copy button of a freshly made API token. */
import { copyText } from "./clipboard.js";

for (const button of document.querySelectorAll(".copy-token")) {
  button.addEventListener("click", async () => {
    const done = await copyText(button.dataset.copy);
    button.textContent = done ? "Copied" : "Copy failed";
  });
}
