"""The channel layers of both deployments, with a batched group send."""

import asyncio
import copy
import time
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer

CLEAN_EVERY_S = 1.0  # expiry is 60 s: sweeping once a second loses nothing


class HermesInMemoryChannelLayer(InMemoryChannelLayer):
    """Channels' in-memory layer, made cheap for hundreds of streaming runs.

    - The stock layer walks every channel and group on every send and receive;
      with a few hundred runs streaming, that walk was a seventh of the event
      loop's time. Here it runs at most once a second.
    - The stock `group_send` starts a task per member and waits for them, so
      every publish gives up the event loop at least once: a tick publishing
      200 runs one after another waited 200 loop turns behind the streams.
      Here a group send queues the message for each member at once and never
      suspends (a queue of this layer never blocks a sender: a full one drops
      the message, as the stock layer does).

    See docs/benchmarks.md.
    """

    _swept_at = 0.0

    async def send(self, channel: str, message: dict) -> None:
        """The stock `send`, with a copy made for what a layer carries.

        The stock layer `deepcopy`s every message (so a receiver never shares
        objects with the sender, as over Redis). A layer's messages are plain
        data, which `_copy` copies for a fraction of that: `deepcopy` was
        most of a busy worker's publishing (docs/benchmarks.md).
        """
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        queue = self.channels.get(channel)
        if queue is None:
            queue = self.channels[channel] = asyncio.Queue(
                maxsize=self.get_capacity(channel)
            )
        try:
            queue.put_nowait((time.time() + self.expiry, _copy(message)))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at < CLEAN_EVERY_S:
            return
        self._swept_at = now
        super()._clean_expired()

    async def group_send(self, group: str, message: dict) -> None:
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        for channel in list(self.groups.get(group, ())):
            try:
                await self.send(channel, message)  # never suspends
            except ChannelFull:
                pass

    async def group_send_many(self, sends: list[tuple[str, dict]]) -> None:
        """Each `(group, message)`, in order (see HermesRedisChannelLayer)."""
        for group, message in sends:
            await self.group_send(group, message)


def _copy(value: Any) -> Any:
    """A copy of plain data: dicts and lists copied, strings, numbers, bytes,
    None and tuples of those shared (they cannot change); anything else
    `deepcopy`ed, as the stock layer does."""
    kind = type(value)
    if kind is dict:
        return {key: _copy(item) for key, item in value.items()}
    if kind is list:
        return [_copy(item) for item in value]
    if kind in _SHARED or (kind is tuple and all(type(x) in _SHARED for x in value)):
        return value
    return copy.deepcopy(value)


_SHARED = frozenset({str, int, float, bool, bytes, type(None)})


# Move what the last take left in the backup queue back to the inbox (it was
# never handed over: the take was interrupted), then move up to ARGV[3] of
# the oldest messages to the backup queue and return them, with their scores.
_TAKE_SCRIPT = """
local backed_up = redis.call('ZRANGE', ARGV[2], 0, -1, 'WITHSCORES')
for i = #backed_up, 1, -2 do
    redis.call('ZADD', ARGV[1], backed_up[i], backed_up[i - 1])
end
redis.call('DEL', ARGV[2])
local taken = redis.call('ZPOPMIN', ARGV[1], ARGV[3])
for i = 1, #taken, 2 do
    redis.call('ZADD', ARGV[2], taken[i + 1], taken[i])
end
return taken
"""
RECEIVE_BATCH = 256  # messages taken from a process's inbox in one round trip


