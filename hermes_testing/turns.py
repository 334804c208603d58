"""Chat's runs for tests: a journal run with its `chat.Turn`.

Kept apart from `hermes_testing.harness`, which the journal's own tests use
with `chat` not installed.
"""

from chat.models import ChatSession, Turn
from journal.models import Run

from .harness import running_run


def running_turn(owner, *, session: ChatSession, lease_s: float = 60) -> Run:
    """A chat run of `session` as a worker holds it right after claiming."""
    run = running_run(owner, lease_s=lease_s, subject=session.subject)
    Turn.objects.create(run=run, owner=owner, session=session)
    return run
