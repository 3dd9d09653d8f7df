"""The shard servicer end to end without the router: Warmup, Prefill, Decode with concatenation,
FilterBatch and ClearCache, compared token by token with transformers."""

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from switchyard_pb import generate_pb2
from tests.shard.servicer_helpers import (
    BLOCK_SIZE,
    AbortError,
    BlockPool,
    FakeContext,
    greedy_reference,
    prompts,
    run,
    start_service,
)


def record(got: dict[int, list[int]], generations) -> None:
    """Appends each generation's tokens to its request's list."""
    for g in generations:
        got.setdefault(g.request_id, []).extend(g.tokens.ids)


def prefill_then_decode(service, batch, decodes: int, got: dict[int, list[int]]):
    """Prefills `batch`, then decodes it alone `decodes` times; returns the cached batch."""
    resp = run(service.Prefill(generate_pb2.PrefillRequest(batch=batch), FakeContext()))
    record(got, resp.generations)
    for _ in range(decodes):
        resp = run(service.Decode(generate_pb2.DecodeRequest(batches=[resp.batch]), FakeContext()))
        record(got, resp.generations)
    return resp.batch


@pytest.fixture(scope="module")
def service(servicer_model_dir):
    return start_service(servicer_model_dir)


@pytest.fixture
def reference(servicer_reference):
    return servicer_reference


def test_warmup_sizes_cache_from_requested_tokens(service):
    pool = BlockPool(8)
    batch = generate_pb2.Batch(id=99, requests=[pool.request(0, list(range(3, 40)), 4)], size=1)
    resp = run(
        service.Warmup(
            generate_pb2.WarmupRequest(batch=batch, max_batch_total_tokens=1000), FakeContext()
        )
    )
    assert resp.num_blocks == 63  # ceil(1000 / 16)
    assert resp.max_supported_total_tokens == 63 * BLOCK_SIZE


def test_prefill_then_decode_with_a_joining_batch_equals_transformers(service, reference):
    run(service.Warmup(generate_pb2.WarmupRequest(max_batch_total_tokens=4096), FakeContext()))
    pool = BlockPool(256)
    steps = 12
    first = prompts(3, seed=1)
    second = prompts(2, seed=2)
    b1 = generate_pb2.Batch(
        id=1, requests=[pool.request(i, p, steps + 6) for i, p in enumerate(first)]
    )
    b2 = generate_pb2.Batch(
        id=2, requests=[pool.request(10 + i, p, steps) for i, p in enumerate(second)]
    )
    got: dict[int, list[int]] = {}
    cached = prefill_then_decode(service, b1, 3, got)
    # A second batch joins the running one: Decode concatenates them.
    resp2 = run(service.Prefill(generate_pb2.PrefillRequest(batch=b2), FakeContext()))
    record(got, resp2.generations)
    resp = run(
        service.Decode(generate_pb2.DecodeRequest(batches=[cached, resp2.batch]), FakeContext())
    )
    record(got, resp.generations)
    cached = resp.batch
    assert list(cached.request_ids) == [0, 1, 2, 10, 11]
    # Request 1 leaves; the rest keep decoding.
    cached = run(
        service.FilterBatch(
            generate_pb2.FilterBatchRequest(batch_id=cached.id, request_ids=[0, 2, 10, 11]),
            FakeContext(),
        )
    ).batch
    for _ in range(5):
        resp = run(service.Decode(generate_pb2.DecodeRequest(batches=[cached]), FakeContext()))
        record(got, resp.generations)
        cached = resp.batch
    for rid, prompt in [
        (0, first[0]),
        (1, first[1]),
        (2, first[2]),
        (10, second[0]),
        (11, second[1]),
    ]:
        assert got[rid] == greedy_reference(reference, prompt, len(got[rid])), f"request {rid}"
    run(service.ClearCache(generate_pb2.ClearCacheRequest(), FakeContext()))
    assert service.cache == {}


