"""Start-up's objects stay out of full collections (hermes_site/heap.py)."""

import gc

import hermes_site.asgi


def test_the_web_app_start_up_freezes_its_heap():
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    hermes_site.asgi.warm_up()  # what loading the ASGI module runs
    assert gc.get_freeze_count() > 10_000
    gc.collect()
    assert gc.get_freeze_count() > 10_000  # a full pass leaves them frozen
