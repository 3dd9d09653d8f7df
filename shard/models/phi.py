"""Phi (`PhiForCausalLM`: phi-1, phi-1.5, phi-2). One LayerNorm (with a bias) a layer, whose
output attention and the MLP read in parallel, their outputs summed and then added to the
stream; q/k/v and the `dense` output projection with biases; rotary over the first
`partial_rotary_factor` of each head; an ungated MLP fc1 -> gelu_new -> fc2 with biases; the
final norm `final_layernorm`; an LM head with a bias. `qk_layernorm`: a LayerNorm (with a bias)
over head_dim, one for every query head and one for every key head."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError

PHI_NAMES = {
    "embed_tokens": ("model.embed_tokens",),
    "norm": ("model.final_layernorm",),
    "lm_head": ("lm_head",),
    "input_layernorm": ("model.layers.{i}.input_layernorm",),
    "qkv_proj": (
        "model.layers.{i}.self_attn.q_proj",
        "model.layers.{i}.self_attn.k_proj",
        "model.layers.{i}.self_attn.v_proj",
    ),
    "o_proj": ("model.layers.{i}.self_attn.dense",),
    "q_norm": ("model.layers.{i}.self_attn.q_layernorm",),
    "k_norm": ("model.layers.{i}.self_attn.k_layernorm",),
    "up_proj": ("model.layers.{i}.mlp.fc1",),
    "down_proj": ("model.layers.{i}.mlp.fc2",),
}


class PhiForCausalLM(DecoderModel):
    NAMES = PHI_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        qk_norm = bool(raw.get("qk_layernorm"))
        if qk_norm and config.head_dim != config.hidden_size // config.num_heads:
            # transformers sizes the q/k LayerNorms hidden_size / heads wide
            raise UnsupportedArchitectureError(
                f"qk_layernorm with head_dim {config.head_dim} other than hidden_size / "
                f"num_attention_heads is not supported"
            )
        return replace(
            config,
            norm="layer_bias",
            rms_norm_eps=float(raw.get("layer_norm_eps", 1e-5)),
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            qk_norm=qk_norm,
            parallel_block=True,
            parallel_outputs_summed=True,
            lm_head_bias=True,
        )
