"""The channel layer's client on a private redis-server (`private_redis`).

chat/tests/test_redis_outage.py kills and restarts that server under live
readers. See docs/operating.md, "Redis outage".
"""

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels_redis.core import RedisChannelLayer

from hermes_testing.private_servers import PrivateRedis

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(
        not PrivateRedis.available(), reason="redis-server is not installed"
    ),
]


def test_an_idle_listener_outlives_the_client_socket_timeout(private_redis):
    """redis-py 8 cut every idle BZPOPMIN after 5 s; the pinned client waits."""

    async def idle_receive() -> str:
        # A layer of this test's own: flushing the shared one would close the
        # connections other event loops (a live test server's) hold in it.
        layer = RedisChannelLayer(hosts=[private_redis.url])
        channel = await layer.new_channel()
        try:
            await asyncio.wait_for(layer.receive(channel), 6.5)
        except TimeoutError:
            return "still waiting"  # ours: nothing arrived, nothing failed
        finally:
            await layer.flush()
        return "received"

    assert async_to_sync(idle_receive)() == "still waiting"
