"""gpt-oss (OpenAI's open-weight Mixture-of-Experts models): attention with q/k/v and o biases
and a learned sink logit per head, sliding and full layers alternating (layer_types), YaRN rope;
every MLP a Mixture of Experts whose router has a bias and softmaxes its top-k logits (the
renormalised top k of a softmax over all of them), whose experts have biases and a clamped
SwiGLU (shard/platforms/activations.py), stored transposed with gate and up interleaved, in
MXFP4 as released (shard/layers/moe_interleaved.py); RMSNorms in float32."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shard.layers.activation import CLAMPED_SWIGLU
from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.mixtral import experts_in_every_layer
from shard.models.names import LLAMA_NAMES

GPT_OSS_NAMES = {
    **LLAMA_NAMES,
    "sinks": ("model.layers.{i}.self_attn.sinks",),
    "router": ("model.layers.{i}.mlp.router",),
    "expert_gate_up": ("model.layers.{i}.mlp.experts.gate_up_proj",),
    "expert_down": ("model.layers.{i}.mlp.experts.down_proj",),
}


class GptOssForCausalLM(DecoderModel):
    NAMES = GPT_OSS_NAMES

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        moe = experts_in_every_layer(
            raw,
            config,
            round_weights=True,  # transformers weights the experts' outputs in the dtype
            router_bias=True,
            interleaved_experts=True,
            expert_act=CLAMPED_SWIGLU,
            swiglu=(float(raw.get("swiglu_alpha", 1.702)), float(raw.get("swiglu_limit", 7.0))),
        )
        return replace(config, moe=moe, attention_sinks=True, norm="fp32_rms")
