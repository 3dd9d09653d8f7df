"""Schemathesis against the live router: bodies generated from GET /openapi.json, valid and
invalid, on every route, with LoRA adapters and runtime loading on. Whatever a client sends,
the answer is never a 5xx, its status is one the document lists for that route, its Content-Type
one the document gives, an error is the documented JSON body, and the fake shards see no
scheduling violation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, given
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from router.adapters import LoraAdapter
from tests.router.harness import router_env

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]  # fmt: skip
EXAMPLES = 15  # per route and mode: ~400 requests (derandomized: the same ones each run)
# A client may send `seed: 0` itself; the fake shard reads 0 as "the router set no seed".
CLIENT_CHOSEN = "seed not set"


@contextmanager
def live_router(model_dir: Path, lora_dir: Path) -> Iterator[tuple[str, list[str]]]:
    """The router against fake shards, served from its own thread and event loop (schemathesis
    calls are blocking); yields its URL and, once stopped, the shards' violations."""
    started, violations = threading.Event(), []
    running: dict = {}  # the server thread's loop, stop event and URL

    async def serve() -> None:
        adapters = (LoraAdapter("sql", str(lora_dir)), LoraAdapter("chat", str(lora_dir)))
        async with router_env(
            model_dir,
            shard={"max_loras": 2, "track_adapters": True},
            lora_adapters=adapters,
            max_loras=2,
            enable_lora_runtime_loading=True,
            lora_dir=str(lora_dir),
            served_model_name="tiny",
        ) as env:
            running.update(
                loop=asyncio.get_running_loop(),
                stop=asyncio.Event(),
                url=str(env.client.make_url("")).rstrip("/"),
            )
            started.set()
            await running["stop"].wait()
            violations.extend(v for v in env.violations() if CLIENT_CHOSEN not in v)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(60), "the router did not start"
    try:
        yield running["url"], violations
    finally:
        running["loop"].call_soon_threadsafe(running["stop"].set)
        thread.join(30)


def test_no_body_gets_a_server_error_or_an_undocumented_answer(model_dir, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_config.json").write_text("{}")
    with live_router(model_dir, tmp_path) as (url, violations), requests.Session() as session:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 13
        calls: dict[int, int] = {}

        for operation in operations:
            modes = [GenerationMode.POSITIVE]
            if operation.body or operation.query:  # something a client can get wrong
                modes.append(GenerationMode.NEGATIVE)
            for mode in modes:

                @hypothesis.settings(
                    max_examples=EXAMPLES,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=operation.as_strategy(generation_mode=mode))
                def call(case):
                    response = case.call_and_validate(base_url=url, session=session, checks=CHECKS)
                    status = response.status_code
                    calls[status] = calls.get(status, 0) + 1
                    # The fake shards never fail: a failed generation is the router's doing
                    # (e.g. a value validation let through that the wire cannot carry).
                    assert status != 424, (case.body, response.text)

                call()
    assert violations == []
    # Both verdicts were reached: answers and refusals.
    assert calls.get(200, 0) > 50 and calls.get(422, 0) > 50, calls
