"""MPT (`MptForCausalLM`: MPT-7B, MPT-30B and their instruct and chat tunes) as transformers runs
it. Under `transformer.`: q/k/v fused in `Wqkv` as [q | k | v], the `out_proj` output
projection, no biases, LayerNorms without a bias (norm_1, norm_2, norm_f), an ungated gelu MLP
up_proj -> down_proj four times the width, the head tied to `wte`. No rotary: every head adds
its ALiBi slope times (key position - query position) to its scores (MPT's slopes at
alibi_bias_max 8: transformers builds them so whatever `attn_config.alibi_bias_max` says, and
every release says 8); `attn_config.clip_qkv` clamps the q/k/v product and `softmax_scale`
replaces head_dim ** -0.5. What transformers' MPT does not run is refused by name: learned
positions instead of ALiBi, q/k LayerNorms, a prefix LM, multi-query attention, another
alibi_bias_max, biases, a logit scale, another MLP width."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from shard.layers.alibi import mpt_slopes
from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError

LAYER = "transformer.blocks.{i}"
MPT_NAMES = {
    "embed_tokens": ("transformer.wte",),
    "norm": ("transformer.norm_f",),
    "lm_head": ("lm_head",),
    "input_layernorm": (f"{LAYER}.norm_1",),
    "post_attention_layernorm": (f"{LAYER}.norm_2",),
    "qkv_proj": (f"{LAYER}.attn.Wqkv",),
    "o_proj": (f"{LAYER}.attn.out_proj",),
    "up_proj": (f"{LAYER}.ffn.up_proj",),
    "down_proj": (f"{LAYER}.ffn.down_proj",),
}

# attn_config fields -> (the value transformers' MPT runs, what else would mean)
_ATTENTION_REFUSALS = {
    "alibi": (True, "learned positions instead of ALiBi"),
    "qk_ln": (False, "LayerNorms on q and k"),
    "prefix_lm": (False, "a prefix LM's bidirectional prefix"),
    "attn_type": ("multihead_attention", "multi-query or grouped attention"),
    # (MosaicML's own code reads it; transformers' MptModel builds its slopes at 8 regardless,
    # so no reference runs another value)
    "alibi_bias_max": (8, "other ALiBi slopes than transformers builds"),
}


class MptForCausalLM(DecoderModel):
    NAMES = MPT_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **kwargs: Any) -> ModelConfig:
        heads, hidden = raw["n_heads"], raw["d_model"]
        raw = {
            **raw,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,  # (no GQA; a stray field is ignored)
            "num_hidden_layers": raw["n_layers"],
            "intermediate_size": 4 * hidden,  # transformers' MptMLP: 4 x d_model
            "max_position_embeddings": raw.get("max_seq_len", 2048),
            "hidden_act": "gelu",
            "tie_word_embeddings": raw.get("tie_word_embeddings", True),
        }
        return super().config_from_dict(raw, **kwargs)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        attn = raw.get("attn_config") or {}
        for field, (served, meaning) in _ATTENTION_REFUSALS.items():
            if attn.get(field, served) != served:
                raise UnsupportedArchitectureError(
                    f"MPT with attn_config.{field} = {attn[field]!r} ({meaning}) is not supported"
                )
        if raw.get("no_bias", True) is not True:
            raise UnsupportedArchitectureError("MPT with no_bias false (biases) is not supported")
        if raw.get("logit_scale") is not None:
            raise UnsupportedArchitectureError("MPT with a logit_scale is not supported")
        if raw.get("expansion_ratio", 4) != 4:
            raise UnsupportedArchitectureError(
                f"MPT with expansion_ratio {raw['expansion_ratio']} (transformers builds 4) is "
                "not supported"
            )
        clip = attn.get("clip_qkv")
        return replace(
            config,
            norm="layer",
            rms_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
            qkv_bias=False,
            o_bias=False,
            mlp_bias=False,
            attention_scale=attn.get("softmax_scale") or None,
            clip_qkv=float(clip) if clip else None,
            rotary_layers=(False,) * config.num_layers,
            alibi_slopes=mpt_slopes(config.num_heads),
        )
