"""FP8 experts kept in FP8 (Qwen3-MoE's `-FP8` releases, per-expert tensors with scales): where
the experts run the Triton fused MoE kernel (CUDA; interpreted on a CPU in tests), it scales the
FP8 weights in registers (shard/platforms/cuda/kernels/fused_moe.py, FP8_W), so the experts take
one byte an element, as the checkpoint does. Elsewhere (the CPU's grouped GEMMs) they are
dequantized at load (shard/layers/moe.py).

Each expert's gate and up rows and down columns of this rank are read in the internal form of
shard/layers/quant/fp8.py (per-row scales; a cut of the inputs inside a block re-blocked
finer), then stacked: w13 [E, 2I, H] and w2 [E, H, I] float8_e4m3fn with their Fp8Scales.
"""

from __future__ import annotations

import torch

from shard.layers.quant.fp8 import Fp8Weight, concat_columns
from shard.layers.quant.fp8_source import fp8_reader
from shard.layers.quant.reader import FeatureRange
from shard.platforms import platform_of
from shard.platforms.fp8_scales import Fp8Scales
from shard.weights import Weights, WeightsError


def keeps_fp8_experts(weights: Weights) -> bool:
    """Whether FP8 experts stay FP8: the Triton kernel runs them (the shard's Triton backend,
    or a platform whose FP8 GEMM is Triton's)."""
    return weights.triton or platform_of(weights.device).fp8_kernel == "triton"


def read_fp8_expert(
    weights: Weights, modules: list[str], start: int, stop: int
) -> tuple[Fp8Weight, Fp8Weight]:
    """(gate rows start:stop then up's, down columns start:stop) of one expert's modules
    [gate, up, down] ([up, down]: an ungated expert's), FP8 as stored."""
    assert weights.quantization is not None
    reader = fp8_reader(weights.quantization)
    *firsts, down = modules
    pieces = []
    for module in firsts:
        out, k = weights.shape(f"{module}.weight")
        pieces.append(
            reader.read(weights, module, FeatureRange(start, stop, out), FeatureRange.whole(k))
        )
    out, k = weights.shape(f"{down}.weight")
    rows = reader.read(weights, down, FeatureRange.whole(out), FeatureRange(start, stop, k))
    return concat_columns(pieces, firsts), rows


def stack_fp8_experts(
    experts: list[tuple[Fp8Weight, Fp8Weight]], down: str
) -> tuple[torch.Tensor, torch.Tensor, Fp8Scales, Fp8Scales]:
    """w13, w2 and their scales over this rank's experts."""
    (first13, first2) = experts[0]
    for w13, w2 in experts:
        if (w13.block_k, w2.block_k) != (first13.block_k, first2.block_k):
            raise WeightsError(f"{down}: the experts' FP8 scale blocks differ from one another")
    w13 = torch.stack([w.weight for w, _ in experts])
    w2 = torch.stack([w.weight for _, w in experts])
    s13 = Fp8Scales(torch.stack([w.scales for w, _ in experts]).contiguous(), first13.block_k)
    s2 = Fp8Scales(torch.stack([w.scales for _, w in experts]).contiguous(), first2.block_k)
    return w13, w2, s13, s2
