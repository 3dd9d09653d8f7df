"""--compile (shard/platforms/cpu/compiled.py): the servicer's steps through torch.compile give
transformers' tokens and logprobs, in prefill, decode, one-token and mixed chunked steps, with one
graph in all when the worst case fits the small-step class and two when larger steps have their own;
and what it cannot serve is refused by name."""

from collections import defaultdict

import pytest
import torch
import torch._dynamo

from shard.platforms.cpu.compiled import check_supported
from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2
from tests.shard import test_chunked_prefill as chunked
from tests.shard import test_server_steps as steps
from tests.shard.servicer_helpers import BlockPool, FakeContext, greedy_reference, prompts, run

CPU = torch.device("cpu")


# Small-step class limits: the real one (the test prompts all fit it, so one graph serves every
# step of more than one token) and one the test steps straddle (decode and short chunks in the
# small-step graph, prompts in the large-step one).
SIZE_CLASSES = {"one size class": None, "two size classes": 20}
WARMUP_PROMPT = list(range(3, 33))  # 30 tokens: past the second limit, within the first


@pytest.fixture(scope="module", params=list(SIZE_CLASSES))
def service(request, servicer_model_dir):
    limit = SIZE_CLASSES[request.param]
    with pytest.MonkeyPatch.context() as patch:
        if limit is not None:
            patch.setattr("shard.platforms.cpu.compiled.SMALL_STEP_TOKENS", limit)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        settings = ShardSettings(
            model_id=str(servicer_model_dir), uds_path="/unused", dtype="float32", compile=True
        )
        service = build_service(settings)
        assert service.runner.compiled
        forward = service.runner.forward
        service.step_sizes = defaultdict(list)  # graph -> token counts of the steps it ran
        for graph in ("_small", "_large"):
            setattr(forward, graph, _recording(getattr(forward, graph), service.step_sizes[graph]))
        # Warmup compiles every graph before any request, as the router's warmup does.
        pool = BlockPool(64)
        batch = generate_pb2.Batch(id=99, requests=[pool.request(0, WARMUP_PROMPT, 4)])
        run(
            service.Warmup(
                generate_pb2.WarmupRequest(batch=batch, max_batch_total_tokens=8192), FakeContext()
            )
        )
    service.graphs = 1 if limit is None else 2
    service.limit = limit
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == service.graphs
    return service


def _recording(graph, sizes: list[int]):
    def call(forward, input_ids, *args):
        sizes.append(input_ids.shape[0])
        return graph(forward, input_ids, *args)

    return call


@pytest.fixture
def reference(servicer_reference):
    return servicer_reference


# The servicer's own end-to-end tests, run on the compiled shard (this module's `service`).
# The chunked one first: it relies on the fixture's 8,192-token cache, which the others resize.
test_prompt_chunks_mixed_with_decoding_rows_equal_transformers = (
    chunked.test_prompt_chunks_mixed_with_decoding_rows_equal_transformers
)
test_prefill_then_decode_with_a_joining_batch_equals_transformers = (
    steps.test_prefill_then_decode_with_a_joining_batch_equals_transformers
)
test_prefill_logprobs_and_top_tokens = steps.test_prefill_logprobs_and_top_tokens


def test_a_lone_request_decoding_in_one_token_steps_equals_transformers(service, reference):
    pool = BlockPool(64, seed=3)
    prompt = prompts(1, seed=4)[0]
    batch = generate_pb2.Batch(id=21, requests=[pool.request(0, prompt, 8)])
    resp = run(service.Prefill(generate_pb2.PrefillRequest(batch=batch), FakeContext()))
    got = list(resp.generations[0].tokens.ids)
    small = service.step_sizes["_small"]
    before = len(small)
    for _ in range(6):
        resp = run(service.Decode(generate_pb2.DecodeRequest(batches=[resp.batch]), FakeContext()))
        got += resp.generations[0].tokens.ids
    assert got == greedy_reference(reference, prompt, 7)
    # Each one-token step ran the small-step graph, padded to two rows (no graph of its own).
    assert small[before:] == [2] * 6
    run(service.ClearCache(generate_pb2.ClearCacheRequest(), FakeContext()))


def test_no_step_compiles_a_new_graph_after_warmup(service):
    # Runs after the tests above (file order): prefill, decode, one-token and mixed steps of
    # many sizes, and a KV cache reallocated by every Warmup, all reused the warmed-up graphs.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == service.graphs


def test_steps_run_the_graph_of_their_size_class(service):
    small, large = service.step_sizes["_small"], service.step_sizes["_large"]
    # The warm-up's first step is decode-sized: the small graph is autotuned at that size.
    assert small[0] == 16
    assert max(small) > 16
    if service.limit is None:  # the worst case fit the small class: no large graph at all
        assert large == []
    else:
        assert large and min(large) > service.limit >= max(small)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"world_size": 2}, "one shard only"),
        ({"device": torch.device("cuda")}, "CPU only"),
        ({"attention": "triton"}, "torch attention backend"),
        ({"quantized": True}, "quantized checkpoints"),
        ({"experts": True}, "Mixture-of-Experts models"),
    ],
)
def test_what_compile_cannot_serve_is_refused_by_name(change, reason):
    args = {"world_size": 1, "device": CPU, "attention": "torch", "quantized": False}
    check_supported(**args)  # the supported case passes
    with pytest.raises(ValueError, match=f"--compile: .*{reason}"):
        check_supported(**{**args, **change})


def test_compile_without_a_cpp_compiler_is_refused_by_name(monkeypatch):
    monkeypatch.setattr("shard.platforms.cpu.compiled.shutil.which", lambda name: None)
    with pytest.raises(ValueError, match="--compile: .*no C\\+\\+ compiler"):
        check_supported(world_size=1, device=CPU, attention="torch", quantized=False)
