"""A Mixture-of-Experts layer's int4 weights of one kind (every expert's gate_up, or every
expert's down) stacked for the Triton fused MoE kernel, each expert in the one internal int4
layout of shard/layers/quant/int4.py (the layers repack AWQ, GPTQ and compressed-tensors into
it at load):

    qweight  int32 [E, K // 8, N]   eight 4-bit codes per int32 along the inputs K
    zeros    uint8 [E, G, N]        integer zero point per group
    scales         [E, G, N]        in the checkpoint's dtype
    g_idx    int32 [E, K] | None    each input row's group where it is not k // group_size
                                    (GPTQ's act-order: each expert has its own)

weight[e, k, n] = (code - zeros[e, g(k), n]) * scales[e, g(k), n], formed in fp32 (exact) and
rounded to the activations' dtype, as shard/layers/quant/int4_dequant.py forms it."""

from __future__ import annotations

import torch
from torch import nn

PACK = 8  # 4-bit codes per int32


class Int4Experts(nn.Module):
    def __init__(
        self,
        qweight: torch.Tensor,
        zeros: torch.Tensor,
        scales: torch.Tensor,
        group_size: int,
        g_idx: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        experts, words, outputs = qweight.shape
        groups = zeros.shape[1]
        if qweight.dtype != torch.int32 or zeros.dtype != torch.uint8:
            raise ValueError(f"int4 experts: qweight {qweight.dtype}, zeros {zeros.dtype}")
        if zeros.shape != (experts, groups, outputs) or scales.shape != zeros.shape:
            raise ValueError(
                f"int4 experts: qweight {tuple(qweight.shape)}, zeros {tuple(zeros.shape)}, "
                f"scales {tuple(scales.shape)}: want [E, K/8, N], [E, G, N], [E, G, N]"
            )
        if g_idx is not None and g_idx.shape != (experts, words * PACK):
            raise ValueError(f"int4 experts: g_idx {tuple(g_idx.shape)}, want [E, K]")
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("zeros", zeros.contiguous())
        self.register_buffer("scales", scales.contiguous())
        self.register_buffer("g_idx", None if g_idx is None else g_idx.int().contiguous())
        self.group_size = group_size

    def __len__(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1] * PACK

    @property
    def out_features(self) -> int:
        return self.qweight.shape[2]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """[E, N, K] in `dtype` (the dense experts' orientation): tests' reference, and the
        form a platform without an int4 kernel would compute."""
        shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=self.qweight.device)
        codes = (self.qweight.unsqueeze(2) >> shifts.view(1, 1, PACK, 1)) & 0xF
        codes = codes.flatten(1, 2)  # [E, K, N]
        if self.g_idx is not None:
            groups = self.g_idx.long()
        else:
            k = self.in_features
            groups = (torch.arange(k, device=codes.device) // self.group_size).expand(len(self), k)
        index = groups.unsqueeze(-1).expand(-1, -1, self.out_features)
        zeros = self.zeros.long().gather(1, index)
        scales = self.scales.float().gather(1, index)
        return ((codes - zeros).float() * scales).to(dtype).transpose(1, 2).contiguous()
