"""GLM-4 dense (`Glm4ForCausalLM`: GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1): four norms a layer
(before attention and after it, before the MLP and after it: the sandwich norms, under GLM's
names), q/k/v biases without an o_proj bias, gate/up fused in one `gate_up_proj` tensor, and
rotary over the first half of each head (partial_rotary_factor 0.5) in interleaved pairs.
`GlmForCausalLM` (GLM-4-9B-chat as transformers ports it, `glm-4-9b-chat-hf`) is the same
without the norms after attention and the MLP. GLM-4.1V and GLM-4.6V-Flash
(`Glm4vForConditionalGeneration`) as released are served as this language model, text only
(shard/models/text_only.py): their multimodal rope (mrope_section) turns every section by the
same position for text, which is GLM-4's rope."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.names import LLAMA_NAMES
from shard.models.text_only import TextOnly

GLM_NAMES = {**LLAMA_NAMES, "gate_up_proj": ("model.layers.{i}.mlp.gate_up_proj",)}
GLM4_NAMES = {
    **GLM_NAMES,
    # the blocks' sandwich norms: after attention, before the MLP, after the MLP
    "post_attention_layernorm": ("model.layers.{i}.post_self_attn_layernorm",),
    "pre_feedforward_layernorm": ("model.layers.{i}.post_attention_layernorm",),
    "post_feedforward_layernorm": ("model.layers.{i}.post_mlp_layernorm",),
}


class GlmForCausalLM(DecoderModel):
    NAMES = GLM_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(config, o_bias=False, rope=replace(config.rope, interleaved=True))


class Glm4ForCausalLM(GlmForCausalLM):
    NAMES = GLM4_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(super().adapt_config(raw, config), sandwich_norms=True)


class Glm4vForConditionalGeneration(TextOnly, Glm4ForCausalLM):
    """GLM-4.1V, GLM-4.6V-Flash: served as their language model (whose config has no
    attention_bias: its q/k/v projections always carry one)."""

    CONFIG_DEFAULTS = {"qkv_bias_default": True}
