"""Runtime LoRA management against fake shards: POST /v1/load_lora_adapter and
/v1/unload_lora_adapter (off by default, API key, paths confined to --lora-dir, names, shard
refusals), and an unload that lets the adapter's running and queued requests finish first while
new ones are refused as unknown."""

from __future__ import annotations

import asyncio
import os

import pytest

from router.api.tgi import parse_generate
from router.args import parse_args
from router.errors import ValidationError
from tests.router.harness import async_test, router_env, scrape, wait_until

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def lora_dir(tmp_path):
    root = tmp_path / "loras"
    for name in ("sql", "chat", "nested/deep"):
        (root / name).mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside")  # a link inside, pointing out
    (root / "inside-link").symlink_to(root / "sql")  # a link that stays inside
    leaky = root / "leaky"
    leaky.mkdir()
    (tmp_path / "secret.json").write_text("{}")
    (leaky / "adapter_config.json").symlink_to(tmp_path / "secret.json")
    (root / "file").write_text("not a directory")
    return os.path.realpath(root)


def runtime_env(model_dir, lora_dir, shard=None, **args):
    shard = {"track_adapters": True, **(shard or {})}
    return router_env(
        model_dir,
        shard=shard,
        served_model_name="tiny",
        enable_lora_runtime_loading=True,
        lora_dir=lora_dir,
        **args,
    )


async def load(env, name, path, **headers):
    body = {"lora_name": name, "lora_path": path}
    return await env.client.post("/v1/load_lora_adapter", json=body, headers=headers)


async def unload(env, name, **headers):
    body = {"lora_name": name}
    return await env.client.post("/v1/unload_lora_adapter", json=body, headers=headers)


def gen(adapter, tokens=3):
    params = {"max_new_tokens": tokens, "adapter_id": adapter, "details": True}
    return {"inputs": "Hello", "parameters": params}


async def error(response, status: int, error_type: str) -> str:
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    assert body["error_type"] == error_type and body["request_id"]
    return body["error"]


def load_calls(env) -> list[int]:
    return [s.calls.count("LoadAdapter") for s in env.shards]


@async_test
async def test_the_routes_are_off_by_default_and_say_how_to_turn_them_on(model_dir):
    async with router_env(model_dir) as env:
        for route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            r = await env.client.post(route, json={"lora_name": "x", "lora_path": "/x"})
            message = await error(r, 404, "not_found")
            assert message == (
                f"{route} is off: start the server with --enable-lora-runtime-loading and "
                "--lora-dir"
            )
        assert load_calls(env) == [0, 0]