class HermesRedisChannelLayer(RedisChannelLayer):
    """channels_redis' layer, with many group sends in two round trips and
    a process's waiting messages received in one.

    The stock `group_send` makes four round trips to Redis for each group;
    the journal's committer publishes every streaming run's events each tick,
    and 200 runs cost it 800 round trips and seconds of a loaded event loop
    (docs/benchmarks.md). `group_send_many` pipelines the tick: one round trip
    reads every group's members, one queues every message (the same Lua
    script and expiry rules as `group_send`).

    Every channel of one process (a web process's run hubs, its WebSockets)
    shares one inbox in Redis, which the stock layer reads a message at a
    time in four round trips (put back what an interrupted read left, a
    blocking pop, a copy into a backup queue, and its removal), one after
    another for the whole process: past about 1,500 messages a second a web
    process fell further behind every second. `receive_single` here first
    takes every waiting message, up to `RECEIVE_BATCH`, in one round trip,
    with the stock layer's guarantees: the script moves them to the same
    backup queue, so a take interrupted before they are handed over leaves
    them to the next read, which puts them back first; they are removed from
    the backup once buffered, under the same per-inbox lock. With nothing
    waiting, the stock blocking read follows.
    """

    async def receive_single(self, channel: str) -> tuple[Any, dict]:
        if "!" not in channel:
            return await super().receive_single(channel)
        assert self.require_valid_channel_name(channel, receive=True)
        index = self.consistent_hash(channel)
        key = self.prefix + channel
        backup = self._backup_channel_name(key)
        connection = self.connection(index)
        await self.receive_clean_locks.acquire(key)
        try:
            taken = await connection.eval(_TAKE_SCRIPT, 0, key, backup, RECEIVE_BATCH)
        except BaseException:
            self.receive_clean_locks.release(key)
            raise
        if not taken:
            self.receive_clean_locks.release(key)
            return await super().receive_single(channel)
        members = taken[0::2]
        # From here to the return nothing awaits: the messages are handed over.
        cleaner = asyncio.ensure_future(connection.zrem(backup, *members))
        self.receive_cleaners.append(cleaner)

        def cleaned(task: asyncio.Future) -> None:
            self.receive_cleaners.remove(task)
            self.receive_clean_locks.release(key)

        cleaner.add_done_callback(cleaned)
        received = [self._unpack(channel, member) for member in members]
        # The caller buffers the one returned: the rest go first, in order.
        for names, message in received[:-1]:
            for name in names if isinstance(names, list) else [names]:
                self.receive_buffer[name].put_nowait(message)
        return received[-1]

    def _unpack(self, channel: str, content: bytes) -> tuple[str | list[str], dict]:
        """As the stock `receive_single` decodes a message of `channel`: the
        channel (or channels) it is for, and the message."""
        message = self.deserialize(content)
        return message.pop("__asgi_channel__", channel), message

    async def group_send_many(self, sends: list[tuple[str, dict]]) -> None:
        if self.ring_size != 1:  # sharded Redis: one group at a time
            for group, message in sends:
                await self.group_send(group, message)
            return
        for group, _ in sends:
            assert self.require_valid_group_name(group), "Group name not valid"
        connection = self.connection(0)
        now = time.time()
        read = connection.pipeline(transaction=False)
        for group, _ in sends:
            key = self._group_key(group)
            read.zremrangebyscore(key, min=0, max=int(now) - self.group_expiry)
            read.zrange(key, 0, -1)
        members = (await read.execute())[1::2]
        write = connection.pipeline(transaction=False)
        queued = 0
        for (_group, message), names in zip(sends, members, strict=True):
            channels = [name.decode("utf8") for name in names]
            by_connection, messages, capacities = self._map_channel_keys_to_connection(
                channels, message
            )
            keys = by_connection.get(0, [])
            if not keys:
                continue
            for key in keys:
                write.zremrangebyscore(key, min=0, max=int(now) - int(self.expiry))
            args = [messages[k] for k in keys] + [capacities[k] for k in keys]
            write.eval(_GROUP_SEND_LUA, len(keys), *keys, *args, now, self.expiry)
            queued += 1
        if queued:
            await write.execute()


# The script of channels_redis' `group_send` (4.3): queue each message unless
# its channel is at capacity.
_GROUP_SEND_LUA = """
    local over_capacity = 0
    local current_time = ARGV[#ARGV - 1]
    local expiry = ARGV[#ARGV]
    for i=1,#KEYS do
        local capacity = tonumber(ARGV[i + #KEYS])
        if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < capacity then
            redis.call('ZADD', KEYS[i], current_time, ARGV[i])
            redis.call('EXPIRE', KEYS[i], expiry)
        else
            over_capacity = over_capacity + 1
        end
    end
    return over_capacity
"""
