"""A request that starts with a cached prefix (Request.prefix_len over blocks another request
filled) gives transformers' greedy ids and logprobs: the shard computes only the rest."""

import pytest
import torch

from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import (
    BLOCK_SIZE,
    AbortError,
    BlockPool,
    FakeContext,
    greedy_reference,
    run,
    start_warm_service,
)


@pytest.fixture(scope="module")
def service(servicer_model_dir):
    return start_warm_service(servicer_model_dir)


def _generate(service, request: pb.Request, batch_id: int) -> list[pb.Generation]:
    resp = run(
        service.Prefill(
            pb.PrefillRequest(batch=pb.Batch(id=batch_id, requests=[request])), FakeContext()
        )
    )
    out = list(resp.generations)
    while len(out) < request.stopping_parameters.max_new_tokens:
        resp = run(service.Decode(pb.DecodeRequest(batches=[resp.batch]), FakeContext()))
        out.extend(resp.generations)
    run(service.ClearCache(pb.ClearCacheRequest(id=resp.batch.id), FakeContext()))
    return out


def _sharing(pool: BlockPool, donor: pb.Request, rid: int, prompt, max_new: int, shared: int):
    """A request whose first `shared` blocks are the donor's (read-only), the rest fresh."""
    total = len(prompt) + max_new
    blocks = list(donor.blocks[:shared])
    blocks += [pool.free.pop() for _ in range(-(-total // BLOCK_SIZE) - shared)]
    slots = [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(total)]
    return pb.Request(
        id=rid,
        input_ids=prompt,
        blocks=blocks,
        slots=slots,
        parameters=donor.parameters,
        stopping_parameters=pb.StoppingCriteriaParameters(max_new_tokens=max_new),
        prefix_len=shared * BLOCK_SIZE,
    )


def _logprobs(reference, sequence: list[int], start: int) -> torch.Tensor:
    with torch.no_grad():
        logits = reference(torch.tensor([sequence])).logits[0]
    targets = torch.tensor(sequence[start:])[:, None]
    return torch.log_softmax(logits, -1)[start - 1 : -1].gather(1, targets)[:, 0]


@pytest.mark.parametrize(
    "case",
    ["shared_system_prompt", "prefix_is_whole_prompt_but_last", "next_turn_over_generated"],
)
def test_cached_prefix_equals_transformers(service, servicer_reference, case):
    pool = BlockPool(200, seed=3)
    system = [3 + (7 * i) % 450 for i in range(53)]  # 3 full blocks and 5 tokens
    donor = pool.request(1, system, 12)
    donor_out = [g.tokens.ids[0] for g in _generate(service, donor, 1)]
    if case == "shared_system_prompt":
        prompt, shared = system[:48] + [9, 99, 199, 299, 11], 3  # diverges inside block 4
    elif case == "prefix_is_whole_prompt_but_last":
        prompt, shared = system[:49], 3  # only the last token runs (as a decode row)
    else:
        # The next turn resends the history: the donor's generated tokens fill block 4 too
        # (53 + 12 = 65 tokens, 64 of them computed), so 4 blocks come from the cache.
        prompt, shared = system + donor_out + [21, 22, 23], 4
    request = _sharing(pool, donor, 2, prompt, 7, shared)
    generations = _generate(service, request, 2)
    ids = [g.tokens.ids[0] for g in generations]
    assert ids == greedy_reference(servicer_reference, prompt, 7)
    expected = _logprobs(servicer_reference, prompt + ids, len(prompt))
    got = torch.tensor([g.tokens.logprobs[0] for g in generations])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_the_prefix_is_read_from_the_cache_not_recomputed(service, servicer_reference):
    """Control: the same prefix_len over blocks nobody filled gives other logprobs."""
    pool = BlockPool(200, seed=4)
    prompt = [5 + (3 * i) % 400 for i in range(40)]
    unfilled = pool.request(1, prompt, 1)
    request = _sharing(pool, unfilled, 2, prompt, 1, 2)
    got = _generate(service, request, 3)[0].tokens.logprobs[0]
    expected = _logprobs(
        servicer_reference, prompt + [greedy_reference(servicer_reference, prompt, 1)[0]], 40
    )
    assert abs(got - float(expected[0])) > 1e-3


def test_prefix_len_the_shard_cannot_honour_is_refused(service):
    pool = BlockPool(16)
    whole = pool.request(1, list(range(3, 19)), 2, prefix_len=16)
    with pytest.raises(AbortError, match="prefix_len 16 must be less than the prompt length 16"):
        run(
            service.Prefill(
                pb.PrefillRequest(batch=pb.Batch(id=70, requests=[whole])), FakeContext()
            )
        )
    logprobs = pool.request(2, list(range(3, 30)), 2, prefix_len=16, prefill_logprobs=True)
    with pytest.raises(AbortError, match="prompt logprobs need the whole prompt"):
        run(
            service.Prefill(
                pb.PrefillRequest(batch=pb.Batch(id=71, requests=[logprobs])), FakeContext()
            )
        )
    run(service.ClearCache(pb.ClearCacheRequest(), FakeContext()))
