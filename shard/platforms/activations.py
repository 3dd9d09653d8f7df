"""The gated activations' elementwise functions, by config.json's name: the table the layers
(shard/layers/activation.py) and the platforms' fused kernels (the MoE experts) both read."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

# config.json's activation name -> the elementwise function of the gate (transformers' ACT2FN
# entries whose math these are: "gelu_new" and "gelu_fast" spell the tanh form differently and
# round differently, so they are not aliases of gelu_pytorch_tanh and stay unsupported).
GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
}
SILU = "silu"
