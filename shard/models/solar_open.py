"""Solar Open (Upstage, `SolarOpenForCausalLM`): Llama's attention (whole-head rotary, no q/k
norms, no o_proj bias) over GLM-4.5's Mixture-of-Experts MLP (shard/models/glm4_moe.py: sigmoid
scores with a correction bias, grouped, shared experts ungated) in every layer; its config has
no dense MLP size."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig
from shard.models.glm4_moe import Glm4MoeForCausalLM, grouped_sigmoid_moe


class SolarOpenForCausalLM(Glm4MoeForCausalLM):
    SKIPS_MTP_LAYERS = False

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        moe = grouped_sigmoid_moe(raw, config)
        return replace(config, o_bias=False, qk_norm=False, moe=moe)
