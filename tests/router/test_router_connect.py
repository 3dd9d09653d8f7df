"""ShardClient.connect at startup: the launcher starts the router beside shards that are still
loading, so the router waits for every socket to appear, connects as soon as it does (not after
gRPC's reconnect backoff), and gives up at --shard-connect-timeout naming the socket."""

from __future__ import annotations

import asyncio
import time

import pytest

from router.client import ShardClient
from tests.router.fake_shard import start_fake_shards
from tests.router.harness import _socket_dir, async_test

# Later than gRPC's first reconnect backoff (1 s): a router dialling at once would connect only
# after it; one that waits for the socket connects within a poll of it.
LOAD_S = 1.5


@pytest.mark.parametrize("world_size", [1, 2])
@async_test
async def test_connects_to_shards_that_start_serving_after_it(world_size):
    async with _socket_dir() as uds:
        connecting = asyncio.create_task(ShardClient.connect(uds, timeout=30))
        await asyncio.sleep(LOAD_S)
        assert not connecting.done()
        _, servers = await start_fake_shards(uds, world_size)
        served = time.monotonic()
        try:
            client = await connecting
            assert time.monotonic() - served < 0.5
            assert client.world_size == world_size
            await client.health()
            await client.close()
        finally:
            for server in servers:
                await server.stop(None)


@async_test
async def test_no_shard_by_the_timeout_names_the_socket():
    async with _socket_dir() as uds:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=f"no shard is serving at {uds}-0 after 0.3 s"):
            await ShardClient.connect(uds, timeout=0.3)
        assert time.monotonic() - start < 2
