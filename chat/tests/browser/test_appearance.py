"""How the page looks: light, dark and phone screenshots (`make screenshots`
refreshes the README's), and the theme toggle."""

import pytest
from playwright.sync_api import expect

from hermes_testing.browser import (
    PYTESTMARK,
    SCREENSHOTS,
    last_turn,
    send,
    wait_settled,
)
from hermes_testing.fake_llm import Reply

pytestmark = PYTESTMARK


SHOWCASE = """Here is a **Python** function that reads a run's journal:

```python
def replay(run_id: str, after_seq: int = 0) -> list[dict]:
    \"\"\"Every event after the cursor, in order.\"\"\"
    return [e.payload for e in read_after(run_id=run_id, after_seq=after_seq)]
```

- the cursor is the last `seq` a reader applied
- nothing is skipped, nothing is sent twice
"""


@pytest.mark.parametrize(
    ("name", "options"),
    [
        (
            "chat-light",
            {"color_scheme": "light", "viewport": {"width": 1280, "height": 800}},
        ),
        (
            "chat-dark",
            {"color_scheme": "dark", "viewport": {"width": 1280, "height": 800}},
        ),
        (
            "chat-phone",
            {
                "color_scheme": "light",
                "viewport": {"width": 390, "height": 844},
                "device_scale_factor": 2,
                "is_mobile": True,
                "has_touch": True,
            },
        ),
    ],
)
def test_screenshots(open_page, alice, model, name, options):
    usage = {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}
    model.push(
        Reply(text="Hello! Ask me anything.", usage=usage, tokens_per_s=50),
        Reply(
            text=SHOWCASE,
            reasoning="The user wants an example of reading the journal.",
            tokens_per_s=120,
        ),
    )
    page = open_page(alice[0], **options)
    send(page, "Hi there")
    wait_settled(page)
    send(page, "Show me how a reader replays a run")
    wait_settled(page)
    expect(last_turn(page).locator("pre code.hljs")).to_have_count(1)
    expect(last_turn(page).get_by_test_id("copy-code")).to_be_visible()
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    dark = options["color_scheme"] == "dark"
    assert (background == "rgb(22, 24, 28)") is dark, background
    if options["viewport"]["width"] < 760:
        expect(page.get_by_test_id("sidebar")).not_to_be_in_viewport()
        expect(page.get_by_test_id("sidebar-toggle")).to_be_visible()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def test_theme_toggle_pins_dark_and_survives_reload(open_page, alice, model):
    page = open_page(alice[0], color_scheme="light")
    toggle = page.get_by_test_id("theme-toggle")
    expect(toggle).to_have_text("Theme: auto")
    toggle.click()
    expect(toggle).to_have_text("Theme: light")
    toggle.click()
    expect(toggle).to_have_text("Theme: dark")
    assert (
        page.evaluate("getComputedStyle(document.body).backgroundColor")
        == "rgb(22, 24, 28)"
    )
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
