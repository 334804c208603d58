"""The in-memory channel layer's own `send` (hermes_site/channel_layers.py)."""

import asyncio

import pytest
from channels.exceptions import ChannelFull

from hermes_site.channel_layers import HermesInMemoryChannelLayer


class Opaque:
    def __init__(self):
        self.items = [1]


def test_a_received_message_shares_nothing_the_sender_can_change():
    async def go():
        layer = HermesInMemoryChannelLayer()
        opaque = Opaque()
        events = [[1, "token", '{"text":"a"}'], [2, "token", '{"text":"b"}']]
        message = {"type": "journal.events", "events": events, "extra": opaque}
        message["pair"] = (3, "x")
        await layer.send("hub.one", message)
        events[0][1] = "changed"
        events.append([3, "end", "{}"])
        opaque.items.append(2)
        message["type"] = "changed"
        return await layer.receive("hub.one")

    received = asyncio.run(go())
    assert received["type"] == "journal.events"
    assert received["events"] == [
        [1, "token", '{"text":"a"}'],
        [2, "token", '{"text":"b"}'],
    ]
    assert received["extra"].items == [1]  # not plain data: deep-copied
    assert received["pair"] == (3, "x")


def test_a_full_channel_refuses_the_message():
    async def go():
        layer = HermesInMemoryChannelLayer(capacity=1)
        await layer.send("hub.full", {"type": "a"})
        with pytest.raises(ChannelFull):
            await layer.send("hub.full", {"type": "b"})
        return await layer.receive("hub.full")

    assert asyncio.run(go()) == {"type": "a"}


def test_group_send_reaches_every_member_with_its_own_copy():
    async def go():
        layer = HermesInMemoryChannelLayer()
        await layer.group_add("run-x", "hub.a")
        await layer.group_add("run-x", "hub.b")
        await layer.group_send_many([("run-x", {"type": "t", "events": [[1]]})])
        a = await layer.receive("hub.a")
        b = await layer.receive("hub.b")
        a["events"][0].append("mutated by one receiver")
        return a, b

    a, b = asyncio.run(go())
    assert b == {"type": "t", "events": [[1]]}
    assert a["events"] == [[1, "mutated by one receiver"]]
