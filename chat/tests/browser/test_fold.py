"""The page folds a journal exactly as the server does: the same journals go
through `journal.fold` and through the page's `fold.js` (the module its turns
draw from), and the two folded turns are compared whole. With `usageSum` in
`fold.js` planted to keep the larger count instead of adding, both tests
fail."""

import pytest

from hermes_testing.browser import PYTESTMARK, page_fold
from hermes_testing.journals import JOURNALS, events_of
from journal.fold import Fold

pytestmark = PYTESTMARK


def python_fold(events: list[dict]) -> dict:
    fold = Fold()
    for event in events:
        fold.add(event["event"], event["data"], event["seq"])
    return fold.turn()


def test_the_page_and_the_server_fold_the_same_journals_alike(open_page, alice):
    journals = {name: events_of(journal) for name, journal in JOURNALS.items()}
    page = open_page(alice[0])
    folded = page_fold(page, journals)
    assert folded.keys() == journals.keys()
    for name, events in journals.items():
        assert folded[name] == python_fold(events), name


@pytest.mark.parametrize("name", ["tools-between-text", "usage-in-several-events"])
def test_the_folds_agree_on_every_prefix_of_a_journal(open_page, alice, name):
    """A reader may stop anywhere (a reload mid-run): every prefix folds alike."""
    events = events_of(JOURNALS[name])
    prefixes = {str(n): events[:n] for n in range(len(events) + 1)}
    page = open_page(alice[0])
    folded = page_fold(page, prefixes)
    for n, prefix in prefixes.items():
        assert folded[n] == python_fold(prefix), n
