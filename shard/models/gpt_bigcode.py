"""GPTBigCode (`GPTBigCodeForCausalLM`: StarCoder, StarCoderBase, SantaCoder, WizardCoder-15B,
OctoCoder, StarChat). GPT-2's layer under `transformer.`: LayerNorms with a bias, q/k/v fused in
one `c_attn` (multi-query: every q row, then the one KV head's k and v; without multi_query
each head's q, k and v in turn), the `c_proj` output projection, an ungated MLP c_fc -> gelu-tanh
-> c_proj, biases everywhere, no rotary: a learned embedding of each absolute position (`wpe`)
added to the token's. The LM head is tied to `wte`. config.json keeps GPT-2's field names
(n_embd, n_head, n_layer, n_positions, n_inner), which transformers maps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError

LAYER = "transformer.h.{i}"
GPT_BIGCODE_NAMES = {
    "embed_tokens": ("transformer.wte",),
    "embed_positions": ("transformer.wpe",),
    "norm": ("transformer.ln_f",),
    "lm_head": ("lm_head",),
    "input_layernorm": (f"{LAYER}.ln_1",),
    "post_attention_layernorm": (f"{LAYER}.ln_2",),
    "qkv_proj": (f"{LAYER}.attn.c_attn",),
    "o_proj": (f"{LAYER}.attn.c_proj",),
    "up_proj": (f"{LAYER}.mlp.c_fc",),
    "down_proj": (f"{LAYER}.mlp.c_proj",),
}
# GPT-2's config names -> the ones ModelConfig reads (transformers' attribute_map)
_GPT2_FIELDS = {
    "n_embd": "hidden_size",
    "n_head": "num_attention_heads",
    "n_layer": "num_hidden_layers",
    "n_positions": "max_position_embeddings",
    "activation_function": "hidden_act",
}


class GPTBigCodeForCausalLM(DecoderModel):
    NAMES = GPT_BIGCODE_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **kwargs: Any) -> ModelConfig:
        raw = {**raw, **{ours: raw[gpt2] for gpt2, ours in _GPT2_FIELDS.items() if gpt2 in raw}}
        # n_inner None: four times the width, as transformers builds the MLP
        raw["intermediate_size"] = raw.get("n_inner") or 4 * raw["hidden_size"]
        raw["tie_word_embeddings"] = raw.get("tie_word_embeddings", True)
        return super().config_from_dict(raw, **kwargs)

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("scale_attn_weights") is False:
            raise UnsupportedArchitectureError(
                "GPTBigCode with scale_attn_weights false (scores not divided by sqrt(head_dim)) "
                "is not supported"
            )
        if raw.get("add_cross_attention"):
            raise UnsupportedArchitectureError(
                "GPTBigCode with add_cross_attention (an encoder-decoder) is not supported"
            )
        multi_query = bool(raw.get("multi_query", True))
        return replace(
            config,
            num_kv_heads=1 if multi_query else config.num_heads,
            norm="layer_bias",
            rms_norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            qkv_by_head=not multi_query,
            learned_positions=True,
            rotary_layers=(False,) * config.num_layers,
        )
