"""Taking over a run whose worker was lost while it read an upstream stream.

See docs/architecture.md, "Two cursors". A provider that keeps responses
upstream (the Responses API in background mode) hands the turn engine cursors,
which the runner journals as `upstream` events. When the run's worker is lost,
`journal.leases` queues the run again instead of settling it, and the worker
that claims it re-attaches where the journal says (`stream_to_reattach`).
"""

import json

from journal.leases import open_upstream
from journal.models import Event

from .providers.base import Upstream
from .turn import Reattach


def stream_to_reattach(*, run_id: str) -> Reattach | None:
    """The upstream stream a lost worker was reading, if the journal ends in one.

    journal.leases queues such a run again instead of settling it; here the
    stream's text so far is rebuilt from the journal: every token and reasoning
    event since the stream's first cursor, the last cursor saying where to
    re-attach and how much of that text was shown by then.
    """
    last = open_upstream(run_id)
    if last is None:
        return None
    cursor = json.loads(last.payload)
    response_id = cursor["response_id"]
    first_seq = last.seq
    for record in Event.objects.filter(run_id=run_id, type="upstream").order_by("-seq"):
        if json.loads(record.payload)["response_id"] != response_id:
            break
        first_seq = record.seq
    shown: dict[str, list[str]] = {"token": [], "reasoning": []}
    for kind, payload in (
        Event.objects.filter(
            run_id=run_id, seq__gt=first_seq, type__in=("token", "reasoning")
        )
        .order_by("seq")
        .values_list("type", "payload")
    ):
        shown[kind].append(json.loads(payload)["text"])
    return Reattach(
        Upstream(response_id, cursor["sequence_number"]),
        content="".join(shown["token"]),
        reasoning="".join(shown["reasoning"]),
        content_at_cursor=cursor["content_chars"],
        reasoning_at_cursor=cursor["reasoning_chars"],
    )
