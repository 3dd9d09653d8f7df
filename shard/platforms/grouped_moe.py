"""A Mixture-of-Experts layer's experts as grouped GEMMs in torch: the step's (token, choice)
pairs sorted by expert, then for each expert that has any, one gate_up GEMM over all of its
rows, the gated activation, one down GEMM; the rows weighted and summed back per token in one
index_add. The Python loop runs over the experts a step touches, never over its tokens.

Every platform's form where it has no fused kernel (the CPU's; the CUDA platform's Triton
kernel computes the same, shard/platforms/cuda/kernels/fused_moe.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from shard.platforms.activations import GATED_ACTIVATIONS, SILU

Swiglu = Callable[[torch.Tensor], torch.Tensor | None]
Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# A platform's whole SwiGLU expert loop in one call (x grouped by expert, rows per expert, w13,
# w2), or None where it does not apply.
SwigluExperts = Callable[[torch.Tensor, list[int], torch.Tensor, torch.Tensor], torch.Tensor | None]


def grouped_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act: str,
    swiglu: Swiglu | None = None,
    linear: Linear = torch.nn.functional.linear,
    swiglu_experts: SwigluExperts | None = None,
) -> torch.Tensor:
    """See Platform.fused_moe. `swiglu`: the platform's fused silu(gate) * up of a [N, 2I]
    product, or None (torch's two ops); `linear`: the platform's x @ w.T of a plain weight;
    `swiglu_experts`: the platform's loop below in one call, where it has one."""
    tokens, k = topk_ids.shape
    out = torch.zeros_like(x)
    if tokens == 0:
        return out
    flat = topk_ids.reshape(-1)
    # -1 (another rank's expert) sorts first; those pairs are left out
    order = torch.argsort(flat, stable=True)
    kept = int((flat < 0).sum())
    order = order[kept:]
    counts = torch.bincount(flat[order], minlength=w13.shape[0]).tolist()
    rows = order // k
    gathered = x.index_select(0, rows)
    results = None
    if act == SILU and swiglu_experts is not None:
        results = swiglu_experts(gathered, counts, w13, w2)
    if results is None:
        results = _expert_loop(gathered, counts, w13, w2, act, swiglu, linear)
    # each row weighted in float32 and rounded once (the router has already rounded the
    # weights to the dtype where the model's reference weights in it), then summed per token
    weights = topk_weights.reshape(-1).index_select(0, order)
    wide = results.to(torch.promote_types(results.dtype, weights.dtype))
    out.index_add_(0, rows, (wide * weights[:, None]).to(x.dtype))
    return out


def _expert_loop(
    gathered: torch.Tensor,
    counts: list[int],
    w13: torch.Tensor,
    w2: torch.Tensor,
    act: str,
    swiglu: Swiglu | None,
    linear: Linear,
) -> torch.Tensor:
    """Each expert's rows of `gathered` (grouped by expert, `counts` each) through its MLP."""
    results = torch.empty_like(gathered)
    start = 0
    for expert, count in enumerate(counts):
        if not count:
            continue
        stop = start + count
        product = linear(gathered[start:stop], w13[expert])
        hidden = _act_and_mul(product, act, swiglu)
        results[start:stop] = linear(hidden, w2[expert])
        start = stop
    return results


def _act_and_mul(product: torch.Tensor, act: str, swiglu: Swiglu | None) -> torch.Tensor:
    if act == SILU and swiglu is not None:
        fused = swiglu(product)
        if fused is not None:
            return fused
    gate, up = product.chunk(2, dim=-1)
    return GATED_ACTIVATIONS[act](gate) * up
