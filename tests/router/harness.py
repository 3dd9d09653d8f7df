"""A real router (startup, warmup, HTTP app) served by aiohttp's test server against fake shards."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from aiohttp.test_utils import TestClient, TestServer

from router.__main__ import build_infer
from router.args import RouterArgs
from router.http_refusals import RouterRunner
from router.infer import Infer
from router.server import create_app
from shard.sockets import shard_url
from switchyard_pb import generate_pb2_grpc as pb_grpc
from tests.router.fake_shard import FakeShard, start_fake_shards

TEST_TIMEOUT_S = 30.0


@dataclass
class RouterEnv:
    client: TestClient
    infer: Infer
    shards: list[FakeShard]

    def violations(self) -> list[str]:
        return [v for s in self.shards for v in s.violations]


class RouterTestServer(TestServer):
    """aiohttp's test server over the router's own runner (router/http_refusals.py), so that
    requests its HTTP parser refuses are answered as in production."""

    async def _make_runner(self, **kwargs: Any) -> RouterRunner:
        return RouterRunner(self.app, **kwargs)


@asynccontextmanager
async def router_env(
    model_dir: Path, world_size: int = 2, shard: dict[str, Any] | None = None, **args: Any
) -> AsyncIterator[RouterEnv]:
    async with _socket_dir() as uds:
        shards, servers = await start_fake_shards(uds, world_size, **(shard or {}))
        try:
            async with _router(model_dir, uds, shards, **args) as env:
                yield env
        finally:
            for server in servers:
                await server.stop(None)


@asynccontextmanager
async def real_router_env(service: Any, model_dir: Path, **args: Any) -> AsyncIterator[RouterEnv]:
    """A real router over one real shard servicer (shard.server.TextGenerationService, built
    by the caller in this process), served over gRPC as the launcher's shard would be."""
    async with _socket_dir() as uds:
        service.identity = dataclasses.replace(service.identity, uds_path=uds)  # discovery
        server = grpc.aio.server()
        pb_grpc.add_TextGenerationServiceServicer_to_server(service, server)
        server.add_insecure_port(shard_url(uds, 0))
        await server.start()
        try:
            async with _router(model_dir, uds, [], **args) as env:
                yield env
        finally:
            await server.stop(None)


@asynccontextmanager
async def _socket_dir() -> AsyncIterator[str]:
    """The shards' socket path; unix socket paths are limited to ~100 bytes: keep them short."""
    sock_dir = tempfile.mkdtemp(prefix="sy-")
    try:
        yield f"{sock_dir}/s"
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


@asynccontextmanager
async def _router(
    model_dir: Path, uds: str, shards: list[FakeShard], **args: Any
) -> AsyncIterator[RouterEnv]:
    infer = client = None
    try:
        infer = await build_infer(RouterArgs(model_id=str(model_dir), shard_uds_path=uds, **args))
        client = TestClient(RouterTestServer(create_app(infer), handler_cancellation=True))
        await client.start_server()
        yield RouterEnv(client, infer, shards)
    finally:
        if client is not None:
            await client.close()
        if infer is not None:
            await infer.client.close()
            infer.tokenizer.close()


def async_test(fn):
    """Runs an async test function in a fresh event loop (no pytest-asyncio needed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), TEST_TIMEOUT_S))

    return wrapper


def parse_sse(body: str) -> list[dict[str, Any]]:
    """Parses `data:` events the way TGI's text-generation client does."""
    events = []
    for line in body.splitlines():
        if line.startswith("data:"):
            events.append(json.loads(line[len("data:") :]))
    return events


async def scrape(client: TestClient) -> dict[str, float]:
    """GET /metrics as {'name{label="v",...}': value}, parsed with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    response = await client.get("/metrics")
    assert response.status == 200
    samples = {}
    for family in text_string_to_metric_families(await response.text()):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


async def wait_until(predicate, timeout: float = 5.0, interval: float = 0.01) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)
