"""OLMo (`OlmoForCausalLM`: OLMo-1B-hf, OLMo-7B-hf): Llama's layer with LayerNorms that have
neither weight nor bias (float32, eps 1e-5), SwiGLU, and q, k and v clamped to
[-clip_qkv, clip_qkv] after their projection where `clip_qkv` is set."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.names import LLAMA_NAMES


class OlmoForCausalLM(DecoderModel):
    NAMES = LLAMA_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        clip = raw.get("clip_qkv")
        if clip is not None and not float(clip) > 0:
            raise UnsupportedArchitectureError(f"clip_qkv must be positive, got {clip}")
        # transformers' OlmoLayerNorm fixes its eps at 1e-5 whatever the config says
        return replace(
            config,
            norm="layer_weightless",
            rms_norm_eps=1e-5,
            clip_qkv=None if clip is None else float(clip),
        )
