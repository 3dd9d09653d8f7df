"""Chunked prefill on the shard servicer: prompts computed over several steps, mixed into the same
forward pass as decoding rows, give the tokens and logprobs of whole-prompt prefill and of
transformers."""

import math

import pytest
import torch

from switchyard_pb import generate_pb2 as pb
from tests.shard.paged_helpers import reference as reference_model
from tests.shard.servicer_helpers import (
    AbortError,
    BlockPool,
    FakeContext,
    greedy_reference,
    prompts,
    run,
    start_warm_service,
)


@pytest.fixture(scope="module")
def service(servicer_model_dir):
    return start_warm_service(servicer_model_dir)


@pytest.fixture
def reference(servicer_reference):
    return servicer_reference


# Beyond the Llama: prompts of 45 and 57 tokens past 7-token windows (Gemma's soft-capped, with
# sandwich norms and per-type ropes; OLMo 3's and EXAONE 4's after post norms) and past Phi-3's
# 32-token longrope boundary, whose chunks must rotate with the whole prompt's (long) tables.
ARCHITECTURES = [
    "gemma2_softcap_alternating",
    "gemma3_qk_norm_local_rope",
    "phi3_partial_longrope",
    "olmo3_sliding_one_kv_head",  # post norms only, whole-projection q/k norms
    "exaone4_sliding_nope",  # a layer without position encoding
    "deepseek_v3_mla",  # the latent cache read back chunk after chunk, YaRN past 16 positions
    # DeepSeek-V3.2: each chunk's tokens choose among the indexer keys earlier chunks stored
    "deepseek_v32_sparse_attention",
    "mistral_large4_sparse_nope",  # a NoPE layer's narrower rows, the indexer's own input norm
    # Mamba 2 layers: each chunk's conv and scan start from the state the last chunk left
    "granite4_hybrid_dense_nope",
    "lfm2_short_conv_hybrid",  # LFM2's short convolutions: each chunk from the last's inputs
    "lfm3_gated_sliding_sandwich",  # LFM3: 7-tap convolutions and a 7-token window across chunks
    # Laguna: 7-token windows across chunks in layers of 4 and 2 query heads, 8 and 6 between
    "laguna_head_counts_softcapped",
    "mellum_sliding_dense_first",  # Mellum 2: Qwen3-MoE's attention windowed across chunks
    # MiMo-V2-Flash: zero-padded narrow values read back chunk after chunk, sinks in windows
    "mimo_v2_flash_narrow_values",
    "falcon_h1_gate_before_norm",  # Falcon-H1: both caches of each layer, chunk after chunk
    "mamba2_pure",  # states alone, no K/V: each chunk from the last's conv and scan states
    # Mamba 1: each chunk's conv and selective scan from the channels' states the last left;
    # Jamba's beside attention's K/V and experts
    "falcon_mamba_bcdt_norms",
    "jamba_mamba1_attention_experts",
    # KDA: each chunk's conv and per-channel delta rule from the states the last chunk left,
    # beside latent attention's K/V read back
    "kimi_linear_kda_nope_mla",
    "bailing_hybrid_kda_gated_mla",
    "starcoder2_biased_sliding",  # biased LayerNorms, a 7-token window in every layer
    "phi_qk_layernorm_tied",  # parallel layers, q/k LayerNorms, partial rotary, a head bias
    # ALiBi: each chunk's queries biased by their distance to the earlier chunks' keys
    "bloom_alibi_six_heads",
    "mpt_alibi_clip_scale",
]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def architecture(request, tiny_model):
    path = tiny_model(request.param)
    return start_warm_service(path), reference_model(path)


def _collect(got: dict[int, list[int]], generations) -> set[int]:
    for g in generations:
        got.setdefault(g.request_id, []).extend(g.tokens.ids)
    return {g.request_id for g in generations}


