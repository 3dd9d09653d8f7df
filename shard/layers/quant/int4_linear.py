"""The int4 LinearMethod: a format's reader for the tensors, one repacked layout, a backend.

Whatever the format, the slices this rank needs become one `QuantizedWeight`; fused layers
concatenate their pieces along the outputs, exactly as the float path does. The backend is the
platform's (shard/platforms/): on CUDA torch's tinygemm for decode-sized row counts, the
Triton W4A16 GEMM beyond and dequantize + cuBLAS for many rows (int4_cuda.py,
int4_triton.py); torch's int4 kernel on CPU for bfloat16; and dequantize + GEMM otherwise
(fp32 serving, act-order, group sizes the kernel does not take), which is exact in fp32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from shard.layers.quant import tinygemm
from shard.layers.quant.base import LinearWeight, Piece
from shard.layers.quant.config import QuantizationConfig
from shard.layers.quant.int4 import QuantizedWeight
from shard.layers.quant.int4_cpu import CpuInt4
from shard.layers.quant.int4_cuda import CudaInt4
from shard.layers.quant.int4_dequant import DequantizingInt4
from shard.layers.quant.int4_triton import TritonInt4
from shard.layers.quant.reader import FeatureRange
from shard.platforms import platform_of
from shard.weights import Weights, WeightsError


class FormatReader(Protocol):
    def out_features(self, weights: Weights, prefix: str) -> int: ...

    def in_features(self, weights: Weights, prefix: str) -> int: ...

    def read(
        self, weights: Weights, prefix: str, rows: FeatureRange, cols: FeatureRange
    ) -> QuantizedWeight: ...


def int4_weight(qw: QuantizedWeight, dtype: torch.dtype, triton: bool) -> LinearWeight:
    """The int4 GEMM the platform names for this device (`Platform.int4_kernel`); with `triton`
    (the Triton attention backend) the Triton GEMM where the platform's own is not one (the
    CPU's: tests run the Triton kernels there, interpreted). A GPU's is Triton's already, with
    tinygemm for decode rows: the Triton backend, its default, must not take tinygemm away
    (it did, and a 7B AWQ model decoded at 0.52x its bf16 model on the H200)."""
    kernel = platform_of(qw.qweight.device).int4_kernel
    if triton and kernel != "tinygemm+triton":
        kernel = "triton"
    if kernel == "triton":
        return TritonInt4(qw)
    if kernel == "tinygemm+triton":
        return CudaInt4(qw)
    group_size = tinygemm.group_size(qw) if kernel == "cpu" else None
    if dtype == torch.bfloat16 and group_size is not None:  # the CPU kernel's only fast case
        return CpuInt4(qw, group_size)
    return DequantizingInt4(qw)


def concat_columns(parts: Sequence[QuantizedWeight], prefixes: Sequence[str]) -> QuantizedWeight:
    """Pieces of fused layers side by side along the outputs. They share the input, so GPTQ's
    act-order gives them the same g_idx (computed from the same activations); check it."""
    first = parts[0]
    for part, prefix in zip(parts[1:], prefixes[1:], strict=True):
        same_groups = (part.g_idx is None) == (first.g_idx is None) and (
            part.g_idx is None or torch.equal(part.g_idx, first.g_idx)
        )
        if not same_groups or part.group_size != first.group_size:
            raise WeightsError(
                f"{prefix} groups its input rows differently from {prefixes[0]} (g_idx or "
                "group size), so the two cannot be fused into one matmul"
            )
    if len(parts) == 1:
        return first
    return QuantizedWeight(
        qweight=torch.cat([p.qweight for p in parts], dim=1),
        zeros=torch.cat([p.zeros for p in parts], dim=1),
        scales=torch.cat([p.scales for p in parts], dim=1),
        group_size=first.group_size,
        g_idx=first.g_idx,
    )


class Int4Method:
    def __init__(self, reader: FormatReader, config: QuantizationConfig) -> None:
        self.reader = reader
        self.config = config

    def out_features(self, weights: Weights, prefix: str) -> int:
        return self.reader.out_features(weights, prefix)

    def in_features(self, weights: Weights, prefix: str) -> int:
        return self.reader.in_features(weights, prefix)

    def check_row_split(self, weights: Weights, prefix: str) -> None:
        k, world = self.in_features(weights, prefix), weights.dist.world_size
        if not self.config.row_split_ok(k, world):
            working = [n for n in range(1, 65) if self.config.row_split_ok(k, n)]
            group = "a whole row" if self.config.group_size == -1 else self.config.group_size
            raise WeightsError(
                f"cannot split {prefix} across {world} shards: its {k} input features must "
                f"split on quantization group boundaries (group size {group}); shard counts "
                f"that work for it: {', '.join(map(str, working))}"
            )

    def read_columns(self, weights: Weights, pieces: Sequence[Piece]) -> QuantizedWeight:
        """The pieces' output features side by side, every input feature."""
        parts = []
        for piece in pieces:
            k = self.in_features(weights, piece.prefix)
            n = self.out_features(weights, piece.prefix)
            cols = FeatureRange(piece.start, piece.stop, n)
            parts.append(self.reader.read(weights, piece.prefix, FeatureRange.whole(k), cols))
        return concat_columns(parts, [p.prefix for p in pieces])

    def read_rows(self, weights: Weights, piece: Piece) -> QuantizedWeight:
        """The piece's input features, every output feature."""
        k = self.in_features(weights, piece.prefix)
        n = self.out_features(weights, piece.prefix)
        rows = FeatureRange(piece.start, piece.stop, k)
        return self.reader.read(weights, piece.prefix, rows, FeatureRange.whole(n))

    def load_columns(self, weights: Weights, pieces: Sequence[Piece]) -> LinearWeight:
        return int4_weight(self.read_columns(weights, pieces), weights.dtype, weights.triton)

    def load_rows(self, weights: Weights, piece: Piece) -> LinearWeight:
        return int4_weight(self.read_rows(weights, piece), weights.dtype, weights.triton)
