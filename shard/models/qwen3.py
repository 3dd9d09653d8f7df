"""Qwen3: Llama's blocks with an RMSNorm over each head's query and key before rotary. Qwen3-VL
(dense) as released is served as this language model, text only (shard/models/text_only.py):
its interleaved multimodal rope turns every section by the same position for text, and its
deepstack features join only at image tokens."""

from __future__ import annotations

from shard.models.blocks import DecoderModel
from shard.models.text_only import TextOnly


class Qwen3ForCausalLM(DecoderModel):
    CONFIG_DEFAULTS = {"qk_norm": True}


class Qwen3VLForConditionalGeneration(TextOnly, Qwen3ForCausalLM):
    """Qwen3-VL (dense), served as its language model."""
