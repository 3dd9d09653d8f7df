"""The router refuses a step whose shards disagree on the sampled tokens or on their batch."""

import pytest

from router.shard_agreement import ShardDivergenceError, check_agreement
from switchyard_pb import generate_pb2 as pb
from tests.router.harness import async_test, router_env, wait_until


def answer(tokens: dict[int, int], batch_ids: list[int] | None = None) -> pb.DecodeResponse:
    out = pb.DecodeResponse(
        generations=[
            pb.Generation(request_id=rid, tokens=pb.Tokens(ids=[tok], logprobs=[-0.5]))
            for rid, tok in tokens.items()
        ]
    )
    if batch_ids is not None:
        out.batch.CopyFrom(pb.CachedBatch(id=7, request_ids=batch_ids, size=len(batch_ids)))
    return out


def test_agreeing_shards_pass():
    same = answer({1: 10, 2: 20}, [1, 2])
    check_agreement("Decode", [same, answer({1: 10, 2: 20}, [1, 2]), same])
    check_agreement("Decode", [same])  # one shard agrees with itself


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (answer({1: 10, 2: 21}, [1, 2]), r"request 2: shard 0 has \[20\], shard 1 has \[21\]"),
        (answer({2: 20, 1: 10}, [1, 2]), r"shard 1 answered request 2 where shard 0 answered 1"),
        (answer({1: 10}, [1, 2]), r"shard 1 answered 1 request\(s\) but shard 0 answered 2"),
        (answer({1: 10, 2: 20}, [1]), r"cached batch .*diverged"),
        (answer({1: 10, 2: 20}), r"cached batch None"),
    ],
)
def test_any_difference_is_an_error(other, message):
    with pytest.raises(ShardDivergenceError, match=message):
        check_agreement("Decode", [answer({1: 10, 2: 20}, [1, 2]), other])


@async_test
async def test_divergent_shards_fail_the_batch_with_424_and_the_router_recovers(model_dir, caplog):
    async with router_env(model_dir) as env:
        # Rank 1 samples differently from rank 0: from the first Prefill on, their tokens differ.
        env.shards[1]._next = lambda req: (req.ids[-1] + 2) % env.shards[1].vocab_size
        r = await env.client.post("/generate", json={"inputs": "H", "parameters": {}})
        assert r.status == 424
        body = await r.json()
        assert body["error_type"] == "generation"
        assert "the shards' answers to Prefill diverged" in body["error"]
        # Which request and which tokens: in the log, under the id the client was given.
        detail = "Prefill: shards disagree on the token sampled"
        logged = [rec.getMessage() for rec in caplog.records]
        assert any(body["request_id"] in m and detail in m for m in logged), logged
        await wait_until(lambda: "ClearCache" in env.shards[1].calls)
        del env.shards[1]._next  # the class's deterministic next token again
        r = await env.client.post(
            "/generate", json={"inputs": "H", "parameters": {"max_new_tokens": 3}}
        )
        assert r.status == 200 and (await r.json())["generated_text"] == "IJK"
        await wait_until(lambda: env.infer.allocator.used_blocks == 0)
        assert env.violations() == []


def test_shards_must_fail_the_same_adapter_requests():
    def prefill(failed: list[int]) -> pb.PrefillResponse:
        out = pb.PrefillResponse()
        out.batch.CopyFrom(pb.CachedBatch(id=7, request_ids=[1], size=1))
        if failed:
            out.adapter_failures.add(adapter_id="a", reason="unreadable", request_ids=failed)
        return out

    check_agreement("Prefill", [prefill([2]), prefill([2])])
    with pytest.raises(ShardDivergenceError, match=r"shard 1 failed adapter requests \[\]"):
        check_agreement("Prefill", [prefill([2]), prefill([])])