def test_prompt_chunks_mixed_with_decoding_rows_equal_transformers(service, reference):
    pool = BlockPool(400, seed=5)
    decoding = prompts(2, seed=11)
    # Long prompts whose chunks cross 16-token blocks at odd offsets.
    long = [list(range(3, 60)), [7 + (5 * i) % 400 for i in range(45)]]
    got: dict[int, list[int]] = {}
    first = pb.Batch(id=1, requests=[pool.request(i, p, 20) for i, p in enumerate(decoding)])
    resp = run(service.Prefill(pb.PrefillRequest(batch=first), FakeContext()))
    assert _collect(got, resp.generations) == {0, 1}

    # The new batch starts in the same forward pass as the running one's next decode.
    new = pb.Batch(id=2, requests=[pool.request(10 + i, p, 8) for i, p in enumerate(long)])
    resp = run(
        service.Prefill(
            pb.PrefillRequest(
                batch=new, cached_batches=[resp.batch], prefill_chunks={10: 13, 11: 0}
            ),
            FakeContext(),
        )
    )
    assert resp.batch.id == 1 and list(resp.batch.request_ids) == [0, 1, 10, 11]
    assert _collect(got, resp.generations) == {0, 1}  # the prompts are not done: no token yet
    cached = resp.batch
    # Remaining: 10 has 44 of 57 left, 11 all 45. Chunks of 1, 17, 30 (not block multiples).
    schedule = [{10: 17, 11: 1}, {10: 30, 11: 17}, {10: 5, 11: 30}]
    finished_at = []
    for chunks in schedule:
        resp = run(
            service.Decode(pb.DecodeRequest(batches=[cached], prefill_chunks=chunks), FakeContext())
        )
        finished_at.append(_collect(got, resp.generations) - {0, 1})
        cached = resp.batch
    # 10 finishes its prompt at the second step (13 + 17 + 30 > 57: capped at what is left);
    # 11 at the third (0 + 1 + 17 + 30 > 45), when 10 is decoding: the chunk map is ignored for
    # decoding rows.
    assert finished_at == [set(), {10}, {10, 11}]
    for _ in range(4):
        resp = run(
            service.Decode(
                pb.DecodeRequest(batches=[cached], prefill_chunks={10: 9}), FakeContext()
            )
        )
        assert _collect(got, resp.generations) == {0, 1, 10, 11}
        cached = resp.batch
    for rid, prompt in [(0, decoding[0]), (1, decoding[1]), (10, long[0]), (11, long[1])]:
        assert got[rid] == greedy_reference(reference, prompt, len(got[rid])), f"request {rid}"
    run(service.ClearCache(pb.ClearCacheRequest(), FakeContext()))


def test_new_architectures_chunked_and_mixed_equal_transformers(architecture):
    test_prompt_chunks_mixed_with_decoding_rows_equal_transformers(*architecture)


def _run_alone(service, request: pb.Request, chunk: int | None, steps: int) -> list[pb.Generation]:
    batch = pb.Batch(id=50, requests=[request])
    chunks = {} if chunk is None else {request.id: chunk}
    resp = run(
        service.Prefill(pb.PrefillRequest(batch=batch, prefill_chunks=chunks), FakeContext())
    )
    generations = list(resp.generations)
    while len(generations) < steps:
        resp = run(
            service.Decode(
                pb.DecodeRequest(batches=[resp.batch], prefill_chunks=chunks), FakeContext()
            )
        )
        generations.extend(resp.generations)
    run(service.ClearCache(pb.ClearCacheRequest(id=resp.batch.id), FakeContext()))
    return generations


def test_prompt_logprobs_and_seeded_sampling_do_not_depend_on_chunking(service, reference):
    prompt = [3 + (11 * i) % 450 for i in range(41)]
    params = pb.NextTokenChooserParameters(
        temperature=0.8, top_k=20, top_p=0.95, typical_p=1.0, do_sample=True, seed=1234,
        repetition_penalty=1.1,
    )  # fmt: skip
    results = {}
    for chunk in (None, 6, 16):
        pool = BlockPool(64, seed=chunk or 0)
        request = pool.request(
            3, prompt, 6, prefill_logprobs=True, top_n_tokens=2, parameters=params
        )
        results[chunk] = _run_alone(service, request, chunk, steps=6)
    whole = results[None]
    with torch.no_grad():
        logits = reference(torch.tensor([prompt])).logits[0]
    expected = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    for chunk, generations in results.items():
        first = generations[0]
        # Prompt logprobs arrive whole, with the first token only.
        assert list(first.prefill_tokens.ids) == prompt, chunk
        assert math.isnan(first.prefill_tokens.logprobs[0])
        torch.testing.assert_close(
            torch.tensor(first.prefill_tokens.logprobs[1:]), expected, atol=1e-4, rtol=0
        )
        assert all(not g.HasField("prefill_tokens") for g in generations[1:])
        assert [g.tokens.ids[0] for g in generations] == [g.tokens.ids[0] for g in whole], chunk
        torch.testing.assert_close(
            torch.tensor([g.tokens.logprobs[0] for g in generations]),
            torch.tensor([g.tokens.logprobs[0] for g in whole]),
            atol=1e-4,
            rtol=0,
        )


def test_chunks_for_unknown_requests_are_rejected(service):
    pool = BlockPool(16)
    batch = pb.Batch(id=60, requests=[pool.request(1, [5, 6, 7, 8], 2)])
    with pytest.raises(AbortError, match=r"prefill_chunks name requests \[99\]"):
        run(service.Prefill(pb.PrefillRequest(batch=batch, prefill_chunks={99: 2}), FakeContext()))
    run(service.ClearCache(pb.ClearCacheRequest(), FakeContext()))
