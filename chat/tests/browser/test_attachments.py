"""Attachments on the page: a text file and an image picked, sent, shown in
the transcript (the image as a thumbnail the server serves) and again after
a reload (the picture in docs/screenshots/, which `make screenshots`
refreshes); a model without images is not offered one; drop attaches."""

import re

from playwright.sync_api import expect

from chat.models import Attachment
from hermes_testing.browser import PYTESTMARK, SCREENSHOTS, send, wait_settled
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from hermes_testing.images import png

pytestmark = PYTESTMARK

CODE = b'def greet(name):\n    return f"Hello, {name}!"\n'
IMAGE = png(96, 64)


def thumbnails_loaded(page, count: int) -> None:
    """`count` thumbnails drawn from the bytes the server sent (a broken image
    has no natural width)."""
    page.wait_for_function(
        """(n) => {
            const imgs = [
                ...document.querySelectorAll('[data-testid=attachment-thumb]'),
            ];
            const drawn = (i) => i.complete && i.naturalWidth === 96;
            return imgs.length === n && imgs.every(drawn);
        }""",
        arg=count,
    )


def test_a_text_file_and_an_image_are_sent_shown_and_kept_screenshot(
    open_page, alice, model, settings
):
    settings.HERMES = {**settings.HERMES, "VISION_MODELS": ["fake-model"]}
    model.push(Reply(text="A greeting function and a colour gradient."))
    page = open_page(alice[0], viewport={"width": 1100, "height": 720})
    expect(page.get_by_test_id("attach-file")).to_have_attribute("accept", "")
    page.get_by_test_id("attach-file").set_input_files(
        [
            {"name": "greet.py", "mimeType": "text/x-python", "buffer": CODE},
            {"name": "gradient.png", "mimeType": "image/png", "buffer": IMAGE},
        ]
    )
    chips = page.get_by_test_id("composer-attachment")
    expect(chips).to_have_count(2)
    expect(chips.and_(page.locator("[data-id]"))).to_have_count(2)  # uploaded
    expect(chips.nth(1).locator("img.chip-preview")).to_have_count(1)
    send(page, "What is in these?")
    wait_settled(page)
    expect(page.get_by_test_id("composer-attachments")).to_be_hidden()

    def check_transcript() -> None:
        question = page.get_by_test_id("user-message").last
        files = question.get_by_test_id("message-attachment")
        expect(files).to_have_count(2)
        expect(files.nth(0).get_by_test_id("attachment-name")).to_have_text("greet.py")
        expect(files.nth(0).get_by_test_id("attachment-size")).to_have_text(
            f"{len(CODE)} B"
        )
        expect(files.nth(1)).to_have_attribute("data-kind", "image")
        expect(files.nth(1)).to_have_attribute("title", re.compile("gradient.png"))
        thumbnails_loaded(page, 1)

    check_transcript()
    (request,) = model.requests
    parts = request.body["messages"][-1]["content"]
    assert parts[0]["text"].startswith("What is in these?\n\nFile: greet.py\n```py")
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "attachments.png"))

    page.reload()
    expect(page.get_by_test_id("app")).to_have_attribute("data-ready", "true")
    check_transcript()


def test_no_image_for_a_model_without_images_and_a_drop_attaches(
    open_page, alice, model
):
    page = open_page(alice[0])
    field = page.get_by_test_id("attach-file")
    expect(field).to_have_attribute("accept", re.compile(r"text/\*"))
    field.set_input_files(
        [{"name": "photo.png", "mimeType": "image/png", "buffer": IMAGE}]
    )
    expect(page.get_by_test_id("composer-error")).to_contain_text(
        "photo.png: fake-model does not take images"
    )
    expect(page.get_by_test_id("composer-attachment")).to_have_count(0)

    # A file dropped on the composer attaches; its chip removes it again.
    page.evaluate(
        """() => {
            const data = new DataTransfer();
            const file = new File(["one line\\n"], "notes.md", {type: "text/markdown"});
            data.items.add(file);
            const composer = document.querySelector('[data-testid=composer]');
            const options = {dataTransfer: data, bubbles: true, cancelable: true};
            composer.dispatchEvent(new DragEvent('drop', options));
        }"""
    )
    chip = page.get_by_test_id("composer-attachment")
    expect(chip).to_have_count(1)
    expect(chip).to_contain_text("notes.md")
    expect(chip).to_have_attribute("data-id", re.compile(r"\d+"))
    expect(page.get_by_test_id("composer-error")).to_be_hidden()
    chip.get_by_test_id("attachment-remove").click()
    expect(chip).to_have_count(0)
    wait_until(lambda: not Attachment.objects.exists())  # dropped on the server too

    # A file pasted into the message box attaches; one the server refuses is
    # named with the server's reason.
    page.evaluate(
        """() => {
            const data = new DataTransfer();
            const code = {type: "text/x-python"};
            data.items.add(new File(["x = 1\\n"], "pasted.py", code));
            data.items.add(new File([new Uint8Array([77, 90, 0, 3])], "tool.exe"));
            const box = document.querySelector('[data-testid=composer-input]');
            box.dispatchEvent(new ClipboardEvent('paste', {clipboardData: data}));
        }"""
    )
    expect(chip).to_have_count(1)
    expect(chip).to_contain_text("pasted.py")
    expect(page.get_by_test_id("composer-error")).to_contain_text(
        "Not attached: tool.exe: this type of file is not taken"
    )
