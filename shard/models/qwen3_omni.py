"""Qwen3-Omni (`Qwen3OmniMoeForConditionalGeneration`: the thinker, the talker and its codec;
`Qwen3OmniMoeThinkerForConditionalGeneration`: the thinker alone), served text in, text out as
the thinker's language model: Qwen3-MoE's layers (shard/models/qwen3_moe.py). The audio and
vision encoders (only run for audio and images, which the API refuses), and the talker and
code-to-wave decoder (only run for speech output), are never loaded; for text the thinker's
multimodal rotary gives a token one position on every axis, which is plain rotary."""

from __future__ import annotations

from typing import Any

from shard.models.config import ModelConfig
from shard.models.names import STACKED_EXPERT_NAMES, stacked_experts
from shard.models.qwen3_moe import Qwen3MoeForCausalLM
from shard.models.text_only import TextOnly, nested_table, text_config
from shard.weights import Weights

# The whole model's files nest the thinker's language model under `thinker.`
THINKER_LAYOUT = {"model.": "thinker.model.", "lm_head.": "thinker.lm_head."}
_NOT_RUN = ("thinker.audio_tower.", "thinker.visual.", "talker.", "code2wav.")


def thinker_config(raw: dict[str, Any]) -> dict[str, Any]:
    thinker = raw.get("thinker_config")
    if not isinstance(thinker, dict):
        raise ValueError("config.json has no thinker_config: Qwen3-Omni's language model's config")
    return thinker


class Qwen3OmniMoeForConditionalGeneration(Qwen3MoeForCausalLM):
    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **fields: Any) -> ModelConfig:
        return super().config_from_dict(text_config(thinker_config(raw)), **fields)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        def has(name: str) -> bool:
            return weights.has(name.replace("model.", "thinker.model.", 1))

        table = {**cls.NAMES, **STACKED_EXPERT_NAMES} if stacked_experts(has) else cls.NAMES
        return nested_table(table, THINKER_LAYOUT)

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        weights.skip_modules(_NOT_RUN)
        super().__init__(config, weights, attention)


class Qwen3OmniMoeThinkerForConditionalGeneration(TextOnly, Qwen3MoeForCausalLM):
    """The thinker's own checkpoint: its language model beside `audio_tower.` and `visual.`."""
