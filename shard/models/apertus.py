"""Apertus (`ApertusForCausalLM`, the Swiss AI Initiative's 8B and 70B): Llama's attention with an
RMSNorm over each head's query and key before rotary (Qwen3's), its two norms named
`attention_layernorm` and `feedforward_layernorm`, and an ungated MLP whose activation is xIELU
with parameters of its own in every layer (`mlp.act_fn.alpha_p`, `alpha_n`, `beta`, `eps`):
x > 0: alpha_p x^2 + beta x, else (expm1(min(x, eps)) - x) alpha_n + beta x, with
alpha_p = softplus(alpha_p'), alpha_n = beta + softplus(alpha_n'), op by op in the dtype as
transformers' XIELUActivation computes it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from shard.attention import AttentionBackend
from shard.layers.rotary import NoRotary, RotaryEmbedding
from shard.models.blocks import DecoderLayer, DecoderModel
from shard.models.config import ModelConfig
from shard.models.mlp import UngatedMLP
from shard.models.names import LLAMA_NAMES, Names
from shard.weights import Weights

XIELU = "xielu"
APERTUS_NAMES = {
    **LLAMA_NAMES,
    "input_layernorm": ("model.layers.{i}.attention_layernorm",),
    "post_attention_layernorm": ("model.layers.{i}.feedforward_layernorm",),
    "up_proj": ("model.layers.{i}.mlp.up_proj",),
    "down_proj": ("model.layers.{i}.mlp.down_proj",),
    "act": ("model.layers.{i}.mlp.act_fn",),
}


class XieluMLP(UngatedMLP):
    """An ungated MLP with this layer's xIELU (its parameters replicated: four numbers)."""

    def __init__(self, mlp: UngatedMLP, params: dict[str, torch.Tensor]) -> None:
        super().__init__(mlp.up_proj, mlp.down_proj, XIELU)
        # softplus taken once, in the parameters' dtype, as transformers takes it every call
        self.alpha_p = nn.Parameter(F.softplus(params["alpha_p"]), requires_grad=False)
        beta = params["beta"]
        self.alpha_n = nn.Parameter(beta + F.softplus(params["alpha_n"]), requires_grad=False)
        self.register_buffer("beta", beta, persistent=False)
        self.register_buffer("eps", params["eps"], persistent=False)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        up = self.up_proj(x)
        positive = self.alpha_p * up * up + self.beta * up
        negative = (torch.expm1(torch.min(up, self.eps)) - up) * self.alpha_n + self.beta * up
        return torch.where(up > 0, positive, negative)


class ApertusForCausalLM(DecoderModel):
    NAMES = APERTUS_NAMES
    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {"gated_mlp": False, "qk_norm": True}

    @classmethod
    def config_from_dict(cls, raw: dict[str, Any], **kwargs: Any) -> ModelConfig:
        if raw.get("hidden_act", XIELU) != XIELU:  # another ungated activation: the table's
            return super().config_from_dict(raw, **kwargs)
        # xIELU's parameters are each layer's (XieluMLP), not in the activation table
        config = super().config_from_dict({**raw, "hidden_act": "relu2"}, **kwargs)
        return replace(config, hidden_act=XIELU)

    @classmethod
    def load_layer(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> nn.Module:
        layer = DecoderLayer.load(weights, names, config, rotary, backend)
        if config.hidden_act == XIELU:
            assert isinstance(layer.mlp, UngatedMLP)
            act = names.one("act")
            params = {
                name: weights.get_tensor(f"{act}.{name}").reshape(())
                for name in ("alpha_p", "alpha_n", "beta", "eps")
            }
            layer.mlp = XieluMLP(layer.mlp, params)
        return layer
