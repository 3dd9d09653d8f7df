"""Int4 weights kept packed and dequantized a slice of outputs at a time for a dense GEMM in
the activations' dtype: exact for fp32 activations, the path for layouts a platform's int4
kernel cannot take (act-order, odd group sizes), and for many rows, where a dense GEMM beats a
kernel that makes a pass over the weight per row."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shard.layers.quant.base import LinearWeight
from shard.layers.quant.int4 import QuantizedWeight, unpack_rows
from shard.platforms import platform_of

# Output features dequantized at once: bounds the temporary dense slice (1024 x K floats).
DEQUANT_CHUNK = 1024


def dequantize(
    codes: torch.Tensor,
    zeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    g_idx: torch.Tensor | None,
) -> torch.Tensor:
    """codes [c, K] (any int type), zeros/scales [G, c] -> fp32 [c, K] weight."""
    c, k = codes.shape
    scales = scales.T.float()  # [c, G]
    # code * s - z * s in one fused pass (addcmul): exact in fp32 like (code - z) * s, since
    # both products are exact (a 4-bit integer times a 16-bit scale) and so is their difference.
    offsets = zeros.T.float() * scales
    if g_idx is not None:
        return torch.addcmul(-offsets[:, g_idx], codes.float(), scales[:, g_idx])
    groups = scales.shape[1]
    if groups * group_size != k:
        codes = F.pad(codes, (0, groups * group_size - k))
    grouped = codes.view(c, groups, group_size).float()
    w = torch.empty_like(grouped)  # contiguous whatever the broadcast operands' strides
    torch.addcmul(-offsets[..., None], grouped, scales[..., None], out=w)
    w = w.view(c, -1)
    return w if w.shape[1] == k else w[:, :k]


class DequantizingInt4(LinearWeight):
    """Keeps the weight packed; every call dequantizes it a slice of outputs at a time and runs
    a dense GEMM in x's dtype. Exact for fp32 activations, and the path for layouts the int4
    kernel cannot take (act-order, odd group sizes) and for many rows."""

    def __init__(self, qw: QuantizedWeight) -> None:
        super().__init__()
        self.in_features, self.out_features = qw.in_features, qw.out_features
        self.group_size = qw.group_size
        self.register_buffer("qweight", qw.qweight)
        self.register_buffer("zeros", qw.zeros)
        self.register_buffer("scales", qw.scales)
        self.register_buffer("g_idx", None if qw.g_idx is None else qw.g_idx.long())
        self.ops = platform_of(qw.qweight.device)

    def codes(self, start: int, stop: int) -> torch.Tensor:
        """uint8 [stop - start, K] codes of those output features."""
        return unpack_rows(self.qweight[:, start:stop]).T

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.empty(*x.shape[:-1], self.out_features, dtype=x.dtype, device=x.device)
        for start in range(0, self.out_features, DEQUANT_CHUNK):
            stop = min(start + DEQUANT_CHUNK, self.out_features)
            w = dequantize(
                self.codes(start, stop),
                self.zeros[:, start:stop],
                self.scales[:, start:stop],
                self.group_size,
                self.g_idx,
            )
            b = None if bias is None else bias[start:stop]
            out[..., start:stop] = self.ops.linear(x, w.to(x.dtype), b)
        return out
