"""What a long-lived server process does with the objects of its start-up."""

import gc


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
