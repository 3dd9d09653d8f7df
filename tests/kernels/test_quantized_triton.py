"""Quantized checkpoints made by their formats' own tools (tests/quant_fixtures/), loaded with
the Triton backend (compiled on a GPU, interpreted on a CPU): every quantized linear runs a
Triton GEMM (the W4A16 GEMM for int4, its FP8 variant for FP8: prefill tiles several along M
for the 2-prompt batch, then the skinny decode path with scales applied after the dot), the
attention runs the Triton kernels, and the logits of the prefill and of every decode step, and
the greedy ids, equal transformers on the same model dequantized by the format's library
(each fixture's reference/).

The serving path of `--attention triton` is integration-tests/test_triton_attention.py's; the
kernels' numerics shape by shape are test_w4a16.py's and test_fp8_matmul.py's.
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE

from shard.distributed import Distributed
from shard.layers.quant.fp8_linear import TritonFp8
from shard.layers.quant.int4_triton import TritonInt4
from shard.models import load_model
from shard.platforms.int4_experts import Int4Experts
from tests.shard.paged_helpers import assert_every_step_equals_reference, run_paged
from tests.shard.quant_fixtures import fixture

# the kernels' tiling is tests/kernels/test_w4a16.py's and test_fp8_matmul.py's: here one tile
# where the layers allow (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("whole_model_tiles")
STEPS = 2
# int4 with asymmetric zero points (gptq_v2); FP8 in 128 x 128 blocks with a ragged last block
# (compressed-tensors), and transformers' FP8 on Phi-3's fused qkv_proj, whose v piece starts
# mid-block on 2 shards
CASES = {
    "gptq_v2_g32_asym_llama": TritonInt4,
    "ct_fp8_block_qwen3": TritonFp8,
    "hf_fp8_block_phi3": TritonFp8,
    # FP8 experts kept FP8 for the fused MoE kernel (its FP8_W variant), FP8 attention
    "hf_fp8_block_qwen3_moe": torch.float8_e4m3fn,
    # GPTQ experts kept int4 for the fused MoE kernel (its INT4_W variant), int4 attention
    "gptq_g32_sym_qwen3_moe": Int4Experts,
    # llm-compressor's asymmetric W4A16 experts: their zero points in the kernel's tiles
    "ct_w4a16_group32_asym_qwen3_moe": Int4Experts,
}


@pytest.mark.parametrize("name", [n for n in CASES if fixture(n).is_dir()])
def test_greedy_ids_and_logits_equal_transformers_on_the_library_dequantized_model(name):
    from transformers import AutoModelForCausalLM

    ours = load_model(
        fixture(name), dtype=torch.float32, device=DEVICE, dist=Distributed(), attention="triton"
    )
    if CASES[name] is Int4Experts:
        experts = ours.layers[0].mlp.experts
        assert isinstance(experts.w13, Int4Experts) and isinstance(experts.w2, Int4Experts)
        assert isinstance(ours.layers[0].self_attn.o_proj.weight, TritonInt4)
    elif CASES[name] == torch.float8_e4m3fn:
        experts = ours.layers[0].mlp.experts
        assert experts.w13.dtype == experts.w2.dtype == torch.float8_e4m3fn
        assert isinstance(ours.layers[0].self_attn.o_proj.weight, TritonFp8)
    else:
        assert isinstance(ours.layers[0].mlp.down_proj.weight, CASES[name])
    ref = AutoModelForCausalLM.from_pretrained(fixture(name) / "reference", dtype=torch.float32)
    gen = torch.Generator().manual_seed(2)
    batch = [torch.randint(3, 300, (n,), generator=gen) for n in (21, 13)]
    logits, tokens = run_paged(ours, [p.to(DEVICE) for p in batch], STEPS, seed=4)
    assert_every_step_equals_reference(ref, batch, logits, tokens, atol=1e-4)
