"""StarCoder2 (`Starcoder2ForCausalLM`): Llama's layer with LayerNorms that have a bias
(`norm_epsilon`), a bias on q/k/v/o and on both MLP projections (`use_bias`), an ungated MLP
c_fc -> gelu-tanh -> c_proj, a sliding window in every layer, tied embeddings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.names import LLAMA_NAMES

STARCODER2_NAMES = {
    **LLAMA_NAMES,
    "up_proj": ("model.layers.{i}.mlp.c_fc",),
    "down_proj": ("model.layers.{i}.mlp.c_proj",),
}


class Starcoder2ForCausalLM(DecoderModel):
    NAMES = STARCODER2_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        bias = bool(raw.get("use_bias", True))
        return replace(
            config,
            norm="layer_bias",
            rms_norm_eps=float(raw.get("norm_epsilon", 1e-5)),
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
        )
