"""Decode steps replayed from graphs (shard/platforms/cuda/graphs.py) give what the eager steps
give.

Each case serves the same requests twice through the servicer (Prefill, Decode, FilterBatch),
with graphs and without, and compares every token and logprob. The schedule makes the graphs'
padding matter: four rows (bucket 4, no padding), then three after a filter (bucket 4, one
padded row that last held a live request's slot), and a bucket-2 step at the end. On a CPU the
graphs are "captured" by `EagerReplayer`, which runs the captured function again on the same
static buffers: everything but CUDA's capture itself. With a CUDA device the real graphs run too.
"""

from __future__ import annotations

import pytest
import torch
from lora_fixtures import ADAPTERS, make_adapter

from shard.cuda_graph_buckets import CudaGraphsError, parse_buckets
from shard.platforms.cuda.graphs import DecodeGraphs, EagerReplayer, buckets_for
from shard.settings import ShardSettings
from shard.startup import build_service
from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import BlockPool, FakeContext, prompts, run

CUDA = torch.cuda.is_available()
NO_CUDA = "CUDA graphs are captured by torch.cuda, which needs a CUDA device"
BUCKETS = (1, 2, 4)
MAX_TOTAL_TOKENS = 96  # the block table width the graphs hold: 6 blocks

# The Triton LoRA kernels run in the interpreter on a CPU: large tiles (see the fixture).
pytestmark = pytest.mark.usefixtures("whole_model_tiles")


def service(model_dir, attention: str, graphs: str, adapters: dict | None = None):
    """A warmed-up float32 servicer; graphs "eager" (EagerReplayer), "cuda" or "off"."""
    adapters = adapters or {}
    svc = build_service(
        ShardSettings(
            model_id=str(model_dir),
            uds_path="/unused",
            dtype="float32",
            attention=attention,
            lora_adapters=tuple((n, str(p)) for n, p in adapters.items()),
            max_loras=max(1, len(adapters)),
            max_lora_rank=16,
            cuda_graphs=BUCKETS if graphs == "cuda" else (),
            # Steps on request only, so each decode step replays once (the steps queued ahead,
            # a GPU's default: tests/shard/test_steps_ahead.py).
            overlap_schedule="off",
        )
    )
    runner = svc.runner
    runner.decode_path = None  # the CPU decode loop would take the eager steps: compare like
    for module in runner.model.modules():  # with like, the torch path of the torch backend
        if hasattr(getattr(module, "backend", None), "native"):
            module.backend.native = False
    if graphs == "eager":
        lora = svc.lora.step if svc.lora else None
        runner.graphs = DecodeGraphs(
            runner.model, BUCKETS, runner.device, lora, replayer=EagerReplayer()
        )
    if runner.graphs is not None:
        runner.graphs.replays = 0
        replay = runner.graphs.replay

        def counted(*args, **kwargs):
            hidden = replay(*args, **kwargs)
            runner.graphs.replays += hidden is not None
            return hidden

        runner.graphs.replay = counted
    warmup = pb.WarmupRequest(max_batch_total_tokens=4096, max_total_tokens=MAX_TOTAL_TOKENS)
    run(svc.Warmup(warmup, FakeContext()))
    return svc


def serve(svc, names: list[str]) -> dict[int, list[tuple[int, float]]]:
    """Four requests (names: their adapters, "" the base model) prefilled, decoded 3 steps, the
    second dropped, 3 more steps, the first dropped, 2 more: each request's (id, logprob)s."""
    pool = BlockPool(40, seed=4)
    texts = [[3 + t % 300 for t in p][:40] for p in prompts(len(names), seed=11)]
    requests = [
        pool.request(i, p, MAX_TOTAL_TOKENS - len(p), adapter_id=name)
        for i, (name, p) in enumerate(zip(names, texts, strict=True))
    ]
    got: dict[int, list[tuple[int, float]]] = {}

    def record(resp) -> pb.CachedBatch:
        for g in resp.generations:
            got.setdefault(g.request_id, []).append((g.tokens.ids[0], g.tokens.logprobs[0]))
        return resp.batch

    prefill = pb.PrefillRequest(batch=pb.Batch(id=3, requests=requests))
    batch = record(run(svc.Prefill(prefill, FakeContext())))
    for keep in (None, [0, 2, 3], [2, 3]):
        if keep is not None:
            kept = pb.FilterBatchRequest(batch_id=batch.id, request_ids=keep)
            batch = run(svc.FilterBatch(kept, FakeContext())).batch
        for _ in range(3):
            batch = record(run(svc.Decode(pb.DecodeRequest(batches=[batch]), FakeContext())))
    run(svc.ClearCache(pb.ClearCacheRequest(), FakeContext()))
    return got


