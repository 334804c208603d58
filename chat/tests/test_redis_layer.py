"""The Redis channel layer's batched receive (hermes_site/channel_layers.py),
against a redis-server of its own."""

import asyncio

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
        inbox = layer.prefix + layer.non_local_name(channels[0])
        connection = layer.connection(layer.consistent_hash(inbox))
        await asyncio.gather(*layer.receive_cleaners)
        left = await connection.zcard(layer._backup_channel_name(inbox))
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
        inbox = layer.prefix + layer.non_local_name(channel)
        backup = layer._backup_channel_name(inbox)
        connection = layer.connection(layer.consistent_hash(inbox))
        # What a take leaves when it is interrupted after Redis ran it: the
        # first three moved to the backup queue, never handed over.
        taken = await connection.zpopmin(inbox, 3)
        await connection.zadd(backup, dict(taken))
        got = await _drain(layer, [channel], 5)
        await asyncio.gather(*layer.receive_cleaners)
        left = await connection.zcard(backup)
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
