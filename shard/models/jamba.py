"""AI21's Jamba (JambaForCausalLM: Jamba v0.1, Jamba 1.5/1.6/1.7 Mini and Large): Llama's
two-norm layers whose mixer is a Mamba 1 mixer (shard/models/mamba1_mixer.py, with weighted RMS
norms on its time step, B and C) except every `attn_layer_period`-th layer from
`attn_layer_offset`, which attends without any position encoding; every
`expert_layer_period`-th MLP from `expert_layer_offset` is a Mixture-of-Experts block
(softmax over all logits, the top k taken as they are, not renormalised, rounded to the dtype:
shard/models/moe_block.py), the others SwiGLU. The Hub's files hold a module per expert;
transformers 5 holds (and can save) them stacked."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, MoeConfig
from shard.models.mamba1_mixer import WEIGHTED_NORM, mamba1_config, mamba1_names
from shard.models.names import LLAMA_NAMES, in_some_layer
from shard.models.qwen2_moe import experts_per_token
from shard.weights import Weights

_FFN = "model.layers.{i}.feed_forward"
JAMBA_NAMES = {
    **LLAMA_NAMES,
    **mamba1_names("model.layers.{i}.mamba"),
    "norm": ("model.final_layernorm",),
    "post_attention_layernorm": ("model.layers.{i}.pre_ff_layernorm",),
    "gate_up_proj": (f"{_FFN}.gate_proj", f"{_FFN}.up_proj"),
    "down_proj": (f"{_FFN}.down_proj",),
    "router": (f"{_FFN}.router",),
    "expert_gate_up": (f"{_FFN}.experts.{{{{e}}}}.gate_proj", f"{_FFN}.experts.{{{{e}}}}.up_proj"),
    "expert_down": (f"{_FFN}.experts.{{{{e}}}}.down_proj",),
}
# the experts as transformers 5 holds them: gate_up [E, 2I, H], down [E, H, I]
_STACKED_EXPERTS = {
    "expert_gate_up": (f"{_FFN}.experts.gate_up_proj",),
    "expert_down": (f"{_FFN}.experts.down_proj",),
}


def _every(period: int, offset: int, layers: int) -> tuple[bool, ...]:
    """Whether each layer is the `offset`-th of its `period` (Jamba's layer pattern)."""
    return tuple(layer % period == offset for layer in range(layers))


class JambaForCausalLM(DecoderModel):
    NAMES = JAMBA_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        layers = config.num_layers
        attention = _every(raw.get("attn_layer_period", 8), raw.get("attn_layer_offset", 4), layers)
        sparse = _every(
            raw.get("expert_layer_period", 2), raw.get("expert_layer_offset", 1), layers
        )
        experts = int(raw.get("num_experts") or 1)
        moe = None
        if experts > 1 and any(sparse):
            moe = MoeConfig(
                num_experts=experts,
                top_k=experts_per_token(raw, experts),
                intermediate_size=config.intermediate_size,
                renormalize=False,
                round_weights=True,  # transformers' router hands them on in the dtype
                sparse_layers=sparse,
            )
        mamba1 = mamba1_config(
            [not a for a in attention],
            intermediate_size=raw.get("mamba_expand", 2) * config.hidden_size,
            state_size=raw.get("mamba_d_state", 16),
            dt_rank=raw.get("mamba_dt_rank", "auto"),
            hidden_size=config.hidden_size,
            conv_kernel=raw.get("mamba_d_conv", 4),
            conv_bias=raw.get("mamba_conv_bias", True),
            proj_bias=raw.get("mamba_proj_bias", False),
            conv_act=raw.get("hidden_act", "silu"),
            bcdt_norm=WEIGHTED_NORM,
            norm_eps=config.rms_norm_eps,
        )
        return replace(
            config,
            mamba1=mamba1,
            # Jamba's attention has no position encoding at all; no biases
            rotary_layers=(False,) * layers,
            qkv_bias=False,
            o_bias=False,
            moe=moe,
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if in_some_layer(weights.has, f"{_STACKED_EXPERTS['expert_down'][0]}"):
            return {**cls.NAMES, **_STACKED_EXPERTS}
        return cls.NAMES
