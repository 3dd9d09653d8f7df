"""A Mixture-of-Experts layer's experts in Triton: Platform.fused_moe (shard/platforms/base.py)
for CUDA, computing what shard/platforms/grouped_moe.py computes with torch.

The step's T * K (token, choice) pairs are numbered p = t * K + k. Six launches in three steps:

1. align (`moe_align`, three small kernels): the pairs sorted by expert (stable: in pair order
   within an expert), each expert's run padded with a sentinel id (T * K) to a multiple of
   BLOCK_M, so that every BLOCK_M-row block holds one expert's rows; the expert of each block;
   the padded total. Pairs whose id is -1 (an expert another rank holds) are placed past the
   total, in blocks nobody computes. Everything stays on the device and every buffer is sized by
   its static maximum (T * K pairs + (BLOCK_M - 1) padding for each of at most min(E, T * K)
   experts with rows), so nothing is read on the host and the whole call can be captured in a
   CUDA graph (graphs.py): blocks past the total return at once.
2. gate_up: one grouped GEMM over the blocks, each program the matching gate and up tiles of one
   block's rows (w13[e] rows n and I + n), writing act(gate) * up to a [T * K, I] buffer at its
   pairs' rows (ungated experts, Nemotron 3's: w13[e] is the up projection alone, [I, H], and
   the buffer holds act(up)).
3. down: one grouped GEMM reading those rows back through the same blocks, each row multiplied
   by its top-k weight, into an fp32 [T * K, H] buffer; then one reduction over k per token
   (k in order, so results do not depend on scheduling; dropped pairs' rows are never written
   and never read) rounded once to x's dtype.

Rounding follows the torch form where it rounds on purpose: gate and up are rounded to x's dtype,
act(gate) is rounded, and so is act(gate) * up (the intermediate is stored in the dtype, as
torch's ops would). The GEMMs accumulate in fp32 (fp32 inputs: ieee, not TF32); the weighted
down rows and their sum over k stay fp32 until the output (the torch form rounds each weighted
row and the running sum to the dtype). The fp32 [T * K, H] buffer is the call's largest
transient: 512 MiB for an 8192-token prefill of Qwen3-30B-A3B's shape (H 2048, top-8).

FP8 experts (FP8_W: w13 and w2 float8_e4m3fn with per-(expert, row, K block) scales, the form of
shard/layers/quant/fp8.py): each weight tile is converted to fp32 (exact), scaled by its rows'
scales and rounded to x's dtype, the value the weight dequantized at load would hold, before the
tile matmul; the K tile is chosen to lie inside one scale block. The weights stay one byte an
element in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels import check_device, dot_options
from shard.platforms.cuda.kernels.int4_dequant import EXPONENT_2P23
from shard.platforms.cuda.kernels.moe_int4 import check_int4, int4_args, int4_groups, int4_tile
from shard.platforms.fp8_scales import Fp8Scales
from shard.platforms.int4_experts import Int4Experts

# A layer's experts of one kind: dense or FP8 [E, N, K], or an int4 stack
Experts = torch.Tensor | Int4Experts

# Activation names (shard/platforms/activations.py) -> the epilogue's compile-time switch.
# 3, gpt-oss's clamped SwiGLU, reads the up half too (alpha, limit): the kernel tests for it.
# 4, relu(x)^2, is an ungated experts' activation (Nemotron 3's).
ACTIVATIONS = {"silu": 0, "swish": 0, "gelu_pytorch_tanh": 1, "gelu": 2, "clamped_swiglu": 3,
               "relu2": 4}  # fmt: skip
UNGATED_ACTIVATIONS = ("silu", "swish", "gelu_pytorch_tanh", "gelu", "relu2")

INT4_WARPS = 8  # warps of the GEMMs' programs with int4 experts (fused_moe)
ALIGN_CHUNK = 64  # pairs per program of the count and scatter kernels
ALIGN_ROWS = 16  # chunks (or blocks) per step of the plan kernel's loops


@dataclass(frozen=True)
class Tiles:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


def default_tiles(pairs: int, experts: int, dtype: torch.dtype) -> Tiles:
    """Static tiles, by the average rows per expert. Up to 32 (decode, and for Qwen3-30B-A3B's
    128 experts at top-8 every step up to 512 tokens) a 16-row block wastes least on padding
    and an expert's few blocks still share its weight tiles in L2 (blocks of one expert are
    neighbouring programs); above, 64-row blocks read each weight tile a quarter as often.
    BLOCK_N = BLOCK_K = 64 in 16-bit, three stages: at most 72 KiB of shared memory, within
    sm_80's and sm_90's. fp32 (ieee dots, on the FMA units) takes 32 x 32: its operands live
    in registers, and 64 x 64 spilled them in the gate_up kernel's two accumulators."""
    block_m = 16 if pairs <= 32 * experts else 64
    if dtype == torch.float32:
        return Tiles(block_m, 32, 32)
    return Tiles(block_m, 64, 64)


