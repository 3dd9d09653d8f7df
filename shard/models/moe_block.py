"""The Mixture-of-Experts MLP block: a router (gpt-oss's with a bias; GLM-4.5's and
DeepSeek-V3's sigmoid scores chosen by group with a correction bias; DeepSeek-V2's softmax,
chosen by group and scaled; ERNIE 4.5's softmax chosen with a correction bias) picks each
token's top-k experts, the experts run as one fused layer (shard/layers/moe.py), and an
optional shared expert every token takes (Qwen2-MoE: a gated MLP scaled by
sigmoid(shared_expert_gate(x)); GLM-4.5, DeepSeek, ERNIE 4.5: added as it is; Nemotron 3: an
ungated MLP beside ungated experts) is added; the rank's partial outputs of both are all-reduced
once, as a dense MLP's row-parallel down projection is. Nemotron 3 Super's experts run in a
latent space: the token projected into it first, their weighted sum projected back (both
projections replicated: linear, so the back projection of a rank's partial sum is its part of
the whole).

The router's weight is small ([E, H]) and every rank needs all of its logits: replicated."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shard.distributed import Distributed
from shard.layers.moe import (
    FusedMoE,
    route,
    route_grouped_sigmoid,
    route_sparsemixer,
    route_top_sigmoid,
)
from shard.models.config import ModelConfig, MoeConfig
from shard.models.mlp import GatedMLP, UngatedMLP
from shard.models.names import Names
from shard.weights import Weights, WeightsError


class SparseMoeBlock(nn.Module):
    def __init__(
        self,
        router: torch.Tensor,
        experts: FusedMoE,
        moe: MoeConfig,
        dist: Distributed,
        shared_expert: GatedMLP | UngatedMLP | None = None,
        shared_expert_gate: torch.Tensor | None = None,
        router_bias: torch.Tensor | None = None,
        correction_bias: torch.Tensor | None = None,
        latent: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.router = nn.Parameter(router, requires_grad=False)
        self.register_buffer("router_bias", router_bias, persistent=False)
        self.register_buffer("correction_bias", correction_bias, persistent=False)
        self.experts = experts
        self.moe = moe
        self.top_k = moe.top_k
        self.renormalize = moe.renormalize
        self.round_weights = moe.round_weights
        self.dist = dist
        self.shared_expert = shared_expert
        self.shared_expert_gate = None
        if shared_expert_gate is not None:
            self.shared_expert_gate = nn.Parameter(shared_expert_gate, requires_grad=False)
        # Nemotron 3 Super's projections into the experts' latent space and back ([L, H], [H, L])
        self.latent_in = self.latent_out = None
        if latent is not None:
            self.latent_in = nn.Parameter(latent[0], requires_grad=False)
            self.latent_out = nn.Parameter(latent[1], requires_grad=False)

    @classmethod
    def load(cls, weights: Weights, names: Names, config: ModelConfig) -> SparseMoeBlock:
        moe = config.moe
        assert moe is not None
        experts = FusedMoE.load(
            weights,
            names.many("expert_gate_up"),
            names.one("expert_down"),
            num_experts=moe.num_experts,
            intermediate_size=moe.intermediate_size,
            act=moe.expert_act or config.hidden_act,
            expert_parallel=weights.expert_parallel,
            interleaved=moe.interleaved_experts,
            swiglu=moe.swiglu,
            transposed=moe.transposed_experts,
            gated=moe.gated_experts,
        )
        shared: GatedMLP | UngatedMLP | None = None
        shared_gate = None
        if moe.shared_expert_intermediate_size:
            mlp = GatedMLP if config.gated_mlp else UngatedMLP
            shared = mlp.load(weights, names, config, prefix="shared_expert_")
            if moe.shared_expert_gated:
                shared_gate = replicated_linear(weights, names.one("shared_expert_gate"))
        # GLM-4.5's and DeepSeek's routers are kept in float32, read from the stored values
        # (transformers' too)
        router = replicated_linear(weights, names.one("router"), stored_dtype=moe.float32_router)
        if moe.float32_router:
            router = router.float()
        if router.shape[0] != moe.num_experts:
            raise WeightsError(
                f"{names.one('router')}: {router.shape[0]} router rows for "
                f"{moe.num_experts} experts"
            )
        bias = weights.get_tensor(f"{names.one('router')}.bias") if moe.router_bias else None
        correction = None
        if moe.correction_bias:
            name = names.one("router_correction_bias")
            if weights.has(name):  # ERNIE 4.5 stores it [1, E]
                correction = weights.get_tensor(name, stored_dtype=True).float().reshape(-1)
        latent = None
        if moe.latent_size:
            latent = (
                replicated_linear(weights, names.one("latent_in")),
                replicated_linear(weights, names.one("latent_out")),
            )
        return cls(
            router, experts, moe, weights.dist, shared, shared_gate, bias, correction, latent
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = self._route(x)
        if self.moe.weights_on_input:
            out = self._experts_on_weighted_inputs(x, topk_weights, topk_ids)
        elif self.latent_in is not None and self.latent_out is not None:
            out = self.experts(F.linear(x, self.latent_in), topk_weights, topk_ids)
            out = F.linear(out, self.latent_out)
        else:
            out = self.experts(x, topk_weights, topk_ids)
        if self.shared_expert is not None:
            shared = self.shared_expert.partial(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(F.linear(x, self.shared_expert_gate)) * shared
            out = out + shared
            if self.moe.shared_expert_averaged:  # (linear: each rank halves its partial sum)
                out = out / 2
        return self.dist.all_reduce(out)

    def _experts_on_weighted_inputs(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """sum_k expert_{ids[t, k]}(w[t, k] x[t]) (Llama 4; MoeConfig.weights_on_input): each
        (token, choice) pair is one row of the fused experts, its input weighted in the model's
        dtype as transformers weights it, its output taken with weight 1."""
        tokens, k = topk_ids.shape
        weighted = (x[:, None, :] * topk_weights.to(x.dtype)[:, :, None]).reshape(tokens * k, -1)
        ones = torch.ones(tokens * k, 1, dtype=torch.float32, device=x.device)
        out = self.experts(weighted, ones, topk_ids.reshape(tokens * k, 1))
        return out if k == 1 else out.view(tokens, k, -1).sum(dim=1)

    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        moe = self.moe
        # GLM-4.5's, DeepSeek's and ERNIE's logits in float32; the others' (MiniMax-M2's sigmoid
        # scores too) in the model's dtype
        if moe.float32_router:
            logits = F.linear(x.float(), self.router, self.router_bias)
        else:
            logits = F.linear(x, self.router, self.router_bias)
        if moe.router_softcap:  # Laguna's, in float32 as transformers caps them
            logits = torch.tanh(logits.float() / moe.router_softcap) * moe.router_softcap
        if moe.scoring == "sparsemixer":
            return route_sparsemixer(logits, moe.jitter_eps)
        if moe.scoring == "top_sigmoid":
            return route_top_sigmoid(
                logits,
                self.top_k,
                round_to=x.dtype if self.round_weights else None,
                renormalize=self.renormalize,
            )
        if moe.scoring == "sigmoid":
            return route_grouped_sigmoid(
                logits,
                self.top_k,
                correction_bias=self.correction_bias,
                num_groups=moe.num_groups,
                top_groups=moe.top_groups,
                renormalize=self.renormalize,
                scale=moe.routed_scaling,
                renormalize_eps=moe.renormalize_eps,
                bias_on_logits=moe.correction_on_logits,
            )
        round_to = x.dtype if self.round_weights else None
        return route(
            logits,
            self.top_k,
            renormalize=self.renormalize,
            round_to=round_to,
            num_groups=moe.num_groups,
            top_groups=moe.top_groups,
            scale=moe.routed_scaling,
            correction_bias=self.correction_bias,
            renormalize_min=moe.renormalize_min,
            group_score=moe.group_score,
        )


def replicated_linear(weights: Weights, prefix: str, *, stored_dtype: bool = False) -> torch.Tensor:
    """A small linear every rank holds whole (the router, the shared expert's gate); a
    quantized one is refused, naming the format and the module."""
    name = f"{prefix}.weight"
    if not weights.has(name) and weights.has_module(prefix) and weights.quantization is not None:
        raise WeightsError(
            f"{weights.quantization.method} int4 {prefix} is not supported: a Mixture-of-Experts "
            "router is served in floating point"
        )
    return weights.get_tensor(name, stored_dtype=stored_dtype)
