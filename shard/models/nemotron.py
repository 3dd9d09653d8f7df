"""Nemotron (`NemotronForCausalLM`: Nemotron-4, Minitron). Llama's layer with LayerNorm1P norms
(the stored weight w applied as 1 + w, with a bias; `norm_eps`), an ungated MLP
up_proj -> relu^2 -> down_proj, rotary over the first `partial_rotary_factor` of each head,
q/k/v/o biases where `attention_bias` says so and MLP biases where `mlp_bias` does."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.names import LLAMA_NAMES

NEMOTRON_NAMES = {**LLAMA_NAMES, "up_proj": ("model.layers.{i}.mlp.up_proj",)}


class NemotronForCausalLM(DecoderModel):
    NAMES = NEMOTRON_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(config, norm="layer_1p", rms_norm_eps=float(raw.get("norm_eps", 1e-5)))
