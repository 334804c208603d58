"""The Redis channel layer's batched receive (hermes_site/channel_layers.py),
against a redis-server of its own."""

import asyncio
from typing import Any

import pytest

from hermes_site.channel_layers import RECEIVE_BATCH, HermesRedisChannelLayer
from hermes_testing.private_servers import PrivateRedis

pytestmark = pytest.mark.skipif(
    not PrivateRedis.available(), reason="redis-server is not installed"
)


@pytest.fixture(scope="module")
def redis_url():
    with PrivateRedis() as redis:
        yield redis.url


def _layer(url: str) -> HermesRedisChannelLayer:
    return HermesRedisChannelLayer(hosts=[url], prefix="layer-test", capacity=10_000)


def _inbox_of(layer, channel: str) -> tuple[str, str, Any]:
    """The process inbox `channel`'s messages queue in, as the layer reads it:
    its key, its backup queue's key, and a connection to its server."""
    key, connection = layer._inbox(layer.non_local_name(channel))
    return key, layer._backup_channel_name(key), connection


async def _left_in_backup(layer, channel: str) -> int:
    """What the inbox's backup queue holds once every clean-up has run."""
    await asyncio.gather(*layer.receive_cleaners)
    _key, backup, connection = _inbox_of(layer, channel)
    return await connection.zcard(backup)


async def _drain(layer, channels: list[str], each: int) -> dict[str, list[int]]:
    async def one(channel: str) -> list[int]:
        return [(await layer.receive(channel))["n"] for _ in range(each)]

    got = await asyncio.wait_for(asyncio.gather(*(one(c) for c in channels)), 60)
    return dict(zip(channels, got, strict=True))


def test_many_waiting_messages_reach_their_channels_in_order_once(redis_url):
    count = RECEIVE_BATCH + 50  # more than one take

    async def go():
        layer = _layer(redis_url)
        channels = [await layer.new_channel() for _ in range(3)]
        for n in range(count):
            for channel in channels:
                await layer.send(channel, {"type": "t", "n": n})
        got = await _drain(layer, channels, count)
        left = await _left_in_backup(layer, channels[0])
        await layer.close_pools()
        return got, left

    got, left = asyncio.run(go())
    assert all(numbers == list(range(count)) for numbers in got.values()), got
    assert left == 0  # every message handed over left the backup queue


def test_a_take_interrupted_before_the_hand_over_is_read_again(redis_url):
    async def go():
        layer = _layer(redis_url)
        channel = await layer.new_channel()
        for n in range(5):
            await layer.send(channel, {"type": "t", "n": n})
        inbox, backup, connection = _inbox_of(layer, channel)
        # What a take leaves when it is interrupted after Redis ran it: the
        # first three moved to the backup queue, never handed over.
        taken = await connection.zpopmin(inbox, 3)
        await connection.zadd(backup, dict(taken))
        got = await _drain(layer, [channel], 5)
        left = await _left_in_backup(layer, channel)
        await layer.close_pools()
        return got[channel], left

    numbers, left = asyncio.run(go())
    assert numbers == [0, 1, 2, 3, 4]
    assert left == 0


def test_a_receive_with_nothing_waiting_blocks_until_a_message_comes(redis_url):
    async def go():
        layer = _layer(redis_url)
        channel = await layer.new_channel()
        receiving = asyncio.ensure_future(layer.receive(channel))
        await asyncio.sleep(0)
        assert not receiving.done()
        await layer.send(channel, {"type": "t", "n": 7})
        message = await asyncio.wait_for(receiving, 60)
        await layer.close_pools()
        return message

    assert asyncio.run(go()) == {"type": "t", "n": 7}


async def _counted(url: str) -> tuple[HermesRedisChannelLayer, Any]:
    """A layer, and a connection to its server with the command counts reset."""
    layer = _layer(url)
    connection = layer.connection(0)
    await connection.config_resetstat()
    return layer, connection


async def _command_calls(connection) -> dict[str, int]:
    """How many times the server ran each command since its counts were reset."""
    stats = await connection.info("commandstats")
    return {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}


