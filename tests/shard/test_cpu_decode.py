"""The flat decode loop (shard/platforms/cpu/decode_loop.py) computes what the module forward does,
bit for bit, on every tiny model shape, architecture and dtype; the runner takes it for decode-only
steps and the module forward for every other step; and it is not built where its kernels
cannot run."""

import pytest
import torch
from lora_fixtures import ADAPTERS, make_adapter
from paged_helpers import NATIVE_REASON, run_paged

from bench.shard_batches import cache_tokens_needed, make_batch
from shard import wire
from shard.distributed import Distributed
from shard.models import load_model
from shard.platforms.cpu import lora_amx
from shard.platforms.cpu.decode_loop import CpuDecodePath
from shard.platforms.cpu.lora_amx import kernel_for
from shard.platforms.cpu.native.build import amx_linear_kernel
from shard.settings import ShardSettings
from shard.startup import build_service
from tests.shard.test_lora_vs_peft import lora_service, serve_mixed
from tests.shard.tiny_model_cases import NEW_ARCH_MODELS, TINY_MODELS

CPU = torch.device("cpu")
PROMPTS = [torch.arange(5, 26), torch.arange(40, 77) * 3 % 500, torch.arange(7, 10)]
STEPS = 12  # past a 16-token block boundary for the shortest prompt

# Architectures whose layers are their own composition of the blocks (Gemma 4's), which the
# loop does not restate: their decode steps run the module forward.
# Gemma 4's layers, and NemotronH's one-module blocks
OWN_LAYERS = [
    n
    for n, (arch, _) in NEW_ARCH_MODELS.items()
    if arch.startswith(("Gemma4", "Gemma3n", "NemotronH", "FalconH1", "Mamba2", "MambaFor"))
    or arch.startswith("FalconMamba")  # (pure Mamba 1: Mamba 2's blocks)
]


