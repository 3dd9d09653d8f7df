"""ALiBi (BLOOM, MPT) in the Triton prefill and decode kernels and the Triton backend, against a
float64 reference written out here: the scaled (and capped) scores plus slope[h] * (key
position - query position), the causal / window mask, the softmax. The paged cases are
test_attention_sinks.py's (sequences in a NaN-filled cache through shuffled block tables)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, TOLERANCES
from test_attention_sinks import HEAD_DIM, HEADS, Case, decode, prefill

from shard.platforms.cuda.attention import TritonAttentionBackend

# One slope per query head, different within each KV head's group (a kernel reading
# alibi[h // group] fails), large enough that 20-40 positions back weigh far less.
SLOPES = torch.tensor([0.5, 0.0625, 0.25, 0.125])


def reference(q, k, v, q_pos, scale, window=None, softcap=None, alibi=None):
    """One sequence in float64: q [Lq, H, D] at positions q_pos over k, v [Lk, Hkv, D] at
    positions 0 .. Lk - 1 -> [Lq, H, D]."""
    group = q.shape[1] // k.shape[1]
    q, k, v = (
        q.double(),
        k.double().repeat_interleave(group, 1),
        v.double().repeat_interleave(group, 1),
    )
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    k_pos = torch.arange(k.shape[0])
    if alibi is not None:
        distance = (k_pos[None, :] - q_pos[:, None]).double()
        scores = scores + alibi.double()[:, None, None] * distance
    seen = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        seen &= k_pos[None, :] > q_pos[:, None] - window
    probs = scores.masked_fill(~seen, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def expected(case: Case, scale: float, **options) -> torch.Tensor:
    parts, start = [], 0
    for i, (p, n) in enumerate(zip(case.prefixes, case.totals, strict=True)):
        q = case.q[start : start + n - p].cpu()
        keys, values = case.keys[i].cpu(), case.values[i].cpu()
        parts.append(reference(q, keys, values, torch.arange(p, n), scale, **options))
        start += n - p
    return torch.cat(parts)


def check(out: torch.Tensor, case: Case, scale: float, **options) -> None:
    """out against the reference with the slopes, and the slopes moved the reference by far
    more than the tolerance (so a kernel dropping them fails)."""
    tol = TOLERANCES[out.dtype]
    want = expected(case, scale, alibi=SLOPES, **options)
    torch.testing.assert_close(out.double().cpu(), want, **tol)
    assert (want - expected(case, scale, **options)).abs().max() > 10 * tol["atol"]


@pytest.mark.parametrize(
    ("dtype", "prefix", "window", "softcap"),
    [(torch.float32, False, None, None), (torch.float32, True, None, None),
     (torch.bfloat16, True, 9, None), (torch.float32, True, None, 3.0)],
)  # fmt: skip
def test_prefill(dtype, prefix, window, softcap):
    """Uneven sequences off the 16-token tiles (unmasked, diagonal and cached tiles all
    biased); with a prefix, one sequence has none, one's ends mid-block, one's spans blocks."""
    case = Case([0, 7, 20] if prefix else [0, 0, 0], [5, 37, 18], dtype, seed=11)
    scale = 1.0 if softcap else HEAD_DIM**-0.5
    out = prefill(
        case, scale, prefix=prefix, window=window, softcap=softcap, alibi=SLOPES.to(DEVICE)
    )
    check(out, case, scale, window=window, softcap=softcap)


@pytest.mark.parametrize(
    ("dtype", "window", "num_splits", "split_per_sequence"),
    [(torch.float32, None, 1, False), (torch.float16, 7, 1, False),
     (torch.float32, None, 3, True), (torch.bfloat16, None, 3, False)],
)  # fmt: skip
def test_decode(dtype, window, num_splits, split_per_sequence):
    """Contexts from 1 token to several tiles; split, each part's log-sum-exp is of the biased
    scores."""
    case = Case([0, 4, 16, 39], [1] * 4, dtype, seed=12)
    scale = HEAD_DIM**-0.5
    out = decode(
        case, scale, window=window, alibi=SLOPES.to(DEVICE), num_splits=num_splits,
        split_per_sequence=split_per_sequence,
    )  # fmt: skip
    check(out, case, scale, window=window)


def test_backend_passes_alibi_through():
    backend, scale = TritonAttentionBackend(), HEAD_DIM**-0.5
    alibi = SLOPES.to(DEVICE)
    case = Case([0, 18], [23, 12], torch.float32, seed=13)
    meta = case.batch.prefill_meta(case.prefixes, case.totals)
    k, v = case.packed_new(case.keys), case.packed_new(case.values)
    check(backend.prefill(case.q, k, v, case.cache, meta, scale, alibi=alibi), case, scale)
    case = Case([0, 9, 33], [1] * 3, torch.float32, seed=14)
    meta = case.batch.decode_meta(case.totals)
    check(backend.decode(case.q, case.cache, meta, scale, alibi=alibi), case, scale)


def test_refuses_slopes_the_kernels_would_misread():
    case = Case([0], [1], torch.float32, seed=15)
    per_kv_head = SLOPES[:2].to(DEVICE)
    with pytest.raises(ValueError, match="one contiguous float32 slope per query head"):
        decode(case, 1.0, alibi=per_kv_head)
    with pytest.raises(ValueError, match="one contiguous float32 slope per query head"):
        prefill(case, 1.0, prefix=False, alibi=SLOPES.double().to(DEVICE))
    assert HEADS == SLOPES.numel()
