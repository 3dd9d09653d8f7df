"""FP8 weights: the one internal form every FP8 checkpoint format is read into.

Checkpoints store `{prefix}.weight` as float8_e4m3fn [out, in] and a float scale tensor:
    weight_scale_inv  [ceil(out / bo), ceil(in / bi)]  transformers' fine-grained FP8 (blocks)
    weight_scale      [ceil(out / bo), ceil(in / bi)]  compressed-tensors' block strategy
                      [out, 1] or [out]                per channel (compressed-tensors)
                      [1] or []                        per tensor (compressed-tensors, AutoFP8)
with weight[n, k] = fp8[n, k] * scale[n // bo, k // bi] (per channel and per tensor are blocks
of one row and of the whole matrix). An `input_scale` (static FP8 activations) is not used: the
kernels keep activations in the model's dtype (shard/layers/quant/config_fp8.py).

Internal form, for this rank's slice (N outputs, K inputs):
    weight  float8_e4m3fn [N, K]        as stored
    scales  float32 [N, ceil(K / block_k)]  one row per output: a block's scale repeated over its
                                        rows, so any cut along the outputs (tensor-parallel
                                        columns, a fused q/k/v piece starting mid-block) keeps
                                        its scales, and fused pieces concatenate
    block_k                             inputs per scale: the block's, or K (a single column)
A cut along the inputs (row-parallel) may start inside a block: the rank's scales are then
kept per finer block (a divisor of the block that the cut falls on), the same values repeated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shard.layers.quant.config import QuantizationConfig
from shard.layers.quant.config_fp8 import DEFAULT_BLOCK
from shard.layers.quant.reader import FeatureRange, read_part
from shard.weights import Weights, WeightsError

SCALE_NAMES = ("weight_scale_inv", "weight_scale")
# What a checkpoint may carry beside an FP8 weight that the weight-only kernels do not read.
UNUSED = ("input_scale",)


@dataclass
class Fp8Weight:
    weight: torch.Tensor
    scales: torch.Tensor
    block_k: int

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    def dequantize(self, dtype: torch.dtype, cols: slice = slice(None)) -> torch.Tensor:
        """[N, K] (or the outputs `cols`) in `dtype`: each product fp8 * scale formed in fp32 and
        rounded once, as the formats' own libraries dequantize."""
        weight, scales = self.weight[cols], self.scales[cols]
        per_input = scales.repeat_interleave(self.block_k, dim=1)[:, : self.in_features]
        return (weight.float() * per_input).to(dtype)


def scale_name(weights: Weights, prefix: str) -> str | None:
    """The module's FP8 scale tensor, None when it has none (a floating-point module)."""
    for suffix in SCALE_NAMES:
        if weights.has(f"{prefix}.{suffix}"):
            return f"{prefix}.{suffix}"
    return None


class Fp8Reader:
    def __init__(self, config: QuantizationConfig) -> None:
        self.block = config.block

    def features(self, weights: Weights, prefix: str) -> tuple[int, int]:
        shape = weights.shape(f"{prefix}.weight")
        if len(shape) != 2:
            raise WeightsError(f"{prefix}.weight has shape {shape}, expected [out, in]")
        return shape[0], shape[1]

    def read(
        self, weights: Weights, prefix: str, rows: FeatureRange, cols: FeatureRange
    ) -> Fp8Weight:
        """Outputs `rows` and inputs `cols` of module `prefix` (one of them whole): the rows and
        columns of its stored [out, in] weight."""
        name = f"{prefix}.weight"
        weight = read_part(weights, name, rows, cols)
        if weight.dtype != torch.float8_e4m3fn:
            raise WeightsError(
                f"{name} is {weight.dtype}; FP8 checkpoints are served with float8_e4m3fn weights"
            )
        scales, block_k = self._scales(weights, prefix, rows, cols)
        for unused in UNUSED:
            if weights.has(f"{prefix}.{unused}"):
                weights.mark_consumed(f"{prefix}.{unused}")
        return Fp8Weight(weight, scales, block_k)

    def _scales(
        self, weights: Weights, prefix: str, rows: FeatureRange, cols: FeatureRange
    ) -> tuple[torch.Tensor, int]:
        name = self._scale_name(weights, prefix)
        stored = weights.get_tensor(name, stored_dtype=True).float()
        out, k = rows.total, cols.total
        inputs = cols.stop - cols.start
        if stored.numel() == 1:  # per tensor
            return stored.reshape(1, 1).expand(rows.stop - rows.start, 1).contiguous(), inputs
        if list(stored.shape) in ([out], [out, 1]):  # per channel
            return stored.reshape(out, 1)[rows.start : rows.stop].contiguous(), inputs
        return block_scales(stored, self._grid(weights, name, out, k), rows, cols)

    def _scale_name(self, weights: Weights, prefix: str) -> str:
        name = scale_name(weights, prefix)
        if name is None:
            raise WeightsError(f"{prefix}: an FP8 weight without {' or '.join(SCALE_NAMES)}")
        return name

    def _grid(self, weights: Weights, name: str, out: int, k: int) -> tuple[int, int]:
        """The (output, input) block of the scale grid `name` of an [out, k] weight."""
        block_out, block_in = self._block(name)
        grid = [-(-out // block_out), -(-k // block_in)]
        if weights.shape(name) != grid:
            raise WeightsError(
                f"{name} has shape {weights.shape(name)}, but [{out}, {k}] in blocks of "
                f"{[block_out, block_in]} (the config's) needs {grid}, or one scale per output "
                "channel or per tensor"
            )
        return block_out, block_in

    def _block(self, name: str) -> tuple[int, int]:
        if self.block is not None:
            return self.block
        if name.endswith(".weight_scale_inv"):  # transformers' default block
            return DEFAULT_BLOCK
        raise WeightsError(
            f"{name}: a grid of scales, but the quantization_config names no block size"
        )


def block_scales(
    grid: torch.Tensor, block: tuple[int, int], rows: FeatureRange, cols: FeatureRange
) -> tuple[torch.Tensor, int]:
    """The internal form's (scales, block_k) for outputs `rows` and inputs `cols` of a weight
    whose scales are `grid`, one per `block` (outputs, inputs), blocks counted from its first
    row and column."""
    block_out, block_in = block
    per_row = grid.repeat_interleave(block_out, dim=0)[rows.start : rows.stop]
    # A cut of the inputs that starts inside a block: scales per finer block, a divisor of the
    # block that the cut falls on (each finer block keeps its block's scale), so that this
    # rank's input k lies in finer block k // fine.
    start = cols.start
    fine = math.gcd(block_in, start % block_in) if start % block_in else block_in
    local = torch.arange(-(-(cols.stop - start) // fine))
    return per_row[:, (start // fine + local) // (block_in // fine)].contiguous(), fine


def concat_columns(parts: Sequence[Fp8Weight], prefixes: Sequence[str]) -> Fp8Weight:
    """Fused layers' pieces along the outputs; their scales must cover the inputs alike."""
    first = parts[0]
    for part, prefix in zip(parts[1:], prefixes[1:], strict=True):
        if part.block_k != first.block_k or part.scales.shape[1] != first.scales.shape[1]:
            raise WeightsError(
                f"{prefix} scales its inputs differently from {prefixes[0]}, so the two cannot "
                "be fused into one matmul"
            )
    if len(parts) == 1:
        return first
    return Fp8Weight(
        weight=torch.cat([p.weight for p in parts]),
        scales=torch.cat([p.scales for p in parts]),
        block_k=first.block_k,
    )
