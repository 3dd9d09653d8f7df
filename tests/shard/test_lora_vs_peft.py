"""Several PEFT adapters and the base model in one batch on the shard servicer, each request
against transformers + peft running its adapter alone (float32): greedy ids equal, logprobs
within 1e-4, with whole and chunked prompts mixed into decoding steps."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from lora_fixtures import ADAPTERS, PATTERNED, make_adapter, peft_reference
from quant_fixtures import SERVED, fixture

from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import BlockPool, FakeContext, prompts, run

# The Triton setup's kernels run in the interpreter on a CPU: large tiles (see the fixture).
pytestmark = pytest.mark.usefixtures("whole_model_tiles")

NEW_TOKENS = 6
LOGPROB_ATOL = 1e-4


# A float base, and an int4 base (AutoAWQ's checkpoint; its library-dequantized twin is what
# PEFT runs on): the LoRA term is float either way.
BASES = ["llama_gqa_llama3", "awq_gemm_g64_llama"]


# The torch path on both bases; the Triton kernels (attention, LoRA shrink/expand) on one,
# compiled on a GPU machine, interpreted otherwise; and --compile (shard/platforms/cpu/compiled.py:
# the terms run beside the graph) on the float base.
SETUPS = [(name, "torch", False) for name in BASES] + [
    ("qwen2_bias", "torch", False),  # biases on q/k/v: the term adds to a biased product
    ("qwen3_qk_norm_sliding", "torch", False),  # per-head q/k norms after the q/k terms
    ("llama_tied_linear_bias", "torch", False),  # every linear biased; head_dim != hidden/heads
    ("llama_gqa_llama3", "triton", False),
    ("llama_gqa_llama3", "torch", True),
]
SETUP_IDS = [f"{name}-{attention}{'-compile' * compile_}" for name, attention, compile_ in SETUPS]


@pytest.fixture(scope="module", params=SETUPS, ids=SETUP_IDS)
def setup(request, tiny_model, tmp_path_factory):
    name, attention, compile_ = request.param
    if name in SERVED:
        served, base = fixture(name), fixture(name) / "reference"
    else:
        served = base = tiny_model(name)
    root = tmp_path_factory.mktemp("adapters")
    adapters = {
        name: make_adapter(base, root / name, seed=i, **cfg)
        for i, (name, cfg) in enumerate(ADAPTERS.items())
    }
    service = lora_service(
        served, adapters, max_loras=len(adapters), attention=attention, compile=compile_
    )
    assert service.lora.step.triton == (attention == "triton")
    assert service.runner.compiled == compile_
    return base, adapters, service


def lora_service(model_dir, adapters: dict, dtype: str = "float32", **settings):
    """A servicer (float32 by default) with `adapters` (name -> PEFT dir), warmed up."""
    service = build_service(
        ShardSettings(
            model_id=str(model_dir),
            uds_path="/unused",
            dtype=dtype,
            lora_adapters=tuple((n, str(p)) for n, p in adapters.items()),
            max_lora_rank=16,
            **settings,
        )
    )
    run(service.Warmup(pb.WarmupRequest(max_batch_total_tokens=4096), FakeContext()))
    return service


def _reference(base, adapter_dir, prompt: list[int]) -> tuple[list[int], list[float]]:
    from transformers import AutoModelForCausalLM

    model = (
        peft_reference(base, adapter_dir)
        if adapter_dir
        else AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    )
    ids, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1]
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    return ids[len(prompt) :], logprobs


def _serve(service, requests, chunks: dict[int, int] | None) -> dict[int, list]:
    got: dict[int, list] = {}
    resp = run(
        service.Prefill(
            pb.PrefillRequest(batch=pb.Batch(id=7, requests=requests), prefill_chunks=chunks or {}),
            FakeContext(),
        )
    )
    cached = resp.batch
    for _ in range(40):
        for g in resp.generations:
            got.setdefault(g.request_id, []).append((g.tokens.ids[0], g.tokens.logprobs[0]))
        if all(len(v) >= NEW_TOKENS for v in got.values()) and len(got) == len(requests):
            break
        resp = run(
            service.Decode(pb.DecodeRequest(batches=[cached], prefill_chunks=chunks or {}),
                           FakeContext())
        )  # fmt: skip
        cached = resp.batch
    run(service.ClearCache(pb.ClearCacheRequest(), FakeContext()))
    return got


def serve_mixed(
    service, names: list[str], seed: int, chunk: int | None = None
) -> tuple[list[list[int]], dict[int, list]]:
    """One request per name ("" = the base model) on random prompts in one batch (prompts in
    chunks of `chunk` tokens if given): the prompts, and each request's (id, logprob)s."""
    texts = [[3 + t % 300 for t in p] for p in prompts(len(names), seed=seed)]  # vocab >= 303
    pool = BlockPool(250, seed=1)
    requests = [
        pool.request(i, p, NEW_TOKENS + 40, adapter_id=name)  # room for every step
        for i, (name, p) in enumerate(zip(names, texts, strict=True))
    ]
    chunks = {i: chunk for i in range(len(names))} if chunk else None
    return texts, _serve(service, requests, chunks)


