"""A model with recurrent layers (Qwen3.5's Gated DeltaNet, Granite 4.0-H's and NemotronH's Mamba
2, LFM2's short convolutions: a state per sequence, not K/V per token), end to end: the real
router over a real shard. Concurrent requests of different lengths, prompts split into chunks
while others decode, a one-token prompt, requests that finish and free their state slots for the
next ones: greedy ids as transformers generates them. The router serves such a model without
prefix caching, refuses prefix caching and speculation asked for by name, and keeps batches
within the shard's state slots."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from launcher.tiny_models import build_model
from router.limits import ConfigError
from router.speculation.config import SpeculativeConfig
from tests.router.harness import real_router_env
from tests.shard.servicer_helpers import greedy_reference, start_service
from tests.shard.tiny_model_cases import MOE_MODELS, NEW_ARCH_MODELS

MAX_NEW = 6


# Qwen3.5's Gated DeltaNet; Granite 4.0-H's and NemotronH's Mamba 2 layers (a conv and a scan
# state each), NemotronH's beside MLP-only layers; LFM2's short convolutions (a conv state)
@pytest.fixture(
    scope="module",
    params=[
        "qwen3_5_linear_attention",
        "granite4_hybrid_dense_nope",
        "nemotron_h_one_module_layers",
        "lfm2_short_conv_hybrid",
        "falcon_h1_parallel_hybrid",  # a Mamba state and K/V in every layer
        "mamba2_pure",  # no attention at all: no K/V, a state in every layer
        "falcon_mamba_bcdt_norms",  # Mamba 1: a state per inner channel in every layer
        "kimi_linear_kda_nope_mla",  # KDA: a decay per key channel, beside latent attention
    ],
)
def model_dir(request, tmp_path_factory):
    architecture, overrides = {**NEW_ARCH_MODELS, **MOE_MODELS}[request.param]
    return build_model(tmp_path_factory.mktemp(request.param), architecture, **overrides)


@pytest.fixture(scope="module")
def service(model_dir):
    return start_service(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def prompts(count: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    lens = [1, 9, 40, 3, 23, 17, 2, 31][:count]
    return [torch.randint(3, 500, (n,), generator=gen).tolist() for n in lens]


def test_concurrent_chunked_requests_equal_transformers(model_dir, service, reference):
    batch = prompts(8)

    async def run():
        # 4 state slots for 8 requests: later ones take the slots earlier ones freed; 8-token
        # chunks split the longer prompts over steps while the others decode
        args = dict(max_batch_size=4, prefill_chunk_tokens=8, max_batch_prefill_tokens=16)
        async with real_router_env(service, model_dir, **args) as env:
            info = await (await env.client.get("/info")).json()

            async def ask(ids):
                body = {"prompt": ids, "max_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
                r = await env.client.post("/v1/completions", json=body)
                assert r.status == 200, await r.text()
                return (await r.json())["choices"][0]

            return info, await asyncio.gather(*(ask(ids) for ids in batch))

    info, choices = asyncio.run(run())
    assert info["prefix_caching"] is False  # off by default for this model
    assert info["max_batch_size"] == 4
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for ids, choice in zip(batch, choices, strict=True):
        want = greedy_reference(reference, ids, MAX_NEW)
        assert choice["text"] == tokenizer.decode(want, skip_special_tokens=True), len(ids)


def test_unbounded_batches_are_bounded_by_the_shards_state_slots(model_dir, service):
    async def run():
        async with real_router_env(service, model_dir) as env:
            return await (await env.client.get("/info")).json()

    assert asyncio.run(run())["max_batch_size"] == service.runner.state_slots > 0


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        ({"prefix_caching": True}, "--prefix-caching"),
        (
            {"speculative_config": SpeculativeConfig(method="ngram", num_speculative_tokens=3)},
            "--speculative-config",
        ),
    ],
)
def test_what_the_state_cannot_honour_is_refused_naming_the_flag(model_dir, service, args, flag):
    async def run():
        async with real_router_env(service, model_dir, **args):
            pass

    with pytest.raises(ConfigError, match=flag) as err:
        asyncio.run(run())
    assert "linear-attention" in str(err.value)