@dataclass(frozen=True)
class MoeAlignment:
    """`sorted_ids` [max_blocks * block_m] int32: pair ids by expert, each expert's run padded to a
    multiple of block_m with `num_pairs` (the sentinel), dropped pairs after `total`, the rest
    sentinel; `expert_ids` [max_blocks] int32: each block's expert (E past the total); `total`
    [1] int32: the padded row count of the kept pairs (a device tensor, never read here)."""

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    total: torch.Tensor
    num_pairs: int
    block_m: int

    @property
    def max_blocks(self) -> int:
        return self.expert_ids.shape[0]


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, num_pairs, num_experts, CHUNK: tl.constexpr,
                  E_PAD: tl.constexpr):  # fmt: skip
    """counts[c, e]: pairs of chunk c on expert e; counts[c, E]: its dropped pairs."""
    chunk = tl.program_id(0)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    in_range = offs < num_pairs
    ids = tl.load(ids_ptr + offs, mask=in_range, other=-1).to(tl.int32)
    kept = (ids >= 0) & (ids < num_experts)
    experts = tl.arange(0, E_PAD)
    hits = (ids[:, None] == experts[None, :]) & kept[:, None]
    row = counts_ptr + chunk * (num_experts + 1)
    tl.store(row + experts, tl.sum(hits.to(tl.int32), axis=0), mask=experts < num_experts)
    tl.store(row + num_experts, tl.sum((in_range & ~kept).to(tl.int32), axis=0))