@pytest.mark.parametrize("chunked", [False, True])
def test_adapters_mixed_with_the_base_model_equal_peft_alone(setup, chunked):
    base, adapters, service = setup
    names = ["", *ADAPTERS, "all_r8"]  # the base model, every adapter, one adapter twice
    texts, got = serve_mixed(service, names, seed=3, chunk=7 if chunked else None)
    for i, (name, prompt) in enumerate(zip(names, texts, strict=True)):
        want_ids, want_lps = _reference(base, adapters.get(name), prompt)
        ids = [t for t, _ in got[i][:NEW_TOKENS]]
        assert ids == want_ids, f"request {i} ({name or 'base'})"
        lps = torch.tensor([lp for _, lp in got[i][:NEW_TOKENS]])
        torch.testing.assert_close(lps, torch.tensor(want_lps), atol=LOGPROB_ATOL, rtol=0)


def test_an_adapter_changes_the_output(setup):
    """Guards the test above against adapters too weak to matter."""
    base, adapters, _ = setup
    prompt = [3 + t % 300 for t in prompts(1, seed=9)[0]]
    plain = _reference(base, None, prompt)[1]
    for name, path in adapters.items():
        assert _reference(base, path, prompt)[1] != pytest.approx(plain, abs=1e-3), name


def test_unknown_adapter_fails_the_batch_naming_it(setup):
    _, _, service = setup
    pool = BlockPool(50, seed=2)
    request = pool.request(1, [5, 6, 7], 2, adapter_id="nope")
    with pytest.raises(Exception, match=r"unknown LoRA adapter\(s\) \['nope'\]"):
        run(service.Prefill(pb.PrefillRequest(batch=pb.Batch(id=9, requests=[request])),
                            FakeContext()))  # fmt: skip


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_eviction_from_host_cache_and_slots_reloads_and_still_matches(
    tiny_model, tmp_path, compiled
):
    """--max-loras 2, --max-cpu-loras 2, four adapters in turn: slots are reused and evicted
    adapters are read from disk again, and every request still equals peft; with --compile
    too, where a graph compiled before any adapter was in a slot must see every refill."""
    base = tiny_model("llama_gqa_llama3")
    adapters = {
        name: make_adapter(base, tmp_path / name, seed=10 + i, **cfg)
        for i, (name, cfg) in enumerate(ADAPTERS.items())
    }
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    service = lora_service(base, adapters, max_loras=2, max_cpu_loras=2, compile=compiled)
    names = list(ADAPTERS)
    rounds = [names[:2], names[2:], [names[0], names[3]], [names[1], names[2]]]
    prompt = [3 + t % 300 for t in prompts(1, seed=4)[0]]
    graphs = []  # compiled so far, after each round
    for pair in rounds:
        pool = BlockPool(250, seed=3)
        requests = [
            pool.request(i, prompt, NEW_TOKENS + 40, adapter_id=n) for i, n in enumerate(pair)
        ]
        got = _serve(service, requests, None)
        for i, name in enumerate(pair):
            want_ids, _ = _reference(base, adapters[name], prompt)
            assert [t for t, _ in got[i][:NEW_TOKENS]] == want_ids, (pair, name)
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    stats = service.lora.stats
    # Startup reads all four (keeping the last two); then each round reads its adapters from
    # disk, except kup_r8 in round 3, which is still in a device slot from round 2.
    assert stats.misses == 4 + 2 + 2 + 1 + 2
    assert stats.evictions == stats.misses - 2 and stats.hits == 0
    assert service.lora.slots_in_use() == 2
    if compiled:  # the slots' refills in later rounds compiled nothing new
        assert graphs[0] >= 1 and graphs == [graphs[0]] * len(rounds)


def test_per_module_ranks_alphas_and_layer_subsets_equal_peft(tiny_model, tmp_path):
    """rank_pattern and alpha_pattern (PEFT's regex keys) and layers_to_transform, mixed in one
    batch with the base model: each module gets its own rank and scaling, as in PEFT."""
    from safetensors.torch import load_file

    base = tiny_model("llama_gqa_llama3")
    adapters = {
        name: make_adapter(base, tmp_path / name, seed=20 + i, **cfg)
        for i, (name, cfg) in enumerate(PATTERNED.items())
    }
    ranks = {  # the checkpoints really carry per-module ranks
        k: v.shape[0]
        for k, v in load_file(adapters["patterns_r8"] / "adapter_model.safetensors").items()
        if "lora_A" in k
    }
    assert {ranks[k] for k in ranks if "q_proj" in k} == {4}
    assert ranks["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"] == 16
    assert ranks["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"] == 8
    layer1 = load_file(adapters["layer1_rslora"] / "adapter_model.safetensors")
    assert all(".layers.1." in k for k in layer1)

    service = lora_service(base, adapters, max_loras=len(adapters))
    names = ["", *PATTERNED]
    texts, got = serve_mixed(service, names, seed=5, chunk=5)
    for i, (name, prompt) in enumerate(zip(names, texts, strict=True)):
        want_ids, want_lps = _reference(base, adapters.get(name), prompt)
        assert [t for t, _ in got[i][:NEW_TOKENS]] == want_ids, name or "base"
        lps = torch.tensor([lp for _, lp in got[i][:NEW_TOKENS]])
        torch.testing.assert_close(lps, torch.tensor(want_lps), atol=LOGPROB_ATOL, rtol=0)
