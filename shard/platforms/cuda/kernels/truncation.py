"""The smallest logit each row keeps under top-k, top-p and min-p, without sorting the row.

Why: top-k, top-p and min-p each keep the logits at or above a threshold, so a row's kept set is
`x >= floor` for one value per row. A GPU's sampler found it by sorting the whole vocabulary
(shard/sampling/truncation.py: full_width_group), which cost the decode step of a 1B model on an
H200 about 1.1 ms of its 2.9 ms (docs/benchmarks.md). Here one program per row searches for the
thresholds instead, over the float's bits: a float32 maps to an int32 whose order is the float's
order, and each threshold is the smallest key a monotone predicate holds at, found in passes
over the row that each test SPLIT candidate keys at once, so 2^32 keys take 8 passes a search.
The row (a few hundred KB) stays in L2 between passes.

The predicates, on tempered logits x of one row with m = max(x) and e = exp(x - m):
- top-k (HF TopK: keep x >= the k-th largest, ties kept): the k-th largest key is the smallest
  key t with count(key > t) < k;
- top-p (HF TopP after top-k: keep the tokens whose mass strictly above them is < p of the mass
  top-k kept, ties kept): the smallest key t with sum(e over kept keys > t) < p * sum(e over kept);
- min-p (HF MinP: keep e >= min_p, a ratio to the largest) in the last pass, which also takes
  the smallest kept logit.
The sums run in another order than a sorted cumulative sum, so a row whose mass lands within
float32 rounding of p may keep one token more or less than the sorted path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shard.platforms.cuda.kernels import check_device

# Candidate keys tested per pass: 16 cut the 2^32 keys to one in 8 passes.
SPLIT = 16
SEARCH_PASSES = 8
BLOCK = 1024
KEY_MIN = -(2**31)
KEY_MAX = 2**31 - 1


@triton.jit
def _keys(x):
    """int64 keys ordered as the float32 values x (-0.0 and 0.0 alike)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)  # -0.0 + 0.0 = 0.0
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def _above(row_ptr, vocab, m, floor_key, cands, MASS: tl.constexpr, BLOCK: tl.constexpr,
           SPLIT: tl.constexpr):  # fmt: skip
    """For each candidate key c: the mass (MASS: sum of exp(x - m)) or the count of the row's
    logits whose key is >= floor_key and > c."""
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([SPLIT], dtype=tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + cols
        valid = offs < vocab
        x = tl.load(row_ptr + offs, mask=valid, other=float("-inf"))
        key = _keys(x)
        counted = valid & (key >= floor_key)
        if MASS:
            w = tl.where(counted, tl.exp(x - m), 0.0)
        else:
            w = tl.where(counted, 1.0, 0.0)
        over = key[None, :] > cands[:, None]
        acc += tl.sum(tl.where(over, w[None, :], 0.0), axis=1)
    return acc


@triton.jit
def _kept_mass(row_ptr, vocab, m, floor_key, BLOCK: tl.constexpr):
    """sum of exp(x - m) over the row's logits whose key is >= floor_key (what top-k kept)."""
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + cols
        valid = offs < vocab
        x = tl.load(row_ptr + offs, mask=valid, other=float("-inf"))
        acc += tl.where(valid & (_keys(x) >= floor_key), tl.exp(x - m), 0.0)
    return tl.sum(acc, axis=0)


@triton.jit
def _search(row_ptr, vocab, m, floor_key, bound, MASS: tl.constexpr, BLOCK: tl.constexpr,
            SPLIT: tl.constexpr, PASSES: tl.constexpr):  # fmt: skip
    """The smallest key t with _above(t) < bound: the predicate is false below KEY_MIN (every
    counted logit is above) and true at KEY_MAX (none is), and monotone between."""
    lo = tl.full([], -(2**31) - 1, tl.int64)  # predicate false
    hi = tl.full([], 2**31 - 1, tl.int64)  # predicate true
    j = tl.arange(0, SPLIT).to(tl.int64)
    for _ in range(PASSES):
        step = tl.maximum((hi - lo + SPLIT - 1) // SPLIT, 1)
        cands = tl.minimum(lo + (j + 1) * step, hi)
        holds = _above(row_ptr, vocab, m, floor_key, cands, MASS, BLOCK, SPLIT) < bound
        hi = tl.min(tl.where(holds, cands, hi), axis=0)
        lo = tl.max(tl.where(holds, lo, cands), axis=0)
    return hi


@triton.jit
def _floor_kernel(
    x_ptr,
    stride,
    vocab,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    out_ptr,
    BLOCK: tl.constexpr,
    SPLIT: tl.constexpr,
    PASSES: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = x_ptr + row.to(tl.int64) * stride
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    cols = tl.arange(0, BLOCK)

    m = tl.full([], float("-inf"), tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + cols
        x = tl.load(row_ptr + offs, mask=offs < vocab, other=float("-inf"))
        m = tl.maximum(m, tl.max(x, axis=0))

    floor_key = tl.full([], -(2**31), tl.int64)  # every key
    if (top_k > 0) & (top_k < vocab):
        floor_key = _search(row_ptr, vocab, m, floor_key, top_k.to(tl.float32), False, BLOCK,
                            SPLIT, PASSES)  # fmt: skip
    if top_p < 1.0:
        kept = _kept_mass(row_ptr, vocab, m, floor_key, BLOCK)
        p_key = _search(row_ptr, vocab, m, floor_key, top_p * kept, True, BLOCK, SPLIT, PASSES)
        floor_key = tl.maximum(floor_key, p_key)

    smallest = tl.full([BLOCK], float("inf"), tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + cols
        valid = offs < vocab
        x = tl.load(row_ptr + offs, mask=valid, other=float("inf"))
        keep = valid & (_keys(x) >= floor_key) & (tl.exp(x - m) >= min_p)
        smallest = tl.minimum(smallest, tl.where(keep, x, float("inf")))
    tl.store(out_ptr + row, tl.min(smallest, axis=0))


def truncation_floor(
    x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Each row's smallest kept logit [R] of tempered float32 logits x [R, V] (unit stride rows)
    under top_k [R] int64 (0: off), top_p [R] (1: off) and min_p [R] (0: off) float32: the row
    keeps x >= floor; with every warper off, the floor is the row's minimum."""
    rows, vocab = x.shape
    assert x.dtype == torch.float32 and x.stride(1) == 1, "float32 rows of unit stride"
    check_device(x, top_k, top_p, min_p)
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        _floor_kernel[(rows,)](
            x, x.stride(0), vocab,
            top_k.to(torch.int64).contiguous(), top_p.float().contiguous(),
            min_p.float().contiguous(), out,
            BLOCK=min(BLOCK, triton.next_power_of_2(vocab)), SPLIT=SPLIT, PASSES=SEARCH_PASSES,
            num_warps=8,
        )  # fmt: skip
    return out
