"""A Mixture-of-Experts layer's experts as grouped GEMMs in torch: the step's (token, choice)
pairs sorted by expert, then for each expert that has any, one gate_up GEMM over all of its
rows, the gated activation (ungated experts, Nemotron 3's: one up GEMM and its activation), one
down GEMM; each row weighted, and each token's rows added in
ascending expert order, rounded at each add, as transformers' expert loop adds them with
index_add_ in the model's dtype (one index_add_ over all pairs would sum in fp32 and round once:
other bits from three choices a token on). The Python loop runs over the experts a step touches,
never over its tokens.

Every platform's form where it has no fused kernel (the CPU's, with its native call for the
steps it takes; the CUDA platform's Triton kernel computes the same,
shard/platforms/cuda/kernels/fused_moe.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from shard.platforms.activations import (
    CLAMPED_SWIGLU,
    GATED_ACTIVATIONS,
    MLP_ACTIVATIONS,
    SILU,
    clamped_swiglu,
)

Swiglu = Callable[[torch.Tensor], torch.Tensor | None]
# A layer's experts of one kind: a stacked tensor [E, N, K], or one linear module per expert
# (int4 experts off the Triton kernel: each expert's module computes x @ w.T itself)
Experts = torch.Tensor | Sequence[nn.Module]
Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# A platform's whole SwiGLU computation in one call (x, w13, w2, topk_weights, topk_ids: the
# arguments of grouped_experts), or None for a step it does not take.
SwigluExperts = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | None
]


def grouped_experts(
    x: torch.Tensor,
    w13: Experts,
    w2: Experts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act: str,
    swiglu: Swiglu | None = None,
    linear: Linear = torch.nn.functional.linear,
    swiglu_experts: SwigluExperts | None = None,
    *,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    gated: bool = True,
) -> torch.Tensor:
    """See Platform.fused_moe. `swiglu`: the platform's fused silu(gate) * up of a [N, 2I]
    product, or None (torch's two ops); `linear`: the platform's x @ w.T of a plain weight;
    `swiglu_experts`: the platform's whole computation below in one call, where it has one
    (plain SwiGLU experts without biases, stacked). w13 and w2 may instead be sequences of
    per-expert linear modules (int4 experts), each called on its rows."""
    tokens, k = topk_ids.shape
    if tokens == 0:
        return torch.zeros_like(x)
    plain = w13_bias is None and w2_bias is None and isinstance(w13, torch.Tensor)
    if act == SILU and gated and plain and swiglu_experts is not None:
        out = swiglu_experts(x, w13, w2, topk_weights, topk_ids)
        if out is not None:
            return out
    flat = topk_ids.reshape(-1)
    # -1 (another rank's expert) sorts first; those pairs are left out
    order = torch.argsort(flat, stable=True)
    kept = int((flat < 0).sum())
    order = order[kept:]
    counts = torch.bincount(flat[order], minlength=len(w13)).tolist()
    gathered = x.index_select(0, order // k)
    math = _ExpertMath(
        act, swiglu, linear, w13_bias, w2_bias, swiglu_alpha, swiglu_limit, gated=gated
    )
    results = _expert_loop(gathered, counts, w13, w2, math)
    # each row weighted in float32 and rounded once (the router has already rounded the
    # weights to the dtype where the model's reference weights in it)
    weights = topk_weights.reshape(-1).index_select(0, order)
    wide = results.to(torch.promote_types(results.dtype, weights.dtype))
    terms = (wide * weights[:, None]).to(x.dtype)
    return _sum_per_token(terms, order, topk_ids)


def _sum_per_token(
    terms: torch.Tensor, order: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """terms[i] is flat pair order[i]'s (pair t * K + c: token t's choice c): each token's terms
    added in ascending expert order, in the terms' dtype (a rounding per add); a choice
    another rank holds adds nothing."""
    tokens, k = topk_ids.shape
    kept = len(order)
    # Each flat pair's row in terms, the zero row appended for pairs left out: [T, K] row indices
    # read one choice at a time, never a [T, K, H] copy (a long prefill's would be the step's
    # largest transient).
    place = torch.full((tokens * k,), kept, dtype=torch.long, device=terms.device)
    place[order] = torch.arange(kept, device=terms.device)
    padded = torch.cat([terms, terms.new_zeros(1, terms.shape[-1])])
    ascending = topk_ids.argsort(dim=1, stable=True)  # -1 first, its row the zero one
    rows = place.view(tokens, k).gather(1, ascending)
    out = terms.new_zeros(tokens, terms.shape[-1])
    for choice in range(k):
        out = out + padded.index_select(0, rows[:, choice])
    return out


@dataclass(frozen=True)
class _ExpertMath:
    """How one expert's rows go through its MLP: the activation and the platform's helpers,
    the biases (gpt-oss: [E, 2I] added to the gate_up product, [E, H] to the down one), the
    clamped SwiGLU's parameters; `gated` False: the first product is the up projection alone,
    and the activation (MLP_ACTIVATIONS) applies to it."""

    act: str
    swiglu: Swiglu | None
    linear: Linear
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    alpha: float = 1.702
    limit: float = 7.0
    gated: bool = True

    def apply(self, rows: torch.Tensor, weight: torch.Tensor | nn.Module) -> torch.Tensor:
        """rows @ weight.T: a plain weight through the platform's linear, a module by itself."""
        if isinstance(weight, nn.Module):
            return weight(rows)
        return self.linear(rows, weight)

    def hidden(self, product: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return MLP_ACTIVATIONS[self.act](product)
        if self.act == SILU and self.swiglu is not None:
            fused = self.swiglu(product)
            if fused is not None:
                return fused
        gate, up = product.chunk(2, dim=-1)
        if self.act == CLAMPED_SWIGLU:
            return clamped_swiglu(gate, up, self.alpha, self.limit)
        return GATED_ACTIVATIONS[self.act](gate) * up


def _expert_loop(
    gathered: torch.Tensor,
    counts: list[int],
    w13: Experts,
    w2: Experts,
    math: _ExpertMath,
) -> torch.Tensor:
    """Each expert's rows of `gathered` (grouped by expert, `counts` each) through its MLP. A
    bias is added after its product, both rounded (transformers' `x @ w + b`)."""
    results = torch.empty_like(gathered)
    start = 0
    for expert, count in enumerate(counts):
        if not count:
            continue
        stop = start + count
        product = math.apply(gathered[start:stop], w13[expert])
        if math.w13_bias is not None:
            product = product + math.w13_bias[expert]
        out = math.apply(math.hidden(product), w2[expert])
        if math.w2_bias is not None:
            out = out + math.w2_bias[expert]
        results[start:stop] = out
        start = stop
    return results
