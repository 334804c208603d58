"""Publishing committed events to the channel layer: the doorbell.
See docs/architecture.md §4, §5.6.

Only records that are already committed are published. A failed publish is
counted and forgotten: readers find the events in the journal anyway. Failures
are logged once per outage of the channel layer, with a count when it is back
(`journal.outages`).
"""

import json

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection, transaction

from . import dbpool
from .events import TERMINAL
from .models import Run
from .outages import CHANNEL_LAYER, outage
from .store import Record, append


def group_name(run_id: str) -> str:
    return f"run.{run_id}"


def owner_group(user_id: int) -> str:
    """Where a user's notifications go (every tab's sidebar listens)."""
    return f"user.{user_id}"


def message_for(run_id: str, records: list[Record]) -> dict:
    return {
        "type": "journal.events",
        "run": run_id,
        "events": [[r.seq, r.type, r.payload] for r in records],
    }


async def publish(run_id: str, records: list[Record]) -> None:
    if not records:
        return
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(group_name(run_id), message_for(run_id, records))
    except Exception as exc:  # the journal decides; a lost doorbell only slows readers
        outage(CHANNEL_LAYER).failed("publish", exc)
    else:
        outage(CHANNEL_LAYER).recovered()
    if records[-1].type == TERMINAL:
        await _announce_end(run_id, json.loads(records[-1].payload))


async def publish_many(batches: list[tuple[str, list[Record]]]) -> None:
    """`publish` for many runs at once: one batched send through the layer when
    it has one (`hermes_site.channel_layers`), each run's events in order."""
    batches = [(run_id, records) for run_id, records in batches if records]
    layer = get_channel_layer()
    if not batches or layer is None:
        return
    send_many = getattr(layer, "group_send_many", None)
    if send_many is None:
        for run_id, records in batches:
            await publish(run_id, records)
        return
    try:
        await send_many(
            [(group_name(run_id), message_for(run_id, rs)) for run_id, rs in batches]
        )
    except Exception as exc:  # the journal decides; a lost doorbell only slows readers
        outage(CHANNEL_LAYER).failed("publish", exc)
    else:
        outage(CHANNEL_LAYER).recovered()
    for run_id, records in batches:
        if records[-1].type == TERMINAL:
            await _announce_end(run_id, json.loads(records[-1].payload))


async def announce(user_id: int, event: str, data: dict) -> None:
    """Tell every open tab of a user (not journaled: tabs refetch on reconnect)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(
            owner_group(user_id), {"type": "user.notify", "event": event, "data": data}
        )
    except Exception as exc:
        outage(CHANNEL_LAYER).failed("announce", exc)
    else:
        outage(CHANNEL_LAYER).recovered()


def _owner_of(run_id: str) -> tuple[int, str] | None:
    """The run's owner and subject. One plain query: the ORM's building of it
    cost 220 µs of CPU against 18, paid at every run's end, and hundreds of
    runs may end together (docs/benchmarks.md, finding 32)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT owner_id, subject FROM {Run._meta.db_table} WHERE id = %s",
            [run_id],
        )
        return cursor.fetchone()


async def _announce_end(run_id: str, end: dict) -> None:
    owner = await dbpool.readers.run(_owner_of, run_id)
    if owner:
        owner_id, subject = owner
        await announce(
            owner_id,
            "run",
            {
                "action": "finished",
                "run_id": run_id,
                "subject": subject,
                "status": end["status"],
            },
        )


def publish_on_commit(run_id: str, records: list[Record]) -> None:
    """From sync code: publish once the surrounding transaction has committed."""
    transaction.on_commit(lambda: async_to_sync(publish)(run_id, records))


async def append_and_publish(
    *,
    run_id: str,
    token: int,
    events: list[tuple[str, dict]],
    run_fields: dict | None = None,
) -> list[Record]:
    """Append through the writer pool, then publish what was committed."""
    records = await dbpool.writers.run(
        append, run_id=run_id, token=token, events=events, run_fields=run_fields
    )
    await publish(run_id, records)
    return records
