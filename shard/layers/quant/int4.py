"""The one internal form every int4/int8 checkpoint format is repacked into at load time.

AWQ, GPTQ and compressed-tensors differ in how they pack codes and zero points, not in what
they mean: weight[k, n] = (code[k, n] - zero[g(k), n]) * scale[g(k), n], with g(k) the group
of input row k (k // group_size, or GPTQ's act-order `g_idx`). Each format's module unpacks its
tensors into `QuantizedWeight`; the compute backends (torch's CPU int4 kernel, the Triton
W4A16 GEMM, the dequantizing fallback) take it from there, so a kernel never knows a format.

Layout (K = input features of this rank, N = output features of this rank):
    qweight  int32 [K // 8, N]  eight 4-bit codes per int32 along K: code of row 8*i + j sits in
                                bits 4*j .. 4*j+3 of qweight[i, n] (GPTQ's order, no interleave)
    zeros    uint8 [G, N]       integer zero point per group (8 for symmetric 4-bit)
    scales   [G, N]             in the checkpoint's dtype (fp16 usually), never rounded further
    g_idx    int32 [K] | None   group of each row when it is not k // group_size (act-order)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PACK = 8  # 4-bit codes per int32
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


@dataclass
class QuantizedWeight:
    qweight: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    group_size: int
    g_idx: torch.Tensor | None = None
    bits: int = 4

    @property
    def in_features(self) -> int:
        return self.qweight.shape[0] * PACK

    @property
    def out_features(self) -> int:
        return self.qweight.shape[1]

    def groups(self) -> torch.Tensor:
        """[K] int64: the group of every input row."""
        if self.g_idx is not None:
            return self.g_idx.long()
        return torch.arange(self.in_features, device=self.qweight.device) // self.group_size

    def codes(self) -> torch.Tensor:
        """[K, N] uint8 codes, unpacked."""
        return unpack_rows(self.qweight)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[K, N] weight in `dtype`, computed in fp32 (exact for fp16/bf16 scales)."""
        g = self.groups()
        codes = self.codes().float()
        w = (codes - self.zeros.float()[g]) * self.scales.float()[g]
        return w.to(dtype)


def pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """[K, N] codes in 0..15 -> int32 [K // 8, N] in the layout above."""
    k, n = codes.shape
    if k % PACK:
        raise ValueError(f"{k} rows cannot be packed {PACK} to an int32")
    c = codes.to(torch.int32).view(k // PACK, PACK, n)
    shifts = _SHIFTS.to(codes.device).view(1, PACK, 1)
    return (c << shifts).sum(dim=1, dtype=torch.int32)


def unpack_rows(qweight: torch.Tensor) -> torch.Tensor:
    """int32 [K // 8, N] -> uint8 [K, N] codes (the inverse of `pack_rows`)."""
    rows, n = qweight.shape
    shifts = _SHIFTS.to(qweight.device).view(1, PACK, 1)
    codes = (qweight.unsqueeze(1) >> shifts) & 0xF
    return codes.reshape(rows * PACK, n).to(torch.uint8)