def test_a_burst_is_read_with_a_blocking_pop_and_takes_only(redis_url):
    """While receives wait, the reader blocks on a pop of one message and
    takes the rest of the burst after it: it never runs the stock blocking
    read, whose clean-up script goes by EVAL (the layer's own scripts, the
    senders' here included, go by EVALSHA). Every message is handed over
    once, in order, and none is left in the backup queue."""

    async def go():
        layer, connection = await _counted(redis_url)
        channels = [await layer.new_channel() for _ in range(10)]
        for i, channel in enumerate(channels):
            await layer.group_add(f"burst{i}", channel)
        got: dict[str, list[int]] = {channel: [] for channel in channels}

        async def read(channel: str) -> None:
            for _ in range(3):
                got[channel].append((await layer.receive(channel))["n"])

        reading = asyncio.gather(*(read(channel) for channel in channels))
        for n in range(3):
            while not all(len(got[c]) == n and layer._waiters.get(c) for c in channels):
                await asyncio.sleep(0.01)  # every receive waits for burst n
            await layer.group_send_many(
                [(f"burst{i}", {"type": "t", "n": n}) for i in range(len(channels))]
            )
        await asyncio.wait_for(reading, 60)
        left = await _left_in_backup(layer, channels[0])
        calls = await _command_calls(connection)
        await layer.close_pools()
        return got, calls, left

    got, calls, left = asyncio.run(go())
    assert all(numbers == [0, 1, 2] for numbers in got.values()), got
    assert calls.get("bzpopmin", 0) >= 1  # the reader blocked between bursts
    assert calls.get("eval", 0) == 0, calls
    assert left == 0


@pytest.mark.slow
def test_a_blocking_pop_that_times_out_is_waited_again(redis_url):
    async def go():
        layer, connection = await _counted(redis_url)
        layer.brpop_timeout = 1
        channel = await layer.new_channel()
        receiving = asyncio.ensure_future(layer.receive(channel))
        while (await _command_calls(connection)).get("bzpopmin", 0) < 2:
            await asyncio.sleep(0.1)  # the first pop timed out, a second waits
        await layer.send(channel, {"type": "t", "n": 3})
        message = await asyncio.wait_for(receiving, 60)
        await layer.close_pools()
        return message

    assert asyncio.run(go()) == {"type": "t", "n": 3}


def test_group_send_many_queues_each_message_for_every_live_member(redis_url):
    """Two script calls for a whole tick (`group_send_many`): every group's
    members get their message in order, whether they share a process inbox,
    have one of their own or live in another process; a group without members
    is skipped, an expired member is dropped, a full channel refuses its
    message without costing the others theirs. It works again after Redis
    forgot its scripts."""

    async def go():
        web, other = _layer(redis_url), _layer(redis_url)
        a, b = await web.new_channel(), await web.new_channel()  # one inbox
        c = await other.new_channel()  # another process's inbox
        plain = "hub.plain"  # a channel of its own
        for group, channel in [("g1", a), ("g1", c), ("g2", b), ("g2", plain)]:
            await web.group_add(group, channel)
        await web.group_add("g3", "hub.gone")
        # Older than the group expiry: no longer a member.
        await web.connection(0).zadd(web._group_key("g3"), {"hub.gone": 1})
        sends = [
            (group, {"type": "t", "n": n, "g": group})
            for n in range(3)
            for group in ("g1", "g2", "g3", "empty")
        ]
        await web.group_send_many(sends[:4])
        await web.connection(0).script_flush()
        await web.group_send_many(sends[4:])
        got = {
            "a": await _drain(web, [a], 3),
            "b": await _drain(web, [b], 3),
            "c": await _drain(other, [c], 3),
            "plain": await _drain(web, [plain], 3),
        }
        gone = await web.connection(0).zcard(web.prefix + "hub.gone")
        # A full channel: capacity 1 for it, 2 for the rest of the group.
        small = HermesRedisChannelLayer(
            hosts=[redis_url],
            prefix="layer-test",
            capacity=2,
            channel_capacity={"hub.tiny": 1},
        )
        await small.group_add("g4", "hub.tiny")
        await small.group_add("g4", "hub.roomy")
        await small.group_send_many([("g4", {"type": "t", "n": n}) for n in range(2)])
        await small.group_send_many([("g4", {"type": "t", "n": 2})])
        tiny = await _drain(small, ["hub.tiny"], 1)
        roomy = await _drain(small, ["hub.roomy"], 2)
        left_tiny = await small.connection(0).zcard(small.prefix + "hub.tiny")
        for layer in (web, other, small):
            await layer.close_pools()
        return got, gone, tiny, roomy, left_tiny

    got, gone, tiny, roomy, left_tiny = asyncio.run(go())
    assert [n for drained in got.values() for n in drained.values()] == [[0, 1, 2]] * 4
    assert gone == 0
    assert list(tiny.values()) == [[0]] and left_tiny == 0
    assert list(roomy.values()) == [[0, 1]]


