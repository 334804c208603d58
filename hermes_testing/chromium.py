"""One Chromium for the browser tests, which a close that hangs cannot stall.

Closing a browser context whose pages ran a SharedWorker has been seen to
hang inside Chromium: the close is never answered and the suite waits for
ever. Every Chromium launched here carries a marker switch of its own on its
command line; a close that has not returned after `CLOSE_BOUND_S` kills that
Chromium (Playwright then fails the pending call at once) and the next test
gets a new browser. The bound is generous: a close takes milliseconds.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Browser, BrowserContext, Error, Playwright

CLOSE_BOUND_S = 30.0


class BoundedChromium:
    """Launches Chromium on demand and closes contexts within a bound."""

    def __init__(self, playwright: Playwright, executable: str, args: list[str]):
        self._playwright = playwright
        self._executable = executable
        self._args = args
        self._browser: Browser | None = None
        self._marker = ""

    @property
    def browser(self) -> Browser:
        """The running Chromium, launched anew if the last one was killed."""
        if self._browser is None or not self._browser.is_connected():
            self._marker = f"--hermes-test-browser={uuid.uuid4().hex}"
            self._browser = self._playwright.chromium.launch(
                executable_path=self._executable, args=[*self._args, self._marker]
            )
        return self._browser

    def close_context(self, context: BrowserContext) -> None:
        """Close `context`: its pages first (a SharedWorker ends with its last
        page), then the context itself."""

        def close() -> None:
            for page in context.pages:
                page.close(run_before_unload=False)
            context.close()

        self._bounded(close, "a browser context")

    def close(self) -> None:
        if self._browser is not None and self._browser.is_connected():
            self._bounded(self._browser.close, "Chromium")
        self._browser = None

    def _bounded(self, close: Callable[[], None], what: str) -> None:
        marker = self._marker
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            kill_marked(marker)

        timer = threading.Timer(CLOSE_BOUND_S, kill)
        timer.daemon = True
        timer.start()
        try:
            close()
        except Error:
            if not killed.is_set():
                raise
        finally:
            timer.cancel()
        if killed.is_set():
            warnings.warn(
                f"closing {what} took over {CLOSE_BOUND_S:g} s: Chromium was "
                "killed and is launched anew",
                stacklevel=2,
            )
            self._browser = None


def kill_marked(marker: str) -> int:
    """SIGKILL every process whose command line holds `marker`; how many."""
    needle = marker.encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "cmdline").read_bytes().split(b"\0"):
                continue
            os.kill(int(entry.name), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours
            continue
        killed += 1
    return killed
