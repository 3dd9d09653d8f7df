"""Bamba (BambaForCausalLM: IBM's Bamba-9B, Granite 4.0-H's predecessor): Mamba 2 layers
(shard/models/mamba_mixer.py) with softmax attention in the layers `attn_layer_indices` lists,
half of each head rotated (transformers fixes partial_rotary_factor at 0.5), and Llama's SwiGLU
`feed_forward` after every mixer; the norms are Llama's under other names."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.mamba_mixer import ATTENTION_LAYER, MAMBA_LAYER, MAMBA_NAMES, mamba_config
from shard.models.names import LLAMA_NAMES

BAMBA_NAMES = {
    **LLAMA_NAMES,
    **MAMBA_NAMES,
    "norm": ("model.final_layernorm",),
    "post_attention_layernorm": ("model.layers.{i}.pre_ff_layernorm",),
    "gate_up_proj": (
        "model.layers.{i}.feed_forward.gate_proj",
        "model.layers.{i}.feed_forward.up_proj",
    ),
    "down_proj": ("model.layers.{i}.feed_forward.down_proj",),
}


class BambaForCausalLM(DecoderModel):
    NAMES = BAMBA_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        attention = set(raw.get("attn_layer_indices") or ())
        kinds = [
            ATTENTION_LAYER if layer in attention else MAMBA_LAYER
            for layer in range(config.num_layers)
        ]
        return replace(config, mamba=mamba_config(raw, kinds, config))
