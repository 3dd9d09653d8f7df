"""GPT-2 (`GPT2LMHeadModel`: gpt2 to gpt2-xl, distilgpt2, and the models fine-tuned from them):
GPTBigCode's layer (shard/models/gpt_bigcode.py: LayerNorms with a bias, learned absolute
positions, an ungated MLP, biases everywhere, the head tied to `wte`) with every head its own
keys and values, q, k and v fused in `c_attn` as [q | k | v], gelu_new, and its linears stored
as Conv1D weights, input dimension first (read transposed: Weights.read_transposed). The
original checkpoints name the modules without `transformer.`: both are read; their causal-mask
buffers (`attn.bias`, `attn.masked_bias`) are skipped."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.models.config import ModelConfig, UnsupportedArchitectureError
from shard.models.gpt_bigcode import GPT_BIGCODE_NAMES, GPTBigCodeForCausalLM
from shard.models.names import Names, without_prefix
from shard.weights import Weights

# Conv1D modules: their weights are stored [in, out]
_CONV1D = ("qkv_proj", "o_proj", "up_proj", "down_proj")


class GPT2LMHeadModel(GPTBigCodeForCausalLM):
    NAMES = GPT_BIGCODE_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        for field in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if raw.get(field):
                raise UnsupportedArchitectureError(f"GPT-2 with {field} true is not supported")
        config = super().adapt_config({**raw, "multi_query": False}, config)
        return replace(config, qkv_by_head=False)  # [q | k | v], not head by head

    @classmethod
    def names_for(cls, weights: Weights) -> dict[str, tuple[str, ...]]:
        if weights.has("transformer.wte.weight"):
            return cls.NAMES
        return without_prefix(cls.NAMES, "transformer.")  # the originals: `h.0...`

    def __init__(self, config: ModelConfig, weights: Weights, attention: str = "torch") -> None:
        table = self.names_for(weights)
        conv1d = [
            f"{name}.weight"
            for layer in range(config.num_layers)
            for ours in _CONV1D
            for name in Names(table, layer).many(ours)
        ]
        weights.read_transposed(conv1d)
        # the old checkpoints' causal-mask buffers: attention's `bias` and `masked_bias`
        weights.skip_named(".attn.masked_bias")
        for layer in range(config.num_layers):
            mask = f"{Names(table, layer).one('o_proj').removesuffix('.c_proj')}.bias"
            if weights.has(mask):
                weights.mark_consumed(mask)
        super().__init__(config, weights, attention)
