"""StableLM (`StableLmForCausalLM`: StableLM 2, StableLM-3B-4E1T, StableLM Zephyr). Llama's
layer with LayerNorms that have a bias (`layer_norm_eps`), q/k/v biases where `use_qkv_bias`
says so (no o_proj bias), SwiGLU, rotary over the first `partial_rotary_factor` of each head;
with `use_parallel_residual` one norm a layer, attention and the MLP reading it in parallel
and added to the stream in that order (Cohere's); with `qk_layernorm` (StableLM 2 12B) q and k
normed per head by LayerNorms without bias whose weights are each head's own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.names import LLAMA_NAMES

STABLELM_NAMES = {
    **LLAMA_NAMES,
    "q_norm": ("model.layers.{i}.self_attn.q_layernorm",),
    "k_norm": ("model.layers.{i}.self_attn.k_layernorm",),
}


class StableLmForCausalLM(DecoderModel):
    NAMES = STABLELM_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(
            config,
            norm="layer_bias",
            rms_norm_eps=float(raw.get("layer_norm_eps", 1e-5)),
            qkv_bias=bool(raw.get("use_qkv_bias", False)),
            o_bias=False,
            mlp_bias=False,
            parallel_block=bool(raw.get("use_parallel_residual", False)),
            per_head_qk_layernorm=bool(raw.get("qk_layernorm", False)),
        )