@triton.jit
def _plan_kernel(counts_ptr, sorted_ids_ptr, expert_ids_ptr, total_ptr, num_chunks, num_experts,
                 num_pairs, max_padded, max_blocks, BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
                 COLS: tl.constexpr, FILL: tl.constexpr):  # fmt: skip
    """One program: each expert's padded start; then, in place of each chunk's counts, the
    slot of the chunk's first pair on each expert (the expert's start plus its pairs in earlier
    chunks); the total; the expert of each block; the sentinel in every slot (the scatter
    kernel, launched next, writes the pairs' own)."""
    width = num_experts + 1
    cols = tl.arange(0, COLS)
    is_expert = cols < num_experts
    totals = tl.zeros([COLS], dtype=tl.int32)
    for c0 in range(0, num_chunks, ROWS):
        rows = c0 + tl.arange(0, ROWS)
        mask = (rows[:, None] < num_chunks) & (cols[None, :] < width)
        totals += tl.sum(tl.load(counts_ptr + rows[:, None] * width + cols[None, :], mask=mask,
                                 other=0), axis=0)  # fmt: skip
    # Experts padded to whole blocks; the dropped pairs' bucket (column E) last, unpadded.
    padded = tl.where(is_expert, (totals + BLOCK_M - 1) // BLOCK_M * BLOCK_M, totals)
    ends = tl.cumsum(padded, axis=0)
    running = ends - padded
    tl.store(total_ptr, tl.sum(tl.where(is_expert, padded, 0), axis=0))
    for c0 in range(0, num_chunks, ROWS):
        rows = c0 + tl.arange(0, ROWS)
        mask = (rows[:, None] < num_chunks) & (cols[None, :] < width)
        ptrs = counts_ptr + rows[:, None] * width + cols[None, :]
        tile = tl.load(ptrs, mask=mask, other=0)
        tl.store(ptrs, running[None, :] + tl.cumsum(tile, axis=0) - tile, mask=mask)
        running += tl.sum(tile, axis=0)
    # A block's expert: how many experts' runs end at or before its first row (empty experts'
    # runs are empty, so they are stepped over; E for blocks past the total).
    for b0 in range(0, max_blocks, ROWS):
        blocks = b0 + tl.arange(0, ROWS)
        before = (ends[None, :] <= blocks[:, None] * BLOCK_M) & is_expert[None, :]
        tl.store(expert_ids_ptr + blocks, tl.sum(before.to(tl.int32), axis=1),
                 mask=blocks < max_blocks)  # fmt: skip
    sentinel = tl.zeros([FILL], dtype=tl.int32) + num_pairs
    for s0 in range(0, max_padded, FILL):
        slots = s0 + tl.arange(0, FILL)
        tl.store(sorted_ids_ptr + slots, sentinel, mask=slots < max_padded)


@triton.jit
def _scatter_kernel(ids_ptr, offsets_ptr, sorted_ids_ptr, num_pairs, num_experts,
                    CHUNK: tl.constexpr):  # fmt: skip
    """Each pair to its slot: its chunk's offset for its expert plus the number of earlier
    pairs of the chunk on the same expert (stable, so the layout is the same every run)."""
    chunk = tl.program_id(0)
    lanes = tl.arange(0, CHUNK)
    offs = chunk * CHUNK + lanes
    in_range = offs < num_pairs
    ids = tl.load(ids_ptr + offs, mask=in_range, other=-1).to(tl.int32)
    key = tl.where((ids >= 0) & (ids < num_experts), ids, num_experts)
    earlier = (key[:, None] == key[None, :]) & (lanes[None, :] < lanes[:, None])
    rank = tl.sum(earlier.to(tl.int32), axis=1)
    base = tl.load(offsets_ptr + chunk * (num_experts + 1) + key, mask=in_range, other=0)
    tl.store(sorted_ids_ptr + base + rank, offs, mask=in_range)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """The pairs of topk_ids [T, K] (any integer dtype, values in [-1, E)) sorted and padded per
    expert to block_m rows; see MoeAlignment. No host synchronisation."""
    ids = topk_ids.reshape(-1).contiguous()
    pairs = ids.numel()
    device = ids.device
    # Each expert with rows pads at most block_m - 1; whole blocks, so every block's ids load.
    max_blocks = triton.cdiv(pairs + min(num_experts, pairs) * (block_m - 1), block_m)
    max_padded = max_blocks * block_m
    chunks = triton.cdiv(pairs, ALIGN_CHUNK)
    offsets = torch.empty(chunks, num_experts + 1, dtype=torch.int32, device=device)
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=device)
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=device)
    total = torch.empty(1, dtype=torch.int32, device=device)
    if pairs:
        e_pad = max(16, triton.next_power_of_2(num_experts))
        _count_kernel[(chunks,)](ids, offsets, pairs, num_experts, CHUNK=ALIGN_CHUNK, E_PAD=e_pad)
        _plan_kernel[(1,)](
            offsets, sorted_ids, expert_ids, total, chunks, num_experts, pairs, max_padded,
            max_blocks, BLOCK_M=block_m, ROWS=ALIGN_ROWS,
            COLS=max(16, triton.next_power_of_2(num_experts + 1)), FILL=1024,
        )  # fmt: skip
        _scatter_kernel[(chunks,)](ids, offsets, sorted_ids, pairs, num_experts, CHUNK=ALIGN_CHUNK)
    else:
        total.zero_()
    return MoeAlignment(sorted_ids, expert_ids, total, pairs, block_m)


@triton.jit
def _activation(g, ACT: tl.constexpr):
    """The gate's activation in fp32 (ACTIVATIONS): silu, gelu's tanh form, gelu (erf),
    relu squared."""
    if ACT == 0:
        out = g / (1.0 + tl.exp(-g))
    elif ACT == 1:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)  # sqrt(2 / pi)
        # tanh through exp (triton has no portable tanh): right at both infinities, and its
        # absolute error near 0 is fp32's, which is what 1 + tanh keeps.
        out = 0.5 * g * (2.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0))
    elif ACT == 4:
        r = tl.maximum(g, 0.0)
        out = r * r
    else:
        out = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))  # 1 / sqrt(2)
    return out


@triton.jit
def _clamped_swiglu(gate, up, alpha, limit):
    """gpt-oss's (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit), in
    fp32 (torch rounds each op to the dtype; this rounds the result once)."""
    g = tl.minimum(gate, limit)
    u = tl.minimum(tl.maximum(up, -limit), limit)
    return (u + 1.0) * (g / (1.0 + tl.exp(-alpha * g)))


@triton.jit
def _scaled(w, scale, dtype):
    """An FP8 weight tile [BLOCK_K, BLOCK_N] times its columns' scales, formed in fp32 (FP8 to
    fp32 is exact) and rounded once to `dtype`, as the weight dequantized at load would be."""
    return (w.to(tl.float32) * scale.to(tl.float32)[None, :]).to(dtype)


