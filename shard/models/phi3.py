"""Phi-3, Phi-3.5 and Phi-4-mini: Llama's blocks over checkpoints that fuse q/k/v into one
`qkv_proj` and gate/up into one `gate_up_proj` tensor (each rank reads its q, k, v and gate,
up rows out of them), with partial rotary and longrope scaling (shard/layers/rotary.py).

Quantizers rewrite the layout: gptqmodel (7.x) saves the MLP as separate gate_proj / up_proj
modules while keeping qkv_proj fused, so the names follow what the checkpoint holds."""

from __future__ import annotations

from shard.models.blocks import DecoderModel
from shard.models.names import LLAMA_NAMES
from shard.weights import Weights

PHI3_NAMES = {
    **LLAMA_NAMES,
    "qkv_proj": ("model.layers.{i}.self_attn.qkv_proj",),
    "gate_up_proj": ("model.layers.{i}.mlp.gate_up_proj",),
}


PHI3_SPLIT_MLP_NAMES = {
    **PHI3_NAMES,
    "gate_up_proj": ("model.layers.{i}.mlp.gate_proj", "model.layers.{i}.mlp.up_proj"),
}


class Phi3ForCausalLM(DecoderModel):
    NAMES = PHI3_NAMES

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        split = weights.has_module("model.layers.0.mlp.gate_proj")
        return PHI3_SPLIT_MLP_NAMES if split else PHI3_NAMES
