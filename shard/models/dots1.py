"""dots.llm1 (rednote, `Dots1ForCausalLM`): Qwen3's attention (per-head q/k norms, no biases)
over DeepSeek-V3's Mixture-of-Experts layers as GLM-4.5 routes them (shard/models/glm4_moe.py:
sigmoid scores with a correction bias, grouped, shared experts ungated) after the first
`first_k_dense_replace` dense ones; sliding windows where layer_types names them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig
from shard.models.glm4_moe import Glm4MoeForCausalLM, grouped_sigmoid_moe


class Dots1ForCausalLM(Glm4MoeForCausalLM):
    SKIPS_MTP_LAYERS = False

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(config, o_bias=False, qk_norm=True, moe=grouped_sigmoid_moe(raw, config))