@triton.jit
def _block_rows(sorted_ids_ptr, expert_ids_ptr, total_ptr, num_pairs, BLOCK_M: tl.constexpr):
    """This program's block: (whether it is past the total, its expert, its pair ids, which
    of them are real). Padding rows take the block's first pair (the smallest id: a block below
    the total starts with a real pair, the sentinel is larger than any): they load rows that
    are real and written, and are never stored, so the GEMMs' row loads need no mask."""
    pid_m = tl.program_id(0)
    past = pid_m * BLOCK_M >= tl.load(total_ptr)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    pairs = tl.where(valid, pairs, tl.min(pairs, axis=0))
    return past, expert, pairs.to(tl.int64), valid


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, b_ptr, s_ptr, z_ptr, gi_ptr, out_ptr, sorted_ids_ptr,
                    expert_ids_ptr, total_ptr, num_pairs, inter, hidden, stride_xt, stride_xh,
                    stride_we, stride_wn, stride_wk, stride_be, stride_se, stride_sn, stride_zg,
                    stride_ge, group_size, exponent, stride_ot, alpha, limit,
                    TOP_K: tl.constexpr, ACT: tl.constexpr, GATED: tl.constexpr,
                    HAS_BIAS: tl.constexpr,
                    FP8_W: tl.constexpr, SCALE_K: tl.constexpr, INT4_W: tl.constexpr,
                    ROW_GROUPS: tl.constexpr, ACT_ORDER: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):  # fmt: skip
    """out[p, n] = act(gate) * up for the block's pairs p, columns n of this program's tile
    (HAS_BIAS: gate and up plus the expert's bias rows n and I + n first; clamped_swiglu:
    gpt-oss's activation of both halves, with `alpha` and `limit`; FP8_W: FP8 weights, each
    scaled by s[e, n, k // SCALE_K] and rounded to x's dtype before the tile matmul; INT4_W:
    an Int4Experts stack, w its qweight, z and s its zeros and scales, gi its g_idx, each tile
    dequantized by moe_int4.int4_tile). GATED False: w holds the up rows alone, and out is
    act(up), the up tile taking the gate tile's place here (its accumulator, its rows n)."""
    past, expert, pairs, valid = _block_rows(
        sorted_ids_ptr, expert_ids_ptr, total_ptr, num_pairs, BLOCK_M
    )
    if past:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.minimum(offs_n, inter - 1).to(tl.int64)  # clamped: read, never stored
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + (pairs // TOP_K)[:, None] * stride_xt
    gate_cols = w_ptr + expert * stride_we + cols[None, :] * stride_wn
    up_cols = gate_cols + inter * stride_wn
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + offs_k
        if EVEN_K:
            a = tl.load(x_rows + ks[None, :] * stride_xh)
        else:  # past H x reads 0: nothing is added, whatever the weight holds there
            a = tl.load(x_rows + ks[None, :] * stride_xh, mask=ks[None, :] < hidden, other=0.0)
        if INT4_W:
            g = int4_tile(w_ptr, z_ptr, s_ptr, gi_ptr, expert, k0, cols, hidden, stride_we,
                          stride_wk, stride_se, stride_zg, stride_ge, group_size, exponent,
                          a.dtype, BLOCK_K, ROW_GROUPS, ACT_ORDER, EVEN_K)  # fmt: skip
            if GATED:
                u = int4_tile(w_ptr, z_ptr, s_ptr, gi_ptr, expert, k0, cols + inter, hidden,
                              stride_we, stride_wk, stride_se, stride_zg, stride_ge, group_size,
                              exponent, a.dtype, BLOCK_K, ROW_GROUPS, ACT_ORDER,
                              EVEN_K)  # fmt: skip
        elif EVEN_K:
            g = tl.load(gate_cols + ks[:, None] * stride_wk)
            if GATED:
                u = tl.load(up_cols + ks[:, None] * stride_wk)
        else:
            g = tl.load(gate_cols + ks[:, None] * stride_wk, mask=ks[:, None] < hidden, other=0.0)
            if GATED:
                u = tl.load(up_cols + ks[:, None] * stride_wk, mask=ks[:, None] < hidden,
                            other=0.0)  # fmt: skip
        if FP8_W:  # a K tile lies in one scale block (fused_moe chooses BLOCK_K so)
            scales = s_ptr + expert * stride_se + (k0 // SCALE_K)
            g = _scaled(g, tl.load(scales + cols * stride_sn), a.dtype)
            if GATED:
                u = _scaled(u, tl.load(scales + (cols + inter) * stride_sn), a.dtype)
        if DOT_UPCAST:  # interpreter only, see shard.platforms.cuda.kernels.dot_options
            a = a.to(tl.float32)
            g = g.to(tl.float32)
            if GATED:
                u = u.to(tl.float32)
        acc_gate = tl.dot(a, g, acc_gate, input_precision=DOT_PRECISION)
        if GATED:
            acc_up = tl.dot(a, u, acc_up, input_precision=DOT_PRECISION)
    # Rounded where torch rounds: the product's halves (then plus the bias, rounded again, as
    # torch's `x @ w + b`), act(gate), and act(gate) * up.
    dtype = out_ptr.dtype.element_ty
    gate = acc_gate.to(dtype).to(tl.float32)
    up = acc_up.to(dtype).to(tl.float32)
    if HAS_BIAS:
        bias = b_ptr + expert * stride_be + cols
        gate = (gate + tl.load(bias).to(tl.float32)).to(dtype).to(tl.float32)
        if GATED:
            up = (up + tl.load(bias + inter).to(tl.float32)).to(dtype).to(tl.float32)
    if not GATED:
        hidden_act = _activation(gate, ACT)
    elif ACT == 3:  # clamped_swiglu
        hidden_act = _clamped_swiglu(gate, up, alpha, limit)
    else:
        hidden_act = _activation(gate, ACT).to(dtype).to(tl.float32) * up
    mask = valid[:, None] & (offs_n[None, :] < inter)
    tl.store(out_ptr + pairs[:, None] * stride_ot + offs_n[None, :], hidden_act.to(dtype),
             mask=mask)  # fmt: skip


@triton.jit
def _down_kernel(h_ptr, w_ptr, b_ptr, s_ptr, z_ptr, gi_ptr, weights_ptr, out_ptr,
                 sorted_ids_ptr, expert_ids_ptr, total_ptr, num_pairs, hidden, inter, stride_ht,
                 stride_we, stride_wn, stride_wk, stride_be, stride_se, stride_sn, stride_zg,
                 stride_ge, group_size, exponent, stride_ot, HAS_BIAS: tl.constexpr,
                 FP8_W: tl.constexpr, SCALE_K: tl.constexpr, INT4_W: tl.constexpr,
                 ROW_GROUPS: tl.constexpr, ACT_ORDER: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr):  # fmt: skip
    """out[p, n] = topk_weight[p] * ((w2[e] @ h[p])[n] + bias[e, n]) in fp32, for the block's
    pairs p (HAS_BIAS; else no bias; FP8_W and INT4_W as in _gate_up_kernel)."""
    past, expert, pairs, valid = _block_rows(
        sorted_ids_ptr, expert_ids_ptr, total_ptr, num_pairs, BLOCK_M
    )
    if past:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.minimum(offs_n, hidden - 1).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    h_rows = h_ptr + pairs[:, None] * stride_ht
    w_cols = w_ptr + expert * stride_we + cols[None, :] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        ks = k0 + offs_k
        if EVEN_K:
            a = tl.load(h_rows + ks[None, :])
        else:
            a = tl.load(h_rows + ks[None, :], mask=ks[None, :] < inter, other=0.0)
        if INT4_W:
            b = int4_tile(w_ptr, z_ptr, s_ptr, gi_ptr, expert, k0, cols, inter, stride_we,
                          stride_wk, stride_se, stride_zg, stride_ge, group_size, exponent,
                          a.dtype, BLOCK_K, ROW_GROUPS, ACT_ORDER, EVEN_K)  # fmt: skip
        elif EVEN_K:
            b = tl.load(w_cols + ks[:, None] * stride_wk)
        else:
            b = tl.load(w_cols + ks[:, None] * stride_wk, mask=ks[:, None] < inter, other=0.0)
        if FP8_W:
            scales = s_ptr + expert * stride_se + (k0 // SCALE_K)
            b = _scaled(b, tl.load(scales + cols * stride_sn), a.dtype)
        if DOT_UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + expert * stride_be + cols)[None, :].to(tl.float32)
    acc *= tl.load(weights_ptr + pairs)[:, None]
    mask = valid[:, None] & (offs_n[None, :] < hidden)
    tl.store(out_ptr + pairs[:, None] * stride_ot + offs_n[None, :], acc, mask=mask)


@triton.jit
def _sum_kernel(rows_ptr, ids_ptr, out_ptr, hidden, num_experts, stride_ot, TOP_K: tl.constexpr,
                BLOCK: tl.constexpr):  # fmt: skip
    """out[t] = sum over k, in order, of the kept pairs' weighted down rows (fp32 [T * K, H])."""
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = offs < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        expert = tl.load(ids_ptr + token * TOP_K + k)
        # A dropped pair's row was never written: masked off (its width taken as 0), not
        # multiplied by 0 (NaN * 0).
        width = tl.where((expert >= 0) & (expert < num_experts), hidden, 0)
        acc += tl.load(rows_ptr + (token * TOP_K + k) * hidden + offs, mask=offs < width,
                       other=0.0)  # fmt: skip
    tl.store(out_ptr + token * stride_ot + offs, acc.to(out_ptr.dtype.element_ty), mask=in_row)


def _dims(w13: Experts, w2: Experts, gated: bool = True) -> tuple[int, int, int]:
    """(experts, hidden, intermediate) of w13, for dense and int4 experts alike."""
    halves = 2 if gated else 1
    if isinstance(w13, Int4Experts):
        return len(w13), w13.in_features, w13.out_features // halves
    return w13.shape[0], w13.shape[2], w2.shape[2]


def _check(x: torch.Tensor, w13: Experts, w2: Experts, topk_weights: torch.Tensor,
           topk_ids: torch.Tensor, gated: bool) -> None:  # fmt: skip
    """The kernels trust shapes and dtypes (a wrong one reads out of bounds): say it here."""
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"x must be fp32, fp16 or bf16, got {x.dtype}")
    if isinstance(w13, Int4Experts) or isinstance(w2, Int4Experts):
        _check_int4(x, w13, w2, gated)
    else:
        _check_dense(x, w13, w2, gated)
    _check_routing(x, topk_weights, topk_ids)


def _check_int4(x: torch.Tensor, w13: Experts, w2: Experts, gated: bool) -> None:
    if not (isinstance(w13, Int4Experts) and isinstance(w2, Int4Experts)):
        raise ValueError("fused_moe: w13 and w2 are both int4 experts, or neither")
    experts, hidden, inter = _dims(w13, w2, gated)
    halves = 2 if gated else 1
    if w13.out_features % halves or hidden != x.shape[-1] or x.dim() != 2:
        raise ValueError(
            f"x {tuple(x.shape)} and int4 w13 of [{w13.out_features}, {hidden}]: want [T, H], "
            f"[{'2I' if gated else 'I'}, H]"
        )
    check_int4(w13, "w13", experts, halves * inter, hidden)
    check_int4(w2, "w2", experts, hidden, inter)


def _check_dense(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, gated: bool) -> None:
    if any(w.dtype not in (x.dtype, torch.float8_e4m3fn) for w in (w13, w2)):
        raise ValueError(
            f"weights {w13.dtype}, {w2.dtype} for x in {x.dtype}: x's dtype or FP8 (with scales)"
        )
    halves, rows = (2, "2I") if gated else (1, "I")
    if x.dim() != 2 or w13.dim() != 3 or w13.shape[1] % halves:
        raise ValueError(
            f"x {tuple(x.shape)} and w13 {tuple(w13.shape)}: want [T, H], [E, {rows}, H]"
        )
    experts, first, hidden = w13.shape
    if hidden != x.shape[1] or w2.shape != (experts, hidden, first // halves):
        raise ValueError(
            f"x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}: want [T, H], "
            f"[E, {rows}, H], [E, H, I]"
        )


def _check_routing(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> None:
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_ids.dtype.is_floating_point:
        raise ValueError(f"topk_ids {topk_ids.dtype} {tuple(topk_ids.shape)}: want integer [T, K]")
    if topk_weights.shape != topk_ids.shape or topk_weights.dtype != torch.float32:
        raise ValueError(
            f"topk_weights {topk_weights.dtype} {tuple(topk_weights.shape)}: want float32 "
            f"{tuple(topk_ids.shape)}"
        )


def _check_biases(
    w13: Experts,
    w2: Experts,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
) -> None:
    if w13_bias is None and w2_bias is None:
        return
    if isinstance(w13, Int4Experts) or isinstance(w2, Int4Experts):
        raise ValueError("fused_moe: int4 experts take no biases")
    experts, first, _ = w13.shape
    hidden = w2.shape[1]
    for name, bias, shape in (("w13_bias", w13_bias, (experts, first)),
                              ("w2_bias", w2_bias, (experts, hidden))):  # fmt: skip
        if bias is None:
            continue
        if tuple(bias.shape) != shape or bias.stride(1) != 1 or bias.dtype != w13.dtype:
            raise ValueError(
                f"{name} {bias.dtype} {tuple(bias.shape)}: want {w13.dtype} {shape}, rows "
                "contiguous"
            )


def _check_fp8(w: Experts, fp8: Fp8Scales | None, name: str) -> None:
    if isinstance(w, Int4Experts):
        if fp8 is not None:
            raise ValueError(f"fused_moe: {name} is int4; FP8 scales are for FP8 weights")
        return
    if (w.dtype == torch.float8_e4m3fn) != (fp8 is not None):
        raise ValueError(f"fused_moe: {name} is {w.dtype}; FP8 weights come with their scales")
    if fp8 is None:
        return
    e, rows, k = w.shape
    if fp8.scales.shape != (e, rows, -(-k // fp8.block_k)) or fp8.scales.stride(-1) != 1:
        raise ValueError(
            f"fused_moe: {name} scales {tuple(fp8.scales.shape)} are not one per {fp8.block_k} "
            f"inputs of {name} {tuple(w.shape)} (contiguous along them)"
        )


def _k_tile(preferred: int, fp8: Fp8Scales | None, k: int) -> int:
    """The K tile: one that lies in one FP8 scale block (a power of two dividing the block, at
    least 16, tl.dot's minimum), unless one block spans K."""
    if fp8 is None or fp8.block_k >= k:
        return preferred
    tile = min(preferred, fp8.block_k & -fp8.block_k)
    if tile < 16:
        raise ValueError(
            f"fused_moe: FP8 scale blocks of {fp8.block_k} inputs have no K tile of 16 or more "
            "inside them"
        )
    return tile


def _tensors(w: Experts) -> tuple[torch.Tensor, ...]:
    return (w.qweight, w.scales) if isinstance(w, Int4Experts) else (w,)


def _weight_kwargs(w: Experts, fp8: Fp8Scales | None, block_k: int) -> dict[str, Any]:
    """A kernel's weight operands: a dense or FP8 tensor [E, N, K] (with its scales), or an
    int4 stack (moe_int4.py); the pointers a variant does not read are any tensor."""
    if isinstance(w, Int4Experts):
        row_groups, act_order = int4_groups(w, block_k)
        zeros, scales, g_idx, stride_se, stride_zg, stride_ge = int4_args(w)
        return dict(
            w_ptr=w.qweight, s_ptr=scales, z_ptr=zeros, gi_ptr=g_idx,
            stride_we=w.qweight.stride(0), stride_wn=1, stride_wk=w.qweight.stride(1),
            stride_se=stride_se, stride_sn=0, stride_zg=stride_zg, stride_ge=stride_ge,
            group_size=w.group_size, exponent=EXPONENT_2P23, FP8_W=False, SCALE_K=1,
            INT4_W=True, ROW_GROUPS=row_groups, ACT_ORDER=act_order,
        )  # fmt: skip
    scales = w if fp8 is None else fp8.scales
    return dict(
        w_ptr=w, s_ptr=scales, z_ptr=w, gi_ptr=w, stride_we=w.stride(0), stride_wn=w.stride(1),
        stride_wk=w.stride(2), stride_se=0 if fp8 is None else scales.stride(0),
        stride_sn=0 if fp8 is None else scales.stride(1), stride_zg=0, stride_ge=0,
        group_size=1, exponent=EXPONENT_2P23, FP8_W=fp8 is not None,
        SCALE_K=1 if fp8 is None else fp8.block_k, INT4_W=False, ROW_GROUPS=False,
        ACT_ORDER=False,
    )  # fmt: skip


def fused_moe(
    x: torch.Tensor,
    w13: Experts,
    w2: Experts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act: str,
    *,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    w13_scales: Fp8Scales | None = None,
    w2_scales: Fp8Scales | None = None,
    gated: bool = True,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """See Platform.fused_moe: x [T, H]; w13 [E, 2I, H] (gate rows first); w2 [E, H, I];
    topk_weights [T, K] float32; topk_ids [T, K] in [-1, E) (-1: skipped) -> [T, H] in x's
    dtype. gpt-oss's: w13_bias [E, 2I] and w2_bias [E, H] (each optional; under tensor
    parallelism only one rank passes w2_bias, the caller summing the ranks' outputs), and the
    clamped SwiGLU's alpha and limit. FP8 experts: w13 and w2 float8_e4m3fn with their
    `Fp8Scales` (shard.layers.quant.fp8's form, per expert). Int4 experts: w13 and w2
    `Int4Experts` stacks (shard/platforms/int4_experts.py: [2I, H] and [H, I] per expert as
    outputs by inputs). `gated` False: ungated experts (Nemotron 3's), w13 [E, I, H] the up
    projection alone and act(up) in place of act(gate) * up. `tiles`: a fixed tile config
    (tests), else default_tiles."""
    usable = UNGATED_ACTIVATIONS if not gated else [a for a in ACTIVATIONS if a != "relu2"]
    if act not in usable:
        kind = "gated" if gated else "ungated"
        raise ValueError(f"fused_moe: no {kind} activation {act!r} (have {sorted(usable)})")
    code = ACTIVATIONS[act]
    _check(x, w13, w2, topk_weights, topk_ids, gated)
    _check_biases(w13, w2, w13_bias, w2_bias)
    _check_fp8(w13, w13_scales, "w13")
    _check_fp8(w2, w2_scales, "w2")
    check_device(x, *_tensors(w13), *_tensors(w2), topk_weights, topk_ids)
    tokens, hidden = x.shape
    experts, _, inter = _dims(w13, w2, gated)
    top_k = topk_ids.shape[1]
    out = torch.empty_like(x)
    if not tokens * hidden:
        return out
    if not inter * top_k:
        return out.zero_()
    pairs = tokens * top_k
    # pair p = t * K + k: the flat row-major views, copied only where they are not one
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    cfg = tiles or default_tiles(pairs, experts, x.dtype)
    if tiles is None and isinstance(w13, Int4Experts):
        # the int4 tiles' dequantization (act-order's gathered zeros and scales above all)
        # spills registers at four warps on sm_90; eight hold it (tests/kernels/gpu_compile.py)
        cfg = replace(cfg, num_warps=INT4_WARPS)
    plan = moe_align(ids, experts, cfg.block_m)
    options = dot_options(x.dtype)
    launch = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    blocks = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
    k13, k2 = _k_tile(cfg.block_k, w13_scales, hidden), _k_tile(cfg.block_k, w2_scales, inter)

    hidden_act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(plan.max_blocks, triton.cdiv(inter, cfg.block_n))](
        x_ptr=x, b_ptr=x if w13_bias is None else w13_bias, out_ptr=hidden_act,
        sorted_ids_ptr=plan.sorted_ids, expert_ids_ptr=plan.expert_ids, total_ptr=plan.total,
        num_pairs=pairs, inter=inter, hidden=hidden, stride_xt=x.stride(0), stride_xh=x.stride(1),
        stride_be=0 if w13_bias is None else w13_bias.stride(0), stride_ot=hidden_act.stride(0),
        alpha=float(swiglu_alpha), limit=float(swiglu_limit), TOP_K=top_k, ACT=code,
        GATED=gated, HAS_BIAS=w13_bias is not None, **_weight_kwargs(w13, w13_scales, k13),
        **blocks, BLOCK_K=k13, EVEN_K=hidden % k13 == 0, **options, **launch,
    )  # fmt: skip
    rows = torch.empty(pairs, hidden, dtype=torch.float32, device=x.device)
    _down_kernel[(plan.max_blocks, triton.cdiv(hidden, cfg.block_n))](
        h_ptr=hidden_act, b_ptr=x if w2_bias is None else w2_bias, weights_ptr=weights,
        out_ptr=rows,
        sorted_ids_ptr=plan.sorted_ids, expert_ids_ptr=plan.expert_ids, total_ptr=plan.total,
        num_pairs=pairs, hidden=hidden, inter=inter, stride_ht=hidden_act.stride(0),
        stride_be=0 if w2_bias is None else w2_bias.stride(0), stride_ot=rows.stride(0),
        HAS_BIAS=w2_bias is not None, **_weight_kwargs(w2, w2_scales, k2), **blocks,
        BLOCK_K=k2, EVEN_K=inter % k2 == 0, **options, **launch,
    )  # fmt: skip
    block = min(1024, triton.next_power_of_2(hidden))
    _sum_kernel[(tokens, triton.cdiv(hidden, block))](
        rows, ids, out, hidden, experts, out.stride(0), TOP_K=top_k, BLOCK=block
    )
    return out
