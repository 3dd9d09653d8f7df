"""The int4 weight tiles of the fused MoE kernel (fused_moe.py, INT4_W): one expert's
[BLOCK_K, BLOCK_N] tile of an `Int4Experts` stack (shard/platforms/int4_experts.py),
dequantized in registers as the W4A16 GEMM dequantizes (int4_dequant.py's exact code - zero,
no int-to-float conversion), times its scales in fp32, rounded once to the activations' dtype:
the value shard/layers/quant/int4_dequant.py's dense weight would hold. The weights stay half a
byte an element in memory, which is what int4 experts are for: a decode step reads each chosen
expert's weight once.

Groups: one per K tile where BLOCK_K divides the group size (one row of scales and zero points
per tile), else (ROW_GROUPS) each input row's own, k // group_size or the expert's act-order
g_idx[k], gathered per element."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels.int4_dequant import codes_minus_zeros
from shard.platforms.int4_experts import PACK, Int4Experts

WORD = tl.constexpr(PACK)  # 4-bit codes per int32, as a kernel reads it


@triton.jit
def int4_tile(q_ptr, z_ptr, s_ptr, g_ptr, expert, k0, cols, k_total, stride_qe, stride_qk,
              stride_ze, stride_zg, stride_ge, group_size, exponent, dtype,
              BLOCK_K: tl.constexpr, ROW_GROUPS: tl.constexpr, ACT_ORDER: tl.constexpr,
              EVEN_K: tl.constexpr):  # fmt: skip
    """w[k0 : k0 + BLOCK_K, cols] of `expert` -> [BLOCK_K, BLOCK_N] in `dtype`. qweight,
    zeros and scales are contiguous along the outputs (Int4Experts makes them so). Words past
    k_total read 0 (finite weights: the caller's activations read 0 there)."""
    words = k0 // WORD + tl.arange(0, BLOCK_K // WORD)
    q = q_ptr + expert * stride_qe + cols[:, None] + words[None, :].to(tl.int64) * stride_qk
    if EVEN_K:
        packed = tl.load(q)
    else:
        packed = tl.load(q, mask=words[None, :] < k_total // WORD, other=0)
    meta = expert * stride_ze + cols  # [BLOCK_N]: this expert's column of zeros and scales
    if ROW_GROUPS:
        ks = tl.minimum(k0 + tl.arange(0, BLOCK_K), k_total - 1)
        if ACT_ORDER:
            g = tl.load(g_ptr + expert * stride_ge + ks).to(tl.int64)
        else:
            g = (ks // group_size).to(tl.int64)
        at = meta[:, None] + g[None, :] * stride_zg
        w = codes_minus_zeros(packed, tl.load(z_ptr + at), exponent, BLOCK_K)
        w = w * tl.load(s_ptr + at).to(tl.float32)
    else:
        at = meta + (k0 // group_size) * stride_zg
        w = codes_minus_zeros(packed, tl.load(z_ptr + at)[:, None], exponent, BLOCK_K)
        w = w * tl.load(s_ptr + at).to(tl.float32)[:, None]
    return tl.trans(w.to(dtype))


def check_int4(w: Int4Experts, name: str, experts: int, outputs: int, inputs: int) -> None:
    """The stack's shape against the other operands' (the kernel trusts it)."""
    if (len(w), w.out_features, w.in_features) != (experts, outputs, inputs):
        raise ValueError(
            f"fused_moe: int4 {name} holds {len(w)} experts of [{w.out_features}, "
            f"{w.in_features}] (outputs, inputs); want {experts} of [{outputs}, {inputs}]"
        )


def int4_groups(w: Int4Experts, block_k: int) -> tuple[bool, bool]:
    """(ROW_GROUPS, ACT_ORDER) for a K tile of block_k inputs."""
    act_order = w.g_idx is not None
    return act_order or w.group_size % block_k != 0, act_order


def int4_args(w: Int4Experts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """(zeros, scales, g_idx or a dummy, the expert stride of zeros and scales, their group
    stride, g_idx's expert stride): zeros and scales share one shape, so one set of strides."""
    g_idx = w.g_idx if w.g_idx is not None else w.zeros
    return w.zeros, w.scales, g_idx, w.zeros.stride(0), w.zeros.stride(1), g_idx.stride(0)