pytestmark = pytest.mark.skipif(
    NATIVE_REASON is not None, reason=f"no native kernels: {NATIVE_REASON}"
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize(
    "name",
    sorted(TINY_MODELS)
    + sorted(n for n in NEW_ARCH_MODELS if n not in OWN_LAYERS)
    + ["mixtral_top2", "qwen2_moe_shared_dense", "gpt_oss_sinks_clamped", "glm4_moe_grouped"]
    + ["deepseek_v3_mla", "mistral4_grouped_position_scaled"]  # latent attention's module
    + ["minimax_m2_projection_norms"]  # whole-projection q/k norms and partial rotary
    + ["olmoe_projection_norms", "granite_moe_multipliers", "dots1_grouped_sliding"]
    + ["solar_open_grouped", "granite_moe_swa_shared", "exaone_moe_grouped_nope"]
    + ["flex_olmo_post_norms", "afmoe_gated_nope", "granite_moe_shared"]
    + ["hunyuan_moe_shared", "deepseek_v32_sparse_attention", "mistral_large4_sparse_nope"]
    + ["cohere2_moe_shared_average"]  # a parallel layer with experts
    + ["jamba_mamba1_attention_experts"]  # Mamba 1 mixers beside attention and experts
    # KDA mixers (the module's decode) beside NoPE and head-gated latent attention, experts
    + ["kimi_linear_kda_nope_mla", "bailing_hybrid_kda_gated_mla"]
    # softplus gates (a head's, a head dim's) over each layer's own number of query heads
    + ["laguna_head_counts_softcapped", "laguna_per_element_stacked"]
    + ["mellum_sliding_dense_first"],
)
def test_decode_steps_equal_the_module_forward(tiny_model, name, dtype):
    model = load_model(tiny_model(name), dtype=dtype, device=CPU, dist=Distributed())
    path = CpuDecodePath.build(model, None)
    assert path is not None
    if dtype == torch.bfloat16 and amx_linear_kernel() is not None:  # the tile kernel, direct
        assert not isinstance(path.layers[0].qkv, torch.nn.Module)
    want_logits, want_tokens = run_paged(model, PROMPTS, STEPS)
    logits, tokens = run_paged(model, PROMPTS, STEPS, decode_forward=path)
    assert tokens == want_tokens
    for step, (got, want) in enumerate(zip(logits, want_logits, strict=True)):
        assert torch.equal(got, want), f"step {step}"


@pytest.mark.parametrize("name", OWN_LAYERS)
def test_not_built_for_layers_of_their_own(tiny_model, name, caplog):
    model = load_model(tiny_model(name), dtype=torch.bfloat16, device=CPU, dist=Distributed())
    with caplog.at_level("INFO"):
        assert CpuDecodePath.build(model, None) is None
    assert "not the shared DecoderLayer" in caplog.text


def test_not_built_for_chunked_attention(tiny_model, caplog):
    # Llama 4's chunked layers: the native decode kernel has no chunks (the attention backend
    # falls back to its masked path per step), so the loop leaves the model to its forward
    name = "llama4_chunked_nope_top1"
    model = load_model(tiny_model(name), dtype=torch.bfloat16, device=CPU, dist=Distributed())
    with caplog.at_level("INFO"):
        assert CpuDecodePath.build(model, None) is None
    assert "attends in chunks" in caplog.text


class Spy:
    """The runner's decode path, counting the steps it ran."""

    def __init__(self, path: CpuDecodePath) -> None:
        self.path, self.calls = path, 0

    def applies(self, meta) -> bool:
        return self.path.applies(meta)

    def __call__(self, *args):
        self.calls += 1
        return self.path(*args)


def test_the_runner_takes_it_for_decode_steps_only(tiny_model):
    settings = ShardSettings(
        model_id=str(tiny_model("llama_gqa_llama3")), uds_path="/unused", dtype="bfloat16"
    )
    runner = build_service(settings).runner
    spy = runner.decode_path = Spy(runner.decode_path)
    block = runner.block_size
    runner.allocate_kv_cache(cache_tokens_needed(3, 20, 6, block) // block)
    batch = wire.new_batch(make_batch(1, 3, 20, 5, block, runner.model.vocab_size), CPU)[0]
    runner.step(batch, {0: 8, 1: 20, 2: 20})  # prefill, two rows finish their prompt
    assert spy.calls == 0
    runner.step(batch, {0: 12})  # mixed: row 0's last chunk beside two decoding rows
    assert spy.calls == 0
    for _ in range(3):
        runner.step(batch)
    assert spy.calls == 3


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_steps_mixing_adapters_and_the_base_model_equal_the_module_forward(
    tiny_model, tmp_path, dtype, monkeypatch
):
    """The loop's LoRA copy, on the servicer: adapters of several ranks and target sets and
    base-model rows in one batch, prefill and chunked steps by the module forward, decode
    steps by the loop; the same ids and logprobs as with the module forward alone. In bf16
    where the tile kernel runs, both take the linears' products with their LoRA terms from it
    (shard/platforms/cpu/lora_amx.py)."""
    tile_calls = []

    def counted(weight, out_slices):
        kernel = kernel_for(weight, out_slices)
        if kernel is None:
            return None
        return lambda *args: tile_calls.append(1) or kernel(*args)

    monkeypatch.setattr(lora_amx, "kernel_for", counted)
    base = tiny_model("llama_gqa_llama3")
    adapters = {
        name: make_adapter(base, tmp_path / name, seed=i, **config)
        for i, (name, config) in enumerate(ADAPTERS.items())
    }
    service = lora_service(base, adapters, max_loras=len(adapters), dtype=dtype)
    names = ["", *ADAPTERS, "all_r8"]

    def serve() -> dict:
        return serve_mixed(service, names, seed=3, chunk=7)[1]

    spy = service.runner.decode_path = Spy(service.runner.decode_path)
    got = serve()
    assert spy.calls > 0
    assert bool(tile_calls) == (dtype == "bfloat16" and amx_linear_kernel() is not None)
    service.runner.decode_path = None
    assert serve() == got


def test_not_built_without_the_native_kernels(tiny_model, monkeypatch):
    model = load_model(tiny_model("llama_gqa_llama3"), dtype=torch.float32, device=CPU,
                       dist=Distributed())  # fmt: skip
    monkeypatch.setenv("SWITCHYARD_CPU_KERNELS", "0")
    assert CpuDecodePath.build(model, None) is None


def test_not_built_under_compile(servicer_model_dir):
    settings = ShardSettings(
        model_id=str(servicer_model_dir), uds_path="/unused", dtype="float32", compile=True
    )
    assert build_service(settings).runner.decode_path is None
