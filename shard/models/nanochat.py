"""Karpathy's nanochat (`NanoChatForCausalLM`: nanochat-d20, -d32): every norm an RMSNorm
without a weight (Llama 4's L2 form, in float32), the embeddings normed before the first layer,
q and k normed the same way after the rotary, which turns each pair the other way
(`RopeConfig.reverse`: its rotate_half is (x2, -x1)); an ungated MLP fc1 -> relu^2 -> fc2; no
biases; the final logits soft-capped (`final_logit_softcapping`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch

from shard.models.blocks import DecoderModel
from shard.models.config import ModelConfig
from shard.models.names import LLAMA_NAMES

NANOCHAT_NAMES = {
    **LLAMA_NAMES,
    "up_proj": ("model.layers.{i}.mlp.fc1",),
    "down_proj": ("model.layers.{i}.mlp.fc2",),
}


class NanoChatForCausalLM(DecoderModel):
    NAMES = NANOCHAT_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False}

    @classmethod
    def adapt_config(cls, raw: dict[str, Any], config: ModelConfig) -> ModelConfig:
        return replace(
            config,
            norm="rms_weightless",
            qk_l2_norm=True,
            rope=replace(config.rope, reverse=True),
            final_softcap=raw.get("final_logit_softcapping") or None,
        )

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The embeddings normed (the final norm's weightless form) before the first layer: in
        `embed`, which the forward, the CPU decode loop and CUDA graphs all call."""
        return self.norm(super().embed(input_ids, positions))
