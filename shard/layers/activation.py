"""Gated activations of an MLP's fused gate_up product: act(gate) * up, the activation chosen
from a table by the checkpoint's config (`hidden_act` / `hidden_activation`).

SwiGLU (silu: Llama, Qwen, Phi-3) takes the platform's kernel where it has one
(shard/platforms/: on the CPU one native pass instead of two ops and a temporary, on a GPU one
Triton kernel). GeGLU (Gemma's gelu-tanh, exact gelu) is torch's two ops, which round as
transformers does: act(gate) in the dtype, then the product."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shard.platforms import platform_of
from shard.platforms.activations import CLAMPED_SWIGLU, GATED_ACTIVATIONS, MLP_ACTIVATIONS, SILU

__all__ = [
    "CLAMPED_SWIGLU",
    "GATED_ACTIVATIONS",
    "MLP_ACTIVATIONS",
    "SILU",
    "act_and_mul",
    "gated_activation",
    "mlp_activation",
    "silu_and_mul",
    "swiglu",
]


def gated_activation(name: str) -> str:
    """The table's canonical name for config.json's `name`; a ValueError naming the supported
    ones otherwise (at load, before any weight is read)."""
    if name not in GATED_ACTIVATIONS:
        raise ValueError(
            f"hidden activation {name!r} is not supported; supported: "
            f"{', '.join(sorted(GATED_ACTIVATIONS))}"
        )
    return SILU if GATED_ACTIVATIONS[name] is F.silu else name


def mlp_activation(name: str) -> str:
    """An ungated MLP's activation by config.json's name; a ValueError naming the supported ones
    otherwise (at load, before any weight is read)."""
    if name not in MLP_ACTIVATIONS:
        raise ValueError(
            f"hidden activation {name!r} is not supported; supported: "
            f"{', '.join(sorted(MLP_ACTIVATIONS))}"
        )
    return name


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [T, I] (e.g. the two halves of the gate_up product) -> silu(gate) * up."""
    out = platform_of(gate).silu_and_mul(gate, up)
    return F.silu(gate) * up if out is None else out


def swiglu(product: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused gate_up product [T, 2I], its first half of outputs the gate's
    (each tensor-parallel rank's product is laid out so too)."""
    out = platform_of(product).swiglu(product)
    if out is not None:
        return out
    gate, up = product.chunk(2, dim=-1)
    return F.silu(gate) * up


def act_and_mul(product: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up of a fused gate_up product [T, 2I] laid out as `swiglu` takes it."""
    if act == SILU:
        return swiglu(product)
    gate, up = product.chunk(2, dim=-1)
    return GATED_ACTIVATIONS[act](gate) * up
