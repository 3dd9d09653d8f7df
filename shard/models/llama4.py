"""Llama 4 (Scout, Maverick; text): Llama's blocks with these of its own, all options of the
shared blocks:
- rotary in interleaved pairs, in the layers `no_rope_layers` marks 1; the others (every fourth:
  NoPE) have none and scale their queries by position instead (`attn_temperature_tuning`:
  1 + attn_scale * log(1 + floor((position + 1) / floor_scale)));
- the rotating layers attend within chunks of `attention_chunk_size` positions (`layer_types`'
  chunked_attention), q and k L2-normed per head after the rotation (`use_qk_norm`);
- Mixture-of-Experts MLPs in the layers `moe_layers` names (the others dense, of
  `intermediate_size_mlp`): the top-k router logits each weighted by its sigmoid, the weight
  applied to the expert's input, and a shared expert every token takes, ungated.

Experts are read from transformers' stacked parameters (input dimension first) or per expert
(`experts.{e}.gate_proj`, as FP8 exports hold them). Llama4ForConditionalGeneration, the
released checkpoints, is served as its language model (text only)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from shard.layers.rotary import QueryPositionScale
from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig, MoeConfig, UnsupportedArchitectureError
from shard.models.names import LLAMA_NAMES, in_some_layer
from shard.models.qwen2_moe import experts_per_token
from shard.models.smollm3 import rotary_layers
from shard.models.text_only import TextOnly, holds
from shard.weights import Weights

_MLP = "model.layers.{i}.feed_forward"
LLAMA4_NAMES: dict[str, tuple[str, ...]] = {
    **LLAMA_NAMES,
    "gate_up_proj": (f"{_MLP}.gate_proj", f"{_MLP}.up_proj"),
    "down_proj": (f"{_MLP}.down_proj",),
    "router": (f"{_MLP}.router",),
    "expert_gate_up": (f"{_MLP}.experts.gate_up_proj",),
    "expert_down": (f"{_MLP}.experts.down_proj",),
    "shared_expert_gate_up_proj": (
        f"{_MLP}.shared_expert.gate_proj",
        f"{_MLP}.shared_expert.up_proj",
    ),
    "shared_expert_down_proj": (f"{_MLP}.shared_expert.down_proj",),
}
PER_EXPERT_NAMES: dict[str, tuple[str, ...]] = {
    "expert_gate_up": (f"{_MLP}.experts.{{{{e}}}}.gate_proj", f"{_MLP}.experts.{{{{e}}}}.up_proj"),
    "expert_down": (f"{_MLP}.experts.{{{{e}}}}.down_proj",),
}
LAYER_TYPES = ("full_attention", "chunked_attention")


def llama4_config(raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
    layers = config.num_layers
    rotary = rotary_layers(raw, "no_rope_layers", layers) or (True,) * layers
    kinds = raw.get("layer_types") or ["full_attention"] * layers
    if unknown := set(kinds) - set(LAYER_TYPES):
        raise UnsupportedArchitectureError(f"layer_types {sorted(unknown)} are not Llama 4's")
    chunk = raw.get("attention_chunk_size")
    if "chunked_attention" in kinds and not (isinstance(chunk, int) and chunk > 0):
        raise UnsupportedArchitectureError(
            f"attention_chunk_size = {chunk!r}: chunked_attention layers need a positive size"
        )
    scale = None
    if raw.get("attn_temperature_tuning"):
        scale = QueryPositionScale(
            float(raw["attn_scale"]), int(raw["floor_scale"]), offset=1, wide_product=True
        )
    return replace(
        config,
        intermediate_size=raw.get("intermediate_size_mlp") or 0,
        rope=replace(config.rope, interleaved=True),
        rotary_layers=rotary,
        layer_chunks=tuple(chunk if kind == "chunked_attention" else None for kind in kinds),
        qk_l2_norm=bool(raw.get("use_qk_norm")),
        query_position_scale=scale,
        position_scaled_layers=tuple(not rotates for rotates in rotary),
        moe=_moe(raw, layers),
    )


def _moe(raw: dict[str, Any], layers: int) -> MoeConfig | None:
    experts = raw.get("num_local_experts") or 0
    sparse = set(raw.get("moe_layers") or ())
    if not experts or not sparse:
        return None
    return MoeConfig(
        num_experts=experts,
        top_k=experts_per_token(raw, experts),
        intermediate_size=raw["intermediate_size"],
        renormalize=False,
        round_weights=True,  # the sigmoid rounded to the model's dtype, as transformers does
        sparse_layers=tuple(i in sparse for i in range(layers)),
        shared_expert_intermediate_size=raw["intermediate_size"],
        shared_expert_gated=False,
        scoring="top_sigmoid",
        weights_on_input=True,
        transposed_experts=True,
    )


class Llama4ForCausalLM(DecoderModel):
    NAMES = LLAMA4_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return llama4_config(raw, config)

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        # (in the language model's own names or nested in a vision-language checkpoint's)
        if in_some_layer(partial(holds, weights), f"{_MLP}.experts.0.gate_proj.weight"):
            return {**cls.NAMES, **PER_EXPERT_NAMES}
        return cls.NAMES


class Llama4ForConditionalGeneration(TextOnly, Llama4ForCausalLM):
    """Llama 4 Scout and Maverick as released: the vision model and projector before the
    language model, served text only (shard/models/text_only.py)."""
