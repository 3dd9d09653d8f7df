"""Rotary position embedding (neox style, as Llama: rotate the two halves of each head).

cos/sin are tabulated once in float32 for every position up to max_position_embeddings and
gathered by the positions tensor, so a step costs an index rather than a cos/sin per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    head_dim: int
    max_position_embeddings: int
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    # llama3 only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_config_dict(cls, config: dict[str, Any], head_dim: int) -> RopeConfig:
        """Reads `rope_parameters` (transformers 5) or `rope_scaling` + `rope_theta` (older)."""
        max_pos = config.get("max_position_embeddings", 2048)
        params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        if params and all(isinstance(v, dict) for v in params.values()):
            raise ValueError(f"per-layer-type rope parameters are not supported: {params}")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope type {rope_type!r} is not supported; one of {SUPPORTED_ROPE_TYPES}"
            )
        partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor")) or 1.0
        if partial != 1.0:
            raise ValueError(f"partial_rotary_factor={partial} is not supported")
        return cls(
            head_dim=head_dim,
            max_position_embeddings=max_pos,
            theta=float(params.get("rope_theta", config.get("rope_theta", 10000.0))),
            rope_type=rope_type,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings", max_pos)
            ),
        )

    def inv_freq(self) -> torch.Tensor:
        """[head_dim / 2] float32, with the scaling of `rope_type` applied."""
        dim = self.head_dim
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        if self.rope_type == "linear":
            return inv_freq / self.factor
        if self.rope_type == "llama3":
            return self._llama3(inv_freq)
        return inv_freq

    def _llama3(self, inv_freq: torch.Tensor) -> torch.Tensor:
        # Long wavelengths are slowed down by `factor`, short ones kept, the band between
        # interpolated smoothly (Llama 3.1's long-context recipe).
        old_len = self.original_max_position_embeddings
        low_freq_wavelen = old_len / self.low_freq_factor
        high_freq_wavelen = old_len / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (old_len / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: RopeConfig, device: torch.device) -> None:
        super().__init__()
        self.config = config
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = positions[:, None] * config.inv_freq()[None, :]
        self.register_buffer("cos", freqs.cos().to(device), persistent=False)  # [P, D/2] float32
        self.register_buffer("sin", freqs.sin().to(device), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64; q [T, H, D], k [T, Hkv, D] -> rotated q, k (same dtype)."""
        cos = self.cos[positions].to(q.dtype).unsqueeze(1)
        sin = self.sin[positions].to(q.dtype).unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
