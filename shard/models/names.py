"""Our module names -> a checkpoint's tensor prefixes, the table each architecture states."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Our module names -> checkpoint prefixes ("{i}" = layer index), the table Llama's checkpoints
# follow. Fused modules map to several prefixes, or to one where the checkpoint fuses them.
LLAMA_NAMES: dict[str, tuple[str, ...]] = {
    "embed_tokens": ("model.embed_tokens",),
    "norm": ("model.norm",),
    "lm_head": ("lm_head",),
    "input_layernorm": ("model.layers.{i}.input_layernorm",),
    "post_attention_layernorm": ("model.layers.{i}.post_attention_layernorm",),
    "qkv_proj": (
        "model.layers.{i}.self_attn.q_proj",
        "model.layers.{i}.self_attn.k_proj",
        "model.layers.{i}.self_attn.v_proj",
    ),
    "o_proj": ("model.layers.{i}.self_attn.o_proj",),
    "q_norm": ("model.layers.{i}.self_attn.q_norm",),
    "k_norm": ("model.layers.{i}.self_attn.k_norm",),
    "gate_up_proj": ("model.layers.{i}.mlp.gate_proj", "model.layers.{i}.mlp.up_proj"),
    "down_proj": ("model.layers.{i}.mlp.down_proj",),
}


@dataclass(frozen=True)
class Names:
    """Resolves our names to checkpoint prefixes for one layer."""

    table: dict[str, tuple[str, ...]]
    layer: int = -1

    def many(self, ours: str) -> list[str]:
        return [name.format(i=self.layer) for name in self.table[ours]]

    def one(self, ours: str) -> str:
        (name,) = self.many(ours)
        return name


# Mixture-of-Experts blocks. Expert modules carry "{{e}}" (the expert's index, once the layer's
# is filled in); one name without it is transformers 5's stacked parameter of every expert.
QWEN_MOE_NAMES: dict[str, tuple[str, ...]] = {
    **LLAMA_NAMES,
    "router": ("model.layers.{i}.mlp.gate",),
    "expert_gate_up": (
        "model.layers.{i}.mlp.experts.{{e}}.gate_proj",
        "model.layers.{i}.mlp.experts.{{e}}.up_proj",
    ),
    "expert_down": ("model.layers.{i}.mlp.experts.{{e}}.down_proj",),
    "shared_expert_gate_up_proj": (
        "model.layers.{i}.mlp.shared_expert.gate_proj",
        "model.layers.{i}.mlp.shared_expert.up_proj",
    ),
    "shared_expert_down_proj": ("model.layers.{i}.mlp.shared_expert.down_proj",),
    "shared_expert_gate": ("model.layers.{i}.mlp.shared_expert_gate",),
}
STACKED_EXPERT_NAMES: dict[str, tuple[str, ...]] = {
    "router": ("model.layers.{i}.mlp.gate",),
    "expert_gate_up": ("model.layers.{i}.mlp.experts.gate_up_proj",),
    "expert_down": ("model.layers.{i}.mlp.experts.down_proj",),
}


# Mixtral's and MiniMax-M2's experts as quantization tools save them from transformers 5's
# stacked modules, split back into one module per expert (gptqmodel's defuser, llm-compressor)
# under `mlp` with Qwen-MoE's names, not the Hub's `block_sparse_moe.experts.{e}.w1/w3/w2`.
PER_EXPERT_MLP_NAMES: dict[str, tuple[str, ...]] = {
    key: QWEN_MOE_NAMES[key] for key in ("router", "expert_gate_up", "expert_down")
}


def per_expert_under_mlp(has_module: Callable[[str], bool]) -> bool:
    """Whether a checkpoint (`has_module`: Weights.has_module) holds its first layer's experts
    as modules of their own under `mlp` (the layers these models make sparse are all of
    them)."""
    return has_module("model.layers.0.mlp.experts.0.gate_proj")


def stacked_experts(has: Callable[[str], bool]) -> bool:
    """Whether a checkpoint (`has`: Weights.has) stores its experts as transformers 5 holds
    them, stacked, rather than as the Hub's per-expert modules."""
    return in_some_layer(has, "model.layers.{i}.mlp.experts.gate_up_proj")


def in_some_layer(has: Callable[[str], bool], template: str) -> bool:
    """Whether a checkpoint holds `template` (with `{i}` for the layer) in any layer."""
    return any(has(template.format(i=i)) for i in range(_MAX_LAYERS))


_MAX_LAYERS = 1024


def without_prefix(table: dict[str, tuple[str, ...]], prefix: str) -> dict[str, tuple[str, ...]]:
    """`table` with `prefix` taken off every name that has it (original checkpoints that name
    the base model's modules without the causal LM's `model.` or `transformer.`)."""
    return {
        ours: tuple(name.removeprefix(prefix) for name in names) for ours, names in table.items()
    }
