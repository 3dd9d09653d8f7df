"""The FP8 LinearMethod: this rank's slices of an FP8 checkpoint's linears, and what multiplies
with them, as the platform names it (`Platform.fp8_kernel`):

- "triton" (CUDA; the Triton backend interpreted on a CPU in tests): the weight stays FP8 (one
  byte an element, half the bf16 weight's memory and bandwidth) and the W8A16 GEMM scales it in
  registers (shard/platforms/cuda/kernels/w4a16.py's kernel, FP8 variant); from
  DEQUANT_MIN_ROWS rows, column slices are dequantized for a dense GEMM (compute-bound there).
- None (the CPU): dequantized once at load into the model's dtype, then the platform's dense
  GEMM (oneDNN / AMX), since the CPU has no FP8 matmul worth running; logged once per process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from shard.layers.quant.base import LinearWeight, Piece
from shard.layers.quant.config import QuantizationConfig
from shard.layers.quant.fp8 import Fp8Weight, concat_columns
from shard.layers.quant.fp8_source import fp8_reader, is_fp8
from shard.layers.quant.int4_triton import DENSE_SLICE_ELEMENTS, DEQUANT_MIN_ROWS
from shard.layers.quant.reader import FeatureRange
from shard.layers.quant.unquantized import DenseWeight
from shard.platforms import platform_of
from shard.weights import Weights

log = logging.getLogger(__name__)
_logged: set[str] = set()


class TritonFp8(LinearWeight):
    """The FP8 weight kept as stored; the W8A16 GEMM below DEQUANT_MIN_ROWS rows."""

    def __init__(self, fw: Fp8Weight) -> None:
        super().__init__()
        self.out_features, self.in_features = fw.out_features, fw.in_features
        self.block_k = fw.block_k
        self.register_buffer("weight", fw.weight)
        self.register_buffer("scales", fw.scales)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from shard.platforms.cuda.kernels.w4a16 import fp8_matmul

        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] >= DEQUANT_MIN_ROWS:
            out = self.dense_matmul(flat)
        else:
            out = fp8_matmul(flat, self.weight, self.scales, self.block_k)
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def dense_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        """flat [M, K] @ the weight dequantized to flat's dtype, a slice of outputs at a time."""
        fw = Fp8Weight(self.weight, self.scales, self.block_k)
        n = self.out_features
        rows = max(128, DENSE_SLICE_ELEMENTS // max(1, self.in_features))
        if rows >= n:
            return flat @ fw.dequantize(flat.dtype).T
        out = torch.empty(flat.shape[0], n, dtype=flat.dtype, device=flat.device)
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            out[:, start:stop] = flat @ fw.dequantize(flat.dtype, slice(start, stop)).T
        return out


def fp8_weight(fw: Fp8Weight, dtype: torch.dtype, triton: bool) -> LinearWeight:
    kernel = "triton" if triton else platform_of(fw.weight.device).fp8_kernel
    if kernel == "triton":
        return TritonFp8(fw)
    if "dequantized" not in _logged:
        _logged.add("dequantized")
        log.info(
            "FP8 weights are dequantized to %s at load on this device (no FP8 GEMM here): "
            "they take that dtype's memory",
            str(dtype).removeprefix("torch."),
        )
    return DenseWeight(fw.dequantize(dtype))


class Fp8Method:
    def __init__(self, config: QuantizationConfig) -> None:
        self.reader = fp8_reader(config)
        self.config = config
        if config.activations and "activations" not in _logged:
            _logged.add("activations")
            log.info(
                "the checkpoint asks for FP8 activations (%s); they stay in the model's dtype "
                "(weight-only FP8, W8A16)",
                config.activations,
            )

    def out_features(self, weights: Weights, prefix: str) -> int:
        return self.reader.features(weights, prefix)[0]

    def in_features(self, weights: Weights, prefix: str) -> int:
        return self.reader.features(weights, prefix)[1]

    def check_row_split(self, weights: Weights, prefix: str) -> None:
        pass  # any equal split: a cut inside a scale block is re-blocked (fp8.py)

    def load_columns(self, weights: Weights, pieces: Sequence[Piece]) -> LinearWeight:
        parts = []
        for piece in pieces:
            n, k = self.reader.features(weights, piece.prefix)
            outputs = FeatureRange(piece.start, piece.stop, n)
            parts.append(self.reader.read(weights, piece.prefix, outputs, FeatureRange.whole(k)))
        fw = concat_columns(parts, [p.prefix for p in pieces])
        return fp8_weight(fw, weights.dtype, weights.triton)

    def load_rows(self, weights: Weights, piece: Piece) -> LinearWeight:
        n, k = self.reader.features(weights, piece.prefix)
        inputs = FeatureRange(piece.start, piece.stop, k)
        fw = self.reader.read(weights, piece.prefix, FeatureRange.whole(n), inputs)
        return fp8_weight(fw, weights.dtype, weights.triton)


class MixedFp8Method(Fp8Method):
    """A fused layer whose pieces are partly FP8, partly floating point (transformers' FP8
    quantizer leaves a weight whose shape is not a whole number of blocks, such as a k_proj of
    64 outputs, in floating point): one dense weight, the FP8 pieces dequantized at load."""

    def load_columns(self, weights: Weights, pieces: Sequence[Piece]) -> LinearWeight:
        dense = []
        for piece in pieces:
            n, k = self.reader.features(weights, piece.prefix)
            if not is_fp8(weights, piece.prefix):
                name = f"{piece.prefix}.weight"
                dense.append(weights.get_range(name, 0, piece.start, piece.stop))
            else:
                outputs = FeatureRange(piece.start, piece.stop, n)
                fw = self.reader.read(weights, piece.prefix, outputs, FeatureRange.whole(k))
                dense.append(fw.dequantize(weights.dtype))
        return DenseWeight(torch.cat(dense))
