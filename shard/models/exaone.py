"""EXAONE 3.0 and 3.5 (`ExaoneForCausalLM`, LG AI Research): Llama's layer, which transformers
runs it as, under the Hub's GPT-2-style names (`transformer.h.{i}.attn.attention.q_proj`,
`out_proj`, `ln_1`/`ln_2` RMSNorms, the MLP's `c_fc_0` gate, `c_fc_1` up and `c_proj` down);
transformers' own saves use Llama's names. config.json's num_layers, layer_norm_epsilon and
activation_function are Llama's fields under other names, which transformers maps."""

from __future__ import annotations

from shard.models.blocks import DecoderModel
from shard.models.names import LLAMA_NAMES
from shard.weights import Weights

LAYER = "transformer.h.{i}"
EXAONE_NAMES = {
    "embed_tokens": ("transformer.wte",),
    "norm": ("transformer.ln_f",),
    "lm_head": ("lm_head",),
    "input_layernorm": (f"{LAYER}.ln_1",),
    "post_attention_layernorm": (f"{LAYER}.ln_2",),
    "qkv_proj": tuple(f"{LAYER}.attn.attention.{p}_proj" for p in "qkv"),
    "o_proj": (f"{LAYER}.attn.attention.out_proj",),
    "gate_up_proj": (f"{LAYER}.mlp.c_fc_0", f"{LAYER}.mlp.c_fc_1"),
    "down_proj": (f"{LAYER}.mlp.c_proj",),
}


class ExaoneForCausalLM(DecoderModel):
    NAMES = EXAONE_NAMES

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        return cls.NAMES if weights.has("transformer.wte.weight") else LLAMA_NAMES
