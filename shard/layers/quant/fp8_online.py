"""`--quantize fp8` on a floating-point checkpoint: each linear quantized to FP8 at load, as
transformers' FineGrainedFP8 quantizes on load (`Fp8Quantize`: 128 x 128 blocks, a block's
scale its largest magnitude over e4m3's largest finite value, 448; values divided by it,
clamped, rounded to e4m3). Like transformers, a weight whose dimensions are not whole blocks
stays in floating point (a fused layer with such a piece becomes one dense weight:
MixedFp8Method). The quantized model equals loading transformers' own FP8 quantization of the
checkpoint, bit for bit (tests/shard/test_fp8_online.py). Every rank quantizes the blocks
covering its slice, so its scales are the whole weight's.
"""

from __future__ import annotations

import torch

from shard.layers.quant.config import QuantizationConfig
from shard.layers.quant.fp8 import Fp8Reader, Fp8Weight, block_scales
from shard.layers.quant.reader import FeatureRange
from shard.weights import Weights

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def quantizable(weights: Weights, prefix: str, config: QuantizationConfig) -> bool:
    """A floating-point 2-D weight of whole blocks (transformers' rule)."""
    name = f"{prefix}.weight"
    if not weights.has(name) or config.block is None:
        return False
    shape = weights.shape(name)
    block_out, block_in = config.block
    return len(shape) == 2 and shape[0] % block_out == 0 and shape[1] % block_in == 0


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, k] (whole blocks) -> (float8_e4m3fn [n, k], float32 scales [n / bo, k / bi]) with
    w ~ fp8 * scale, formed as transformers' Fp8Quantize forms them (an all-zero block: 1)."""
    block_out, block_in = block
    n, k = w.shape
    tiles = w.float().reshape(n // block_out, block_out, k // block_in, block_in)
    largest = tiles.abs().amax(dim=(1, 3))
    factor = torch.where(largest > 0, FP8_MAX / torch.where(largest > 0, largest, 1.0), 1.0)
    scaled = tiles * factor[:, None, :, None]
    q = scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(n, k)
    return q, 1.0 / factor


class OnlineFp8Reader(Fp8Reader):
    def read(
        self, weights: Weights, prefix: str, rows: FeatureRange, cols: FeatureRange
    ) -> Fp8Weight:
        assert self.block is not None
        block_out, block_in = self.block
        name = f"{prefix}.weight"
        # the whole blocks covering this slice (one of rows / cols is the whole dimension)
        row0 = rows.start - rows.start % block_out
        col0 = cols.start - cols.start % block_in
        row1 = -(-rows.stop // block_out) * block_out
        col1 = -(-cols.stop // block_in) * block_in
        if rows.is_whole:
            w = weights.get_range(name, 1, col0, col1, stored_dtype=True)
        else:
            w = weights.get_range(name, 0, row0, row1, stored_dtype=True)
        q, grid = quantize_blocks(w, self.block)
        local_rows = FeatureRange(rows.start - row0, rows.stop - row0, row1 - row0)
        local_cols = FeatureRange(cols.start - col0, cols.stop - col0, col1 - col0)
        scales, block_k = block_scales(grid, self.block, local_rows, local_cols)
        weight = q[local_rows.start : local_rows.stop, local_cols.start : local_cols.stop]
        return Fp8Weight(weight.contiguous(), scales, block_k)
