"""What a long-lived server process does with the garbage collector: its
start-up objects frozen, its full collections paced (docs/benchmarks.md,
findings 19 and 33)."""

import gc
import threading

from django.conf import settings

# The oldest generation's threshold while full collections are paced: one the
# collector's own rule never reaches (it counts the middle generation's passes).
UNREACHED = 1_000_000_000


def freeze_startup_heap() -> None:
    """Keep start-up's objects out of the garbage collector's full passes.

    Django, the apps and their imports leave about 200,000 objects that live
    as long as the process. Each full collection walked them all on the
    event loop's thread: 65–80 ms with every stream stalled, every few
    seconds while hundreds of runs stream (docs/benchmarks.md). `gc.freeze`
    moves them to a generation the collector never visits; objects made
    later are collected as before.
    """
    gc.collect()
    gc.freeze()


class _Pacer:
    """The thread that runs the process's full collections, one every `every_s`."""

    def __init__(self, every_s: float, oldest_threshold: int):
        self.every_s = every_s
        self.oldest_threshold = oldest_threshold  # the collector's, to give back
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name="hermes-gc-full", daemon=True
        )

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            gc.collect()


_lock = threading.Lock()
_pacer: _Pacer | None = None


def pace_full_collections(every_s: float | None = None) -> bool:
    """Run the process's full collections every `every_s` seconds
    (`HERMES_GC_FULL_EVERY_S`, 60 by default; 0 leaves them to the collector's
    own rule), from a thread of their own. Returns whether they are paced.

    A full pass holds the GIL while it walks every object the process made
    since start-up: 15–80 ms with hundreds of streams open, each stream of the
    process stalled meanwhile. Under such load the collector's own rule calls
    one every second or few, as a quarter as many objects again have outlived
    two young passes, so that the stalls set the tokens' p99 (findings 32, 33).
    Paced, one comes a minute. Young and middle passes run as before; they
    free almost all of the process's garbage cycles, and what reaches the
    oldest generation before it dies (a few hundred objects a second under
    that load) waits for the next paced pass.
    """
    every = settings.HERMES["GC_FULL_EVERY_S"] if every_s is None else every_s
    if every <= 0:
        return False
    global _pacer
    with _lock:
        young, middle, oldest = gc.get_threshold()
        if _pacer is not None:  # paced already: the new interval from the next pass
            _pacer.every_s = every
            return True
        _pacer = _Pacer(every, oldest)
        gc.set_threshold(young, middle, UNREACHED)
        _pacer.thread.start()
    return True


def unpace_full_collections() -> None:
    """Full collections back to the collector's own rule (tests)."""
    global _pacer
    with _lock:
        pacer, _pacer = _pacer, None
        if pacer is None:
            return
        pacer.stop.set()
        pacer.thread.join()
        young, middle, _oldest = gc.get_threshold()
        gc.set_threshold(young, middle, pacer.oldest_threshold)
