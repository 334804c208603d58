"""The embedded deployment's channel layer."""

import time

from channels.layers import InMemoryChannelLayer

CLEAN_EVERY_S = 1.0  # expiry is 60 s: sweeping once a second loses nothing


class HermesInMemoryChannelLayer(InMemoryChannelLayer):
    """Channels' in-memory layer, sweeping expired messages at most once a second.

    The stock layer walks every channel and group on every send and receive;
    with a few hundred runs streaming, that walk was a seventh of the event
    loop's time (docs/benchmarks.md).
    """

    _swept_at = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at < CLEAN_EVERY_S:
            return
        self._swept_at = now
        super()._clean_expired()