@async_test
async def test_load_generate_unload_through_every_listing(model_dir, lora_dir):
    async with runtime_env(model_dir, lora_dir) as env:
        r = await load(env, "sql", "sql")  # relative: under --lora-dir
        assert r.status == 200, await r.text()
        assert await r.text() == "Success: LoRA adapter 'sql' added successfully."
        r = await load(env, "chat", os.path.join(lora_dir, "inside-link"))
        assert r.status == 200, await r.text()
        # The shards get the real directory, symlinks resolved.
        for shard in env.shards:
            assert shard.loaded == {"sql": f"{lora_dir}/sql", "chat": f"{lora_dir}/sql"}

        models = (await (await env.client.get("/v1/models")).json())["data"]
        assert [(m["id"], m["root"], m["parent"]) for m in models] == [
            ("tiny", "tiny", None),
            ("sql", f"{lora_dir}/sql", "tiny"),
            ("chat", f"{lora_dir}/sql", "tiny"),
        ]
        assert (await (await env.client.get("/info")).json())["lora_adapters"] == ["sql", "chat"]
        r = await env.client.post("/generate", json=gen("sql"))
        assert r.status == 200, await r.text()
        assert env.shards[0].prefilled[-1].adapter_id == "sql"
        r = await env.client.post("/v1/completions", json={"model": "chat", "prompt": "Hi"})
        assert r.status == 200 and (await r.json())["model"] == "chat"
        samples = await scrape(env.client)
        assert samples['switchyard_adapter_requests_total{adapter="sql"}'] == 1
        assert samples['switchyard_adapter_requests_total{adapter="chat"}'] == 1

        r = await unload(env, "sql")
        assert r.status == 200, await r.text()
        assert await r.text() == "Success: LoRA adapter 'sql' removed successfully."
        for shard in env.shards:
            assert list(shard.loaded) == ["chat"]
        r = await env.client.post("/generate", json=gen("sql"))
        message = await error(r, 422, "validation")
        assert "`adapter_id` 'sql' is not a loaded LoRA adapter. Loaded: chat" in message
        for route, body in [
            ("/v1/completions", {"model": "sql", "prompt": "Hi"}),
            ("/v1/chat/completions", {"model": "sql", "messages": HI}),
        ]:
            r = await env.client.post(route, json=body)
            message = await error(r, 404, "model_not_found")
            assert message == "The model `sql` does not exist. Available models: tiny, chat"
        models = (await (await env.client.get("/v1/models")).json())["data"]
        assert [m["id"] for m in models] == ["tiny", "chat"]
        samples = await scrape(env.client)
        assert not any('adapter="sql"' in name for name in samples)

        # Unloading the last adapter never turns its name into the base model.
        assert (await unload(env, "chat")).status == 200
        r = await env.client.post("/v1/completions", json={"model": "chat", "prompt": "Hi"})
        message = await error(r, 404, "model_not_found")
        assert message == "The model `chat` does not exist. Available models: tiny"
        r = await env.client.post("/generate", json=gen("chat"))
        assert "no LoRA adapters are loaded" in await error(r, 422, "validation")
        # The base model is served as always; a freed name can be loaded again.
        assert (await env.client.post("/generate", json=gen(None))).status == 200
        assert (await load(env, "sql", "nested/deep")).status == 200
        assert (await env.client.post("/generate", json=gen("sql"))).status == 200
        assert env.violations() == []


@async_test
async def test_the_routes_need_the_api_key(model_dir, lora_dir):
    async with runtime_env(model_dir, lora_dir, api_key="s3cret") as env:
        r = await load(env, "sql", "sql")
        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        await error(r, 401, "unauthorized")
        r = await load(env, "sql", "sql", Authorization="Bearer wrong")
        await error(r, 401, "unauthorized")
        assert load_calls(env) == [0, 0]
        assert (await load(env, "sql", "sql", Authorization="Bearer s3cret")).status == 200
        await error(await unload(env, "sql"), 401, "unauthorized")
        assert (await unload(env, "sql", Authorization="Bearer s3cret")).status == 200


@async_test
async def test_paths_outside_the_lora_dir_never_reach_the_shards(model_dir, lora_dir):
    outside = os.path.join(os.path.dirname(lora_dir), "outside")
    cases = [
        (outside, "is outside --lora-dir"),
        ("../outside", "is outside --lora-dir"),
        (f"{lora_dir}/sql/../../outside", "is outside --lora-dir"),
        ("escape", "is outside --lora-dir"),  # a symlink out of it
        ("/etc", "is outside --lora-dir"),
        ("leaky", "adapter_config.json is a link to outside --lora-dir"),
        ("file", "is not a directory under --lora-dir"),
        ("missing", "is not a directory under --lora-dir"),
        ("bad\u0000path", "is not a valid path"),
    ]
    async with runtime_env(model_dir, lora_dir) as env:
        for path, why in cases:
            message = await error(await load(env, "x", path), 400, "invalid_lora_adapter")
            assert f"`lora_path` {path!r}" in message and why in message, message
            if "--lora-dir" in why:
                assert f"--lora-dir {lora_dir}" in message
        for path in ("", None, 3, ["sql"]):
            message = await error(await load(env, "x", path), 400, "invalid_lora_adapter")
            assert message == "`lora_path` must be a non-empty string"
        assert load_calls(env) == [0, 0]
        assert (await env.client.post("/generate", json=gen(None))).status == 200