def test_group_send_reaches_every_live_member_in_order(redis_url):
    """One group's send goes through `group_send_many`'s two script calls: its
    members in this process's inbox, another's and a channel of their own get
    each message once, in order; an expired member gets nothing."""

    async def go():
        web, other = _layer(redis_url), _layer(redis_url)
        a, c = await web.new_channel(), await other.new_channel()
        for channel in (a, c, "hub.own"):
            await web.group_add("g", channel)
        await web.group_add("g", "hub.expired")
        await web.connection(0).zadd(web._group_key("g"), {"hub.expired": 1})
        for n in range(3):
            await web.group_send("g", {"type": "t", "n": n})
        got = [
            await _drain(web, [a], 3),
            await _drain(other, [c], 3),
            await _drain(web, ["hub.own"], 3),
        ]
        expired = await web.connection(0).zcard(web.prefix + "hub.expired")
        for layer in (web, other):
            await layer.close_pools()
        return got, expired

    got, expired = asyncio.run(go())
    assert [n for drained in got for n in drained.values()] == [[0, 1, 2]] * 3
    assert expired == 0


def test_one_reader_serves_many_waiting_channels_and_stops_when_none_wait(redis_url):
    """A process's channels share one inbox reader (`_read_inbox`): many
    receives waiting at once each get their own messages, in order, once;
    with nobody waiting the reader ends, and the next receive starts one."""

    async def go():
        layer = _layer(redis_url)
        channels = [await layer.new_channel() for _ in range(40)]
        draining = asyncio.ensure_future(_drain(layer, channels, 5))
        while len(layer._waiters) < len(channels):
            await asyncio.sleep(0.01)
        for n in range(5):
            for c in channels:
                await layer.send(c, {"type": "t", "n": n})
        got = await draining
        while not layer._reader.done():  # its blocking read ends within 5 s
            await asyncio.sleep(0.05)
        await layer.send(channels[0], {"type": "t", "n": 9})
        late = await _drain(layer, channels[:1], 1)
        await layer.close_pools()
        return got, late

    got, late = asyncio.run(go())
    assert all(numbers == [0, 1, 2, 3, 4] for numbers in got.values())
    assert list(late.values()) == [[9]]


def test_a_message_handed_over_as_its_receive_is_cancelled_is_kept(redis_url):
    async def go():
        layer = _layer(redis_url)
        channel = await layer.new_channel()
        receiving = asyncio.ensure_future(layer.receive(channel))
        while channel not in layer._waiters:
            await asyncio.sleep(0)
        layer._hand_over(channel, {"type": "t", "n": 1})
        receiving.cancel()  # before the receive could run again
        with pytest.raises(asyncio.CancelledError):
            await receiving
        await layer.send(channel, {"type": "t", "n": 2})
        got = await _drain(layer, [channel], 2)
        await layer.close_pools()
        return got[channel]

    assert asyncio.run(go()) == [1, 2]


def test_waiting_receives_get_the_error_when_redis_goes_away():
    async def go(redis):
        layer = _layer(redis.url)
        channels = [await layer.new_channel() for _ in range(3)]
        receiving = [asyncio.ensure_future(layer.receive(c)) for c in channels]
        while len(layer._waiters) < len(channels):
            await asyncio.sleep(0.01)
        redis.kill()
        done, _ = await asyncio.wait(receiving, timeout=60)
        return [type(task.exception()).__name__ for task in done]

    with PrivateRedis() as redis:
        errors = asyncio.run(go(redis))
    assert len(errors) == 3 and all("Error" in name for name in errors), errors


def test_a_process_receives_only_on_its_own_channels(redis_url):
    async def go():
        mine, theirs = _layer(redis_url), _layer(redis_url)
        channel = await theirs.new_channel()
        with pytest.raises(AssertionError, match="Wrong client prefix"):
            await mine.receive(channel)
        return mine._waiters

    assert asyncio.run(go()) == {}


def test_receive_locks_hold_across_event_loops_after_a_cancelled_wait(redis_url):
    """A loop that waited on a receive lock and was cancelled, then ended,
    leaves nothing behind: a later loop's receives wait on the same channel's
    lock and get it (the stock helper raised "bound to a different event
    loop"), and a lock a gone loop never released does not block them."""
    layer = HermesRedisChannelLayer(hosts=[redis_url])
    locks = layer.receive_clean_locks

    async def first_loop():
        await locks.acquire("inbox")
        waiter = asyncio.create_task(locks.acquire("inbox"))
        await asyncio.sleep(0)  # it waits, on this loop
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        await locks.acquire("held")  # and never released

    async def later_loop():
        await locks.acquire("inbox")
        second = asyncio.create_task(locks.acquire("inbox"))
        await asyncio.sleep(0)
        locks.release("inbox")
        await asyncio.wait_for(second, 10)
        locks.release("inbox")
        await asyncio.wait_for(locks.acquire("held"), 10)
        locks.release("held")
        return locks.locked("inbox")

    asyncio.run(first_loop())
    assert asyncio.run(later_loop()) is False
