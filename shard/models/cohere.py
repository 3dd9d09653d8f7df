"""Cohere's Command models: Command R and Aya (CohereForCausalLM) and Command R7B and Command A
(Cohere2ForCausalLM). One LayerNorm a layer (no bias) whose output attention and the SwiGLU MLP
both read, their outputs added to the stream together; rotary in interleaved pairs; tied
embeddings; the logits multiplied by `logit_scale`. Cohere 2 slides its window in three layers
of four (layer_types) and rotates only in those: its full-attention layers have no position
encoding."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, UnsupportedArchitectureError


def cohere_config(raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
    """What both generations state alike."""
    return replace(
        config,
        norm="layer",
        rms_norm_eps=float(raw.get("layer_norm_eps", 1e-5)),
        parallel_block=True,
        logits_scale=float(raw.get("logit_scale", 1.0)),
        rope=replace(config.rope, interleaved=True),
    )


class CohereForCausalLM(DecoderModel):
    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        if raw.get("use_qk_norm"):
            # Command R+ (2024): a LayerNorm per head of q and k, weights [heads, head_dim]
            raise UnsupportedArchitectureError(
                "use_qk_norm=true (Command R+'s per-head q/k LayerNorms) is not supported"
            )
        return cohere_config(raw, config)


class Cohere2ForCausalLM(DecoderModel):
    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        config = cohere_config(raw, config)
        # the sliding layers rotate; the full ones attend without position encoding
        layer_types = raw.get("layer_types") or ()
        rotary = tuple(kind == "sliding_attention" for kind in layer_types)
        return replace(config, rotary_layers=rotary)