@async_test
async def test_names_must_be_new_and_unambiguous(model_dir, lora_dir):
    async with runtime_env(model_dir, lora_dir) as env:
        assert (await load(env, "sql", "sql")).status == 200
        cases = [
            ("sql", "The LoRA adapter 'sql' has already been loaded"),
            ("base", "'base' is reserved for the base model"),
            ("tiny", "'tiny' is the served model name"),
            ("a,b", "must be non-empty, without [',']"),
            ("", "`lora_name` must be a non-empty string"),
            (None, "`lora_name` must be a non-empty string"),
        ]
        for name, why in cases:
            message = await error(await load(env, name, "chat"), 400, "invalid_lora_adapter")
            assert why in message, message
        r = await env.client.post("/v1/load_lora_adapter", json={"lora_name": "c", "x": 1})
        message = await error(r, 400, "invalid_lora_adapter")
        assert message == "unknown field(s) ['x']; expected ['lora_name', 'lora_path']"
        r = await env.client.post("/v1/load_lora_adapter", data="lora_name=c")
        await error(r, 415, "unsupported_media_type")
        assert load_calls(env) == [1, 1]

        message = await error(await unload(env, "nope"), 404, "adapter_not_found")
        assert message == "The LoRA adapter 'nope' cannot be found. Loaded: sql"
        message = await error(await unload(env, None), 400, "invalid_lora_adapter")
        assert message == "`lora_name` must be a non-empty string"
        assert [s.calls.count("UnloadAdapter") for s in env.shards] == [0, 0]
        assert env.violations() == []


@async_test
async def test_a_refused_adapter_is_a_400_and_the_server_keeps_serving(model_dir, lora_dir):
    reason = "rank 99 exceeds --max-lora-rank 16; restart with --max-lora-rank 99 or more"
    async with runtime_env(model_dir, lora_dir, shard={"refuse_load": reason}) as env:
        message = await error(await load(env, "sql", "sql"), 400, "invalid_lora_adapter")
        assert message == f"adapter 'sql': {reason}"
        assert all(not s.loaded for s in env.shards)
        assert (await env.client.post("/generate", json=gen(None))).status == 200
        r = await env.client.post("/generate", json=gen("sql"))
        await error(r, 422, "validation")
        models = (await (await env.client.get("/v1/models")).json())["data"]
        assert [m["id"] for m in models] == ["tiny"]

        # Shards that disagree: the one that took it gives it back; the name stays free.
        env.shards[0].refuse_load = None
        message = await error(await load(env, "sql", "sql"), 400, "invalid_lora_adapter")
        assert message == (
            f"adapter 'sql': {reason} (refused by shard(s) 1; unloaded again from the others)"
        )
        assert [s.calls.count("UnloadAdapter") for s in env.shards] == [1, 0]
        assert all(not s.loaded for s in env.shards)
        env.shards[1].refuse_load = None
        assert (await load(env, "sql", "sql")).status == 200
        assert (await env.client.post("/generate", json=gen("sql"))).status == 200
        assert env.violations() == []


