"""--compile (shard/compiled.py): the servicer's steps through torch.compile give transformers'
tokens and logprobs, in prefill, decode, one-token and mixed chunked steps, with two graphs in
all (one-token steps have their own); and what it cannot serve is refused by name."""

import pytest
import torch
import torch._dynamo

from shard.compiled import check_supported
from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2
from tests.shard import test_chunked_prefill as chunked
from tests.shard import test_server_steps as steps
from tests.shard.servicer_helpers import BlockPool, FakeContext, prompts, run

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def service(servicer_model_dir):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    settings = ShardSettings(
        model_id=str(servicer_model_dir), uds_path="/unused", dtype="float32", compile=True
    )
    service = build_service(settings)
    assert service.runner.compiled
    # Warmup with a batch compiles both graphs before any request, as the router's warmup does.
    pool = BlockPool(64)
    batch = generate_pb2.Batch(id=99, requests=[pool.request(0, prompts(1, seed=9)[0], 4)])
    run(
        service.Warmup(
            generate_pb2.WarmupRequest(batch=batch, max_batch_total_tokens=8192), FakeContext()
        )
    )
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    return service


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


def test_no_step_compiles_a_new_graph_after_warmup(service):
    # Runs after the tests above (file order): prefill, decode, one-token and mixed steps of
    # many sizes, and a KV cache reallocated by every Warmup, all reused the two graphs.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"world_size": 2}, "one shard only"),
        ({"device": torch.device("cuda")}, "CPU only"),
        ({"attention": "triton"}, "torch attention backend"),
        ({"quantized": True}, "quantized checkpoints"),
    ],
)
def test_what_compile_cannot_serve_is_refused_by_name(change, reason):
    args = {"world_size": 1, "device": CPU, "attention": "torch", "quantized": False}
    check_supported(**args)  # the supported case passes
    with pytest.raises(ValueError, match=f"--compile: .*{reason}"):
        check_supported(**{**args, **change})


def test_compile_without_a_cpp_compiler_is_refused_by_name(monkeypatch):
    monkeypatch.setattr("shard.compiled.shutil.which", lambda name: None)
    with pytest.raises(ValueError, match="--compile: .*no C\\+\\+ compiler"):
        check_supported(world_size=1, device=CPU, attention="torch", quantized=False)
