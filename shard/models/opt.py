"""Meta's OPT (`OPTForCausalLM`: opt-125m, the quickstart model of vLLM's docs, to opt-66b,
and the models fine-tuned from it): GPT-2's pre-norm layer under `model.decoder.`, LayerNorms
with a bias, q/k/v/o and the ReLU MLP (fc1, fc2) with biases, no rotary: a learned embedding of
each absolute position added to the token's, whose table starts two rows in (OPT's offset); the
LM head tied to the embedding. The original checkpoints name the decoder without `model.`
(`decoder.layers...`): both are read.

OPT-350m is refused by name: its layers norm after attention and the MLP
(do_layer_norm_before false) and its embeddings are projected in and out of a narrower width
(word_embed_proj_dim)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.names import without_prefix
from shard.weights import Weights

LAYER = "model.decoder.layers.{i}"
OPT_NAMES = {
    "embed_tokens": ("model.decoder.embed_tokens",),
    "embed_positions": ("model.decoder.embed_positions",),
    "norm": ("model.decoder.final_layer_norm",),
    "lm_head": ("lm_head",),
    "input_layernorm": (f"{LAYER}.self_attn_layer_norm",),
    "post_attention_layernorm": (f"{LAYER}.final_layer_norm",),
    "qkv_proj": (
        f"{LAYER}.self_attn.q_proj",
        f"{LAYER}.self_attn.k_proj",
        f"{LAYER}.self_attn.v_proj",
    ),
    "o_proj": (f"{LAYER}.self_attn.out_proj",),
    "up_proj": (f"{LAYER}.fc1",),
    "down_proj": (f"{LAYER}.fc2",),
}
# OPT's learned positions: the row of position p is p + 2
POSITION_OFFSET = 2


class OPTForCausalLM(DecoderModel):
    NAMES = OPT_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **kwargs: Any) -> ModelConfig:
        raw = {
            **raw,
            "intermediate_size": raw["ffn_dim"],
            # every head its own keys and values (OPT has no GQA; a stray field is not read)
            "num_key_value_heads": raw["num_attention_heads"],
            "hidden_act": raw.get("activation_function", "relu"),
            "tie_word_embeddings": raw.get("tie_word_embeddings", True),
        }
        return super().config_from_dict(raw, **kwargs)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("do_layer_norm_before", True) is False:
            raise UnsupportedArchitectureError(
                "OPT with do_layer_norm_before false (OPT-350m: norms after attention and the "
                "MLP) is not supported"
            )
        width = raw.get("word_embed_proj_dim")
        if width not in (None, config.hidden_size):
            raise UnsupportedArchitectureError(
                f"OPT with word_embed_proj_dim {width} != hidden_size {config.hidden_size} "
                "(embeddings projected in and out, OPT-350m's) is not supported"
            )
        if raw.get("_remove_final_layer_norm") or raw.get("layer_norm_elementwise_affine") is False:
            raise UnsupportedArchitectureError(
                "OPT without its final LayerNorm or its LayerNorms' weights "
                "(_remove_final_layer_norm, layer_norm_elementwise_affine) is not supported"
            )
        bias = bool(raw.get("enable_bias", True))
        return replace(
            config,
            norm="layer_bias",
            rms_norm_eps=1e-5,  # nn.LayerNorm's default: OPT's configs state none
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            learned_positions=True,
            learned_position_offset=POSITION_OFFSET,
            rotary_layers=(False,) * config.num_layers,
        )

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if weights.has("model.decoder.embed_tokens.weight"):
            return cls.NAMES
        return without_prefix(cls.NAMES, "model.")  # the originals: `decoder.layers...`