def test_prefill_logprobs_and_top_tokens(service, reference):
    run(service.Warmup(generate_pb2.WarmupRequest(max_batch_total_tokens=2048), FakeContext()))
    pool = BlockPool(128)
    prompt = prompts(1, seed=3)[0]
    req = pool.request(5, prompt, 4, prefill_logprobs=True, top_n_tokens=3)
    resp = run(
        service.Prefill(
            generate_pb2.PrefillRequest(batch=generate_pb2.Batch(id=7, requests=[req])),
            FakeContext(),
        )
    )
    gen = resp.generations[0]
    with torch.no_grad():
        logits = reference(torch.tensor([prompt])).logits[0]
    logprobs = torch.log_softmax(logits, -1)
    expected = logprobs[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    assert list(gen.prefill_tokens.ids) == prompt
    assert torch.isnan(torch.tensor(gen.prefill_tokens.logprobs[0]))
    torch.testing.assert_close(
        torch.tensor(gen.prefill_tokens.logprobs[1:]), expected, atol=1e-4, rtol=0
    )
    top = logprobs[-1].topk(3)
    assert list(gen.top_tokens[0].ids) == top.indices.tolist()
    assert gen.tokens.ids[0] == top.indices[0].item()
    torch.testing.assert_close(
        torch.tensor(gen.top_tokens[0].logprobs), top.values, atol=1e-4, rtol=0
    )


class VllmProcessing(LogitsProcessor):
    """vLLM's order: the logit bias, then the repetition penalty (HF's, over prompt and
    generated ids), then frequency and presence penalties over the generated ids only."""

    def __init__(self, prompt_len: int, case: dict) -> None:
        self.prompt_len, self.case = prompt_len, case

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        for token, bias in self.case.get("logit_bias", {}).items():
            scores[:, token] += bias
        penalty = self.case.get("repetition_penalty", 1.0)
        picked = scores.gather(1, input_ids)
        picked = torch.where(picked < 0, picked * penalty, picked / penalty)
        scores = scores.scatter(1, input_ids, picked)
        counts = torch.zeros_like(scores)
        generated = input_ids[:, self.prompt_len :]
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        frequency = self.case.get("frequency_penalty", 0.0)
        presence = self.case.get("presence_penalty", 0.0)
        return scores - frequency * counts - presence * (counts > 0).to(scores.dtype)


def _processed_greedy(model, prompt: list[int], n: int, case: dict) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            logits_processor=LogitsProcessorList([VllmProcessing(len(prompt), case)]),
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def test_penalties_and_logit_bias_on_greedy_rows_equal_transformers_as_vllm(service, reference):
    """Repetition over prompt and generated ids (HF); frequency and presence over the
    generated ids only (OpenAI, vLLM); the logit bias before them (vLLM); also for rows that
    join and leave a running batch, whose bias lists differ in length."""
    run(service.Warmup(generate_pb2.WarmupRequest(max_batch_total_tokens=4096), FakeContext()))
    pool = BlockPool(256, seed=4)
    steps = 10
    # The prompt repeats a token the model likes to generate: a penalty counting the prompt
    # would push it down from the first step.
    plain = greedy_reference(reference, prompts(1, seed=9)[0], steps)
    prompt = prompts(1, seed=9)[0] + [plain[0]] * 4
    cases = [
        {"frequency_penalty": 2.0},
        {"logit_bias": {plain[0]: -100.0, plain[1]: -100.0}},  # what it would say, banned
        {"frequency_penalty": 1.0, "presence_penalty": 0.5, "repetition_penalty": 1.3},
        {"frequency_penalty": -0.5},
        {},
        {"presence_penalty": 2.0},
        # Bias then penalty: the favoured prompt token is divided after its bias is added.
        {"logit_bias": {plain[0]: 2.0, 7: 1.5, 11: -3.0}, "repetition_penalty": 3.0},
    ]
    expected = [_processed_greedy(reference, prompt, steps, c) for c in cases]
    assert len({tuple(e) for e in expected}) >= 5, expected  # each setting changes the output
    assert not {plain[0], plain[1]} & set(expected[1])

    def params(case):
        return generate_pb2.NextTokenChooserParameters(
            temperature=1.0, top_p=1.0, typical_p=1.0, **{"repetition_penalty": 1.0, **case}
        )

    got: dict[int, list[int]] = {}
    first = [pool.request(i, prompt, steps, parameters=params(c)) for i, c in enumerate(cases[:3])]
    cached = prefill_then_decode(service, generate_pb2.Batch(id=21, requests=first), 2, got)
    later = [pool.request(3 + i, prompt, steps, parameters=params(c))
             for i, c in enumerate(cases[3:])]  # fmt: skip
    joined = run(service.Prefill(generate_pb2.PrefillRequest(batch=generate_pb2.Batch(
        id=22, requests=later)), FakeContext()))  # fmt: skip
    record(got, joined.generations)
    batches = [cached, joined.batch]
    while batches:
        resp = run(service.Decode(generate_pb2.DecodeRequest(batches=batches), FakeContext()))
        record(got, resp.generations)
        left = [rid for rid in resp.batch.request_ids if len(got[rid]) < steps]
        if not left:
            break
        batches = [run(service.FilterBatch(generate_pb2.FilterBatchRequest(
            batch_id=resp.batch.id, request_ids=left), FakeContext())).batch]  # fmt: skip
    for rid, case in enumerate(cases):
        assert got[rid] == expected[rid], (case, got[rid], expected[rid])
    run(service.ClearCache(generate_pb2.ClearCacheRequest(), FakeContext()))


def test_bad_requests_are_errors_not_crashes(service):
    run(service.Warmup(generate_pb2.WarmupRequest(max_batch_total_tokens=512), FakeContext()))
    with pytest.raises(AbortError, match="no cached batch 12345"):
        run(
            service.FilterBatch(
                generate_pb2.FilterBatchRequest(batch_id=12345, request_ids=[1]), FakeContext()
            )
        )
    with pytest.raises(AbortError, match="slots"):
        bad = generate_pb2.Request(id=1, input_ids=[5, 6, 7], blocks=[0], slots=[0])
        run(
            service.Prefill(
                generate_pb2.PrefillRequest(batch=generate_pb2.Batch(id=3, requests=[bad])),
                FakeContext(),
            )
        )
    vocab = service.runner.model.vocab_size
    with pytest.raises(AbortError, match=rf"logit_bias names tokens outside \[0, {vocab}\)"):
        bias = generate_pb2.NextTokenChooserParameters(logit_bias={3: 1.0, vocab: 1.0})
        bad = generate_pb2.Request(
            id=1, input_ids=[5, 6, 7], blocks=[0], slots=[0, 1, 2, 3], parameters=bias
        )
        run(
            service.Prefill(
                generate_pb2.PrefillRequest(batch=generate_pb2.Batch(id=4, requests=[bad])),
                FakeContext(),
            )
        )
    assert not service.cache