@async_test
async def test_unload_lets_running_and_queued_requests_finish_and_refuses_new_ones(
    model_dir, lora_dir
):
    shard = {"decode_delay": 0.03}
    async with runtime_env(model_dir, lora_dir, shard=shard, max_batch_size=1) as env:
        assert (await load(env, "sql", "sql")).status == 200
        running = asyncio.create_task(env.client.post("/generate", json=gen("sql", 12)))
        await wait_until(lambda: env.infer.requests_for("sql") == 1)
        await wait_until(lambda: len(env.infer.batcher.entries) == 1)
        # Queued behind it (one request per batch): accepted, so it is served too.
        queued = asyncio.create_task(env.client.post("/generate", json=gen("sql", 4)))
        await wait_until(lambda: len(env.infer.queue) == 1)

        unloading = asyncio.create_task(unload(env, "sql"))
        await wait_until(lambda: not env.infer.adapters.serving("sql"))
        r = await env.client.post("/generate", json=gen("sql"))  # refused at once
        message = await error(r, 422, "validation")
        assert "`adapter_id` 'sql': no LoRA adapters are loaded" in message
        assert (await (await env.client.get("/info")).json())["lora_adapters"] == []
        assert not unloading.done()
        assert all(s.calls.count("UnloadAdapter") == 0 for s in env.shards)

        first, second = await running, await queued
        assert first.status == 200 and second.status == 200
        assert (await first.json())["details"]["generated_tokens"] == 12
        assert (await second.json())["details"]["generated_tokens"] == 4
        r = await unloading
        assert r.status == 200, await r.text()
        assert all(s.calls.count("UnloadAdapter") == 1 and not s.loaded for s in env.shards)
        # The fake shards check that no cached batch still held one of its requests.
        assert env.violations() == []


@async_test
async def test_an_unload_goes_on_when_its_client_leaves(model_dir, lora_dir):
    async with runtime_env(model_dir, lora_dir, shard={"decode_delay": 0.03}) as env:
        assert (await load(env, "sql", "sql")).status == 200
        running = asyncio.create_task(env.client.post("/generate", json=gen("sql", 10)))
        await wait_until(lambda: len(env.infer.batcher.entries) == 1)
        leaving = asyncio.create_task(unload(env, "sql"))
        await wait_until(lambda: not env.infer.adapters.serving("sql"))
        leaving.cancel()
        assert (await running).status == 200
        await wait_until(lambda: not env.infer.adapters.on_shards("sql"))
        assert all(not s.loaded for s in env.shards) and env.violations() == []
        assert (await load(env, "sql", "chat")).status == 200


@async_test
async def test_concurrent_loads_of_one_name_take_turns(model_dir, lora_dir):
    async with runtime_env(model_dir, lora_dir, shard={"load_delay": 0.1}) as env:
        first, second = await asyncio.gather(load(env, "sql", "sql"), load(env, "sql", "chat"))
        statuses = sorted([first.status, second.status])
        assert statuses == [200, 400]
        loser = first if first.status == 400 else second
        assert "'sql' has already been loaded" in (await loser.json())["error"]
        assert load_calls(env) == [1, 1]
        assert len(env.infer.lora_runtime._names) == 0  # no lock left behind
        assert env.violations() == []


@async_test
async def test_a_request_validated_before_an_unload_began_is_refused_when_queued(
    model_dir, lora_dir
):
    """The window an unload may open: validation awaits the tokenizer, then queues."""
    async with runtime_env(model_dir, lora_dir) as env:
        assert (await load(env, "sql", "sql")).status == 200
        valid = await env.infer.validator.validate(parse_generate(gen("sql"), stream=False))
        env.infer.adapters.close("sql")
        with pytest.raises(ValidationError, match="`adapter_id` 'sql': no LoRA adapters"):
            env.infer.generations.submit(valid)
        assert len(env.infer.queue) == 0


def test_router_flags(tmp_path, capsys):
    base = ["--model-id", "/m", "--shard-uds-path", "/s"]
    args = parse_args(base)
    assert args.enable_lora_runtime_loading is False and args.lora_dir is None
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    args = parse_args(
        [*base, "--enable-lora-runtime-loading", "--lora-dir", str(tmp_path / "link")]
    )
    assert args.enable_lora_runtime_loading and args.lora_dir == os.path.realpath(tmp_path / "real")
    for bad, message in [
        (["--enable-lora-runtime-loading"], "--enable-lora-runtime-loading needs --lora-dir"),
        (["--lora-dir", str(tmp_path / "nope")], f"--lora-dir: {tmp_path / 'nope'} is not a dir"),
    ]:
        with pytest.raises(SystemExit) as exc:
            parse_args([*base, *bad])
        assert exc.value.code == 2 and message in capsys.readouterr().err
