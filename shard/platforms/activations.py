"""The gated activations' elementwise functions, by config.json's name: the table the layers
(shard/layers/activation.py) and the platforms' fused kernels (the MoE experts) both read."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

# config.json's activation name -> the elementwise function of the gate (transformers' ACT2FN
# entries whose math these are: "gelu_new" and "gelu_fast" spell the tanh form differently and
# round differently, so they are not aliases of gelu_pytorch_tanh; gelu_new is served ungated).
GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
}
SILU = "silu"


def relu2(x: torch.Tensor) -> torch.Tensor:
    """relu(x) squared (transformers' ReLUSquaredActivation: Arcee's AFM, Nemotron)."""
    return torch.square(F.relu(x))


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh GELU op by op in x's dtype, each rounding where transformers'
    NewGELUActivation rounds (Phi's): torch's gelu(approximate="tanh") computes the same formula
    in one kernel and rounds once, so it is not this function in half precision."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
    return 0.5 * x * (1.0 + torch.tanh(inner))


# An ungated MLP's activation of its up projection (shard/models/mlp.py UngatedMLP): the gated
# table's functions, and those only ungated MLPs use
MLP_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    **GATED_ACTIVATIONS,
    "relu2": relu2,
    "gelu_new": gelu_new,
    "relu": F.relu,  # OPT's
}

# gpt-oss's experts: SwiGLU over clamped halves, with a sigmoid gain and up + 1. Not in the
# table above, whose activations transform the gate only: this one takes its parameters
# (alpha, limit) from the config and transforms the up half too.
CLAMPED_SWIGLU = "clamped_swiglu"


def clamped_swiglu(
    gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float
) -> torch.Tensor:
    """(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit); each op
    in the inputs' dtype, as transformers' GptOssExperts rounds."""
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))
