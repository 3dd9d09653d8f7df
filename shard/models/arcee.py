"""Arcee's AFM (`ArceeForCausalLM`: AFM-4.5B): Llama's layer with an ungated MLP, relu(up)^2 then
the down projection (`hidden_act` "relu2"), and YaRN rope in the releases."""

from __future__ import annotations

from typing import Any, ClassVar

from shard.models.blocks import DecoderModel
from shard.models.names import LLAMA_NAMES

ARCEE_NAMES = {**LLAMA_NAMES, "up_proj": ("model.layers.{i}.mlp.up_proj",)}


class ArceeForCausalLM(DecoderModel):
    NAMES = ARCEE_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}