def assert_same(got, want) -> None:
    assert got.keys() == want.keys()
    for rid in want:
        assert [t for t, _ in got[rid]] == [t for t, _ in want[rid]], f"request {rid}"
        torch.testing.assert_close(
            torch.tensor([lp for _, lp in got[rid]]),
            torch.tensor([lp for _, lp in want[rid]]),
            atol=1e-4,
            rtol=0,
        )


REPLAYERS = [
    "eager",
    pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason=NO_CUDA)),
]


# qwen2_moe_shared_dense: the MoE block (router, fused experts, shared expert) in captured
# steps; on a GPU its experts are the Triton kernel whichever the attention backend, so one
# backend suffices (the kernel's own graph test: tests/kernels/test_fused_moe.py).
CASES = [
    *((n, a) for n in ("llama_gqa_llama3", "qwen2_sliding_layers") for a in ("torch", "triton")),
    ("qwen2_moe_shared_dense", "torch"),
    # linear attention's state pools: the padded row updates the scratch slot, not a live one
    ("qwen3_5_linear_attention", "torch"),
    ("granite4_hybrid_dense_nope", "torch"),  # Mamba 2's conv and scan states likewise
    ("lfm2_short_conv_hybrid", "torch"),  # LFM2's short convolutions' inputs likewise
    ("falcon_h1_parallel_hybrid", "torch"),  # Falcon-H1: K/V and a state in every layer
    ("mamba2_pure", "torch"),  # no K/V at all: states only
    ("falcon_mamba_bcdt_norms", "torch"),  # Mamba 1's conv inputs and per-channel states
    ("nemotron_h_one_module_layers", "torch"),  # MLP-only layers, whose cache entry is empty
    # Gemma 4: the KV-sharing layers read the keys and values their source kept in the same
    # captured step; per-layer embeddings from the static input ids
    ("gemma4_per_layer_inputs_kv_sharing", "torch"),
    ("gemma3n_altup_laurel_sparse", "torch"),  # Gemma 3n's streams through the same
    # DeepSeek Sparse Attention: captured steps always choose (and attend over the chosen rows)
    # from the static block tables; eager ones past top_k likewise, within it densely
    ("deepseek_v32_sparse_attention", "torch"),
    ("mistral_large4_sparse_nope", "torch"),  # the position scales from the static positions
]


@pytest.mark.parametrize("graphs", REPLAYERS)
@pytest.mark.parametrize(("name", "attention"), CASES)
def test_graphs_equal_eager_steps(tiny_model, name, attention, graphs):
    model_dir = tiny_model(name)
    want = serve(service(model_dir, attention, "off"), ["", "", "", ""])
    svc = service(model_dir, attention, graphs)
    got = serve(svc, ["", "", "", ""])
    assert_same(got, want)
    assert svc.runner.graphs.replays == 9  # every decode step


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory):
    base = tiny_model("llama_gqa_llama3")
    root = tmp_path_factory.mktemp("graph_adapters")
    names = ["qv_r4", "all_r8"]
    return base, {
        n: make_adapter(base, root / n, seed=i, **ADAPTERS[n]) for i, n in enumerate(names)
    }


@pytest.mark.parametrize("graphs", REPLAYERS)
@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_adapter_steps_replay_with_the_triton_lora_kernels_only(adapters, attention, graphs):
    """Triton LoRA: adapter steps replay the LoRA graphs (the slot map a static buffer, the
    tiles computed in the graph). Torch LoRA groups tokens on the host: those steps run eagerly,
    and only the steps left with base-model rows replay."""
    base, paths = adapters
    names = ["qv_r4", "all_r8", "", ""]  # the filters leave base-only rows for the last steps
    want = serve(service(base, attention, "off", paths), names)
    svc = service(base, attention, graphs, paths)
    assert_same(serve(svc, names), want)
    assert svc.runner.graphs.replays == (9 if attention == "triton" else 3)


def test_the_flag_parses_and_a_cpu_refuses_an_explicit_list():
    assert parse_buckets("") is None
    assert parse_buckets("0") == ()
    assert parse_buckets("8, 1,2,2") == (1, 2, 8)
    for bad in ("x", "1,-2", "0,4"):
        with pytest.raises(CudaGraphsError, match="--cuda-graphs"):
            parse_buckets(bad)
    cpu = torch.device("cpu")
    assert buckets_for(cpu, None) == () and buckets_for(cpu, ()) == ()
    with pytest.raises(CudaGraphsError, match="--cuda-graphs 1,2: CUDA graphs need a CUDA"):
        buckets_for(cpu, (1, 2))
    cuda = torch.device("cuda")
    assert buckets_for(cuda, None)[:3] == (1, 2, 4)
    # Tensor-parallel shards capture only when asked (NCCL inside graphs is untested).
    assert buckets_for(cuda, None, world_size=2) == ()
    assert buckets_for(cuda, (1, 8), world_size=2) == (1, 8)
