"""The channel layers of both deployments, with a batched group send."""

import asyncio
import collections
import copy
import time
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer
from channels_redis.core import ChannelLock, RedisChannelLayer
from redis.commands.core import AsyncScript

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


class _LoopChannelLock(ChannelLock):
    """channels_redis's per-channel receive locks, for a layer that outlives
    event loops (a process's loop replaced; the test suite's many loops).

    The stock helper shares one `asyncio.Lock` per channel among all loops,
    and an acquire that fails or is cancelled never gives its count back, so
    the lock is never dropped: once a loop had waited on it, every later loop
    that had to wait got "bound to a different event loop", and a lock held
    by a loop that went away was held for ever. Here each loop has locks of
    its own, and a failed or cancelled acquire gives its count back.
    """

    def _key(self, channel: str) -> tuple[asyncio.AbstractEventLoop, str]:
        return asyncio.get_running_loop(), channel

    async def acquire(self, channel: str) -> bool:
        key = self._key(channel)
        self.wait_counts[key] += 1
        try:
            return await self.locks[key].acquire()
        except BaseException:
            self._forget(key)
            raise

    def locked(self, channel: str) -> bool:
        lock = self.locks.get(self._key(channel))
        return lock is not None and lock.locked()

    def release(self, channel: str) -> None:
        key = self._key(channel)
        self.locks[key].release()
        self._forget(key)

    def _forget(self, key) -> None:
        self.wait_counts[key] -= 1
        if self.wait_counts[key] < 1:
            del self.locks[key]
            del self.wait_counts[key]


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
    (docs/benchmarks.md). `group_send_many` sends the tick as two script
    calls: one reads every group's members, one queues every message (the
    expiry and capacity rules of `group_send`). A pipeline of a few commands
    per group did the same in two round trips, but encoding and parsing 800
    commands took a busy worker's loop 15–20 ms a tick.

    Every channel of one process (a web process's run hubs, its WebSockets)
    shares one inbox in Redis. The stock layer reads it a message at a time
    in four round trips (put back what an interrupted read left, a blocking
    pop, a copy into a backup queue, and its removal), one after another for
    the whole process, each waiting receive contending for the right to
    read: past about 1,500 messages a second a web process fell further
    behind every second. Here one reader per process (`_read_inbox`) first
    takes every waiting message, up to `RECEIVE_BATCH`, in one round trip,
    and hands each to its channel's waiting receive, with the stock layer's
    guarantees: the script moves them to the same backup queue, so a take
    interrupted before they are handed over leaves them to the next read,
    which puts them back first; they are removed from the backup once handed
    over, under the same per-inbox lock. A take that comes back short has
    emptied the inbox, so the reader then waits on a blocking pop of one
    message (`_wait_one`), handed over at once, and takes the rest of the
    burst after it: three round trips for a worker's tick, where an empty
    take and the stock blocking read (a clean-up script, the pop, a backup
    copy and its removal) made seven (docs/benchmarks.md, finding 42).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.receive_clean_locks = _LoopChannelLock()
        self._waiters: dict[str, collections.deque[asyncio.Future]] = {}
        self._buffers: dict[str, collections.deque[dict]] = {}
        self._reader: asyncio.Task | None = None

    async def receive(self, channel: str) -> dict:
        """The next message of `channel`; a process's channels are served by
        one reader of their shared inbox (`_read_inbox`)."""
        if "!" not in channel:
            return await super().receive(channel)
        assert self.require_valid_channel_name(channel)
        assert self.non_local_name(channel).endswith(self.client_prefix + "!"), (
            "Wrong client prefix"
        )
        buffered = self._buffers.get(channel)
        if buffered:
            message = buffered.popleft()
            if not buffered:
                del self._buffers[channel]
            return message
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        waiters = self._waiters.setdefault(channel, collections.deque())
        waiters.append(waiter)
        self._start_reader(loop, channel)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and not waiter.exception():
                # Handed over just as this receive was cancelled: the next one
                # gets it, as if it had never left the buffer.
                self._buffer(channel).appendleft(waiter.result())
            raise
        finally:
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters and self._waiters.get(channel) is waiters:
                del self._waiters[channel]

    def _start_reader(self, loop: asyncio.AbstractEventLoop, channel: str) -> None:
        reader = self._reader
        if reader is not None and not reader.done():
            if reader.get_loop() is loop:
                return
            if not reader.get_loop().is_closed():
                raise RuntimeError(
                    "Two event loops are trying to receive() on one channel layer"
                    " at once!"
                )
        self._reader = loop.create_task(
            self._read_inbox(self.non_local_name(channel)), name="layer inbox reader"
        )

    async def _read_inbox(self, inbox: str) -> None:
        """Hand every message of the process's inbox to its channel's first
        waiting receive (or its buffer), while any receive waits.

        The stock layer makes each waiting receive a contender for one lock,
        with two tasks and an `asyncio.wait` per message; with hundreds of run
        hubs in one web process that was a fifth of its time and added a
        tick's worth of latency (docs/benchmarks.md). An error reaches every
        waiting receive, as the stock layer raises it in the receive that read.
        """
        try:
            take = True  # the first take puts back what an interrupted one left
            while True:
                received = await self._take_waiting(inbox) if take else []
                if received:
                    take = len(received) >= RECEIVE_BATCH  # short: inbox emptied
                else:
                    if not any(self._waiters.values()):
                        return  # nobody waits: nothing to block on
                    one = await self._wait_one(inbox)
                    if one is None:
                        continue  # the blocking pop's timeout: anyone waiting?
                    received, take = [one], True
                for names, message in received:
                    for name in names if isinstance(names, list) else [names]:
                        self._hand_over(name, message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            for waiters in self._waiters.values():
                for waiter in waiters:
                    if _open(waiter):
                        waiter.set_exception(exc)

    def _hand_over(self, channel: str, message: dict) -> None:
        waiters = self._waiters.get(channel)
        while waiters:
            waiter = waiters.popleft()
            if _open(waiter):
                waiter.set_result(message)
                return
        self._buffer(channel).append(message)

    def _buffer(self, channel: str) -> collections.deque[dict]:
        """What came for `channel` while nobody waited, the oldest dropped
        past capacity (as the stock layer's buffer)."""
        return self._buffers.setdefault(
            channel, collections.deque(maxlen=self.capacity)
        )

    def _inbox(self, inbox: str) -> tuple[str, Any]:
        """The inbox's key, and a connection to the server that holds it."""
        return self.prefix + inbox, self.connection(self.consistent_hash(inbox))

    async def _take_waiting(self, inbox: str) -> list[tuple[Any, dict]]:
        """Every message waiting in the inbox, up to `RECEIVE_BATCH`, in order."""
        key, connection = self._inbox(inbox)
        backup = self._backup_channel_name(key)
        await self.receive_clean_locks.acquire(key)
        try:
            taken = await _script(_TAKE_SCRIPT, connection)(
                keys=[], args=[key, backup, RECEIVE_BATCH], client=connection
            )
        except BaseException:
            self.receive_clean_locks.release(key)
            raise
        if not taken:
            self.receive_clean_locks.release(key)
            return []
        members = taken[0::2]
        # From here to the return nothing awaits: the messages are handed over.
        cleaner = asyncio.ensure_future(connection.zrem(backup, *members))
        self.receive_cleaners.append(cleaner)

        def cleaned(task: asyncio.Future) -> None:
            self.receive_cleaners.remove(task)
            self.receive_clean_locks.release(key)

        cleaner.add_done_callback(cleaned)
        return [self._unpack(inbox, member) for member in members]

    async def _wait_one(self, inbox: str) -> tuple[Any, dict] | None:
        """The inbox's next message, waited for (None after `brpop_timeout`).

        The stock blocking read first puts back what its backup queue holds
        and copies what it pops into it, then removes the copy: the message
        is not lost to a cancellation between the pop and its hand-over. The
        reader hands a popped message over with nothing awaited in between,
        and its next take puts back whatever a take left behind.
        """
        key, connection = self._inbox(inbox)
        popped = await connection.bzpopmin(key, timeout=self.brpop_timeout)
        if popped is None:
            return None
        return self._unpack(inbox, popped[1])

    def _unpack(self, channel: str, content: bytes) -> tuple[str | list[str], dict]:
        """As the stock `receive_single` decodes a message of `channel`: the
        channel (or channels) it is for, and the message."""
        message = self.deserialize(content)
        return message.pop("__asgi_channel__", channel), message

    async def group_send(self, group: str, message: dict) -> None:
        """The stock send, in two round trips (`group_send_many`) instead of
        three: one run's publish (a run's end, a tool step, a steer, a
        notification) waits for each."""
        await self.group_send_many([(group, message)])

    async def group_send_many(self, sends: list[tuple[str, dict]]) -> None:
        if self.ring_size != 1:  # sharded Redis: the stock send, a group at a time
            for group, message in sends:
                await super().group_send(group, message)
            return
        for group, _ in sends:
            assert self.require_valid_group_name(group), "Group name not valid"
        connection = self.connection(0)
        now = time.time()
        members = await _script(_MEMBERS_LUA, connection)(
            keys=[self._group_key(group) for group, _ in sends],
            args=[int(now) - self.group_expiry],
            client=connection,
        )
        keys, messages, capacities = [], [], []
        for (_group, message), names in zip(sends, members, strict=True):
            channels = [name.decode("utf8") for name in names]
            by_connection, serialized, capacity = self._map_channel_keys_to_connection(
                channels, message
            )
            for key in by_connection.get(0, []):
                keys.append(key)
                messages.append(serialized[key])
                capacities.append(capacity[key])
        if keys:
            # A key's messages are read in score order, and equal scores in
            # the order of their (random-prefixed) bytes: a score a microsecond
            # apart for each keeps one group's messages of one call in order.
            scores = [repr(now + i * 1e-6) for i in range(len(keys))]
            await _script(_QUEUE_LUA, connection)(
                keys=keys,
                args=[
                    *messages,
                    *capacities,
                    *scores,
                    int(now) - int(self.expiry),
                    self.expiry,
                ],
                client=connection,
            )


def _open(waiter: asyncio.Future) -> bool:
    """Whether a waiting receive can still be given something: not already
    settled, and of a loop that was not closed under it (it would never run)."""
    return not waiter.done() and not waiter.get_loop().is_closed()


_scripts: dict[str, AsyncScript] = {}


def _script(source: str, connection: Any) -> AsyncScript:
    """A Lua script run by its SHA (loaded into Redis on first use)."""
    script = _scripts.get(source)
    if script is None:
        script = _scripts[source] = connection.register_script(source)
    return script


# Each group's live members, with the expired ones dropped first (as the stock
# `group_send` does, one group at a time): KEYS are the groups' keys.
_MEMBERS_LUA = """
local members = {}
for i = 1, #KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, ARGV[1])
    members[i] = redis.call('ZRANGE', KEYS[i], 0, -1)
end
return members
"""

# Queue each message on its channel's key unless that channel is at capacity,
# with the stock `group_send`'s expiry rules: KEYS are the channels' keys (a
# key may come more than once: one process's channels share one), ARGV the
# message for each key, then each key's capacity, then each message's score
# (its time), then the cut-off for expired messages and the expiry.
_QUEUE_LUA = """
local n = #KEYS
local cutoff = ARGV[3 * n + 1]
local expiry = ARGV[3 * n + 2]
local over_capacity = 0
for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, cutoff)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[n + i]) then
        redis.call('ZADD', KEYS[i], ARGV[2 * n + i], ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""
