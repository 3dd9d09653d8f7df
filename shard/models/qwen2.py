"""Qwen2: Llama's blocks; its configs have no attention_bias field, yet its q/k/v projections
always carry a bias. Qwen2-VL and Qwen2.5-VL as released are served as this language model,
text only (shard/models/text_only.py): their multimodal rope (mrope_section) turns every
section by the same position for text, which is Qwen2's rope."""

from __future__ import annotations

from shard.models.blocks import DecoderModel
from shard.models.text_only import TextOnly


class Qwen2ForCausalLM(DecoderModel):
    CONFIG_DEFAULTS = {"qkv_bias_default": True}


class Qwen2VLForConditionalGeneration(TextOnly, Qwen2ForCausalLM):
    """Qwen2-VL, served as its language model."""


class Qwen2_5_VLForConditionalGeneration(TextOnly, Qwen2ForCausalLM):
    """Qwen2.5-VL, served as its language model."""
