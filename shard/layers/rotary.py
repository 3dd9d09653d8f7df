"""Rotary position embedding (neox style, as Llama: rotate the two halves of each head).

cos/sin are tabulated once in float32 for every position up to max_position_embeddings and
gathered by the positions tensor, so a step costs an index rather than a cos/sin per token. On the
CPU in eager mode, the rotation is one native pass (shard/native/elementwise.cpp), bit for bit the
torch form's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shard.native.build import rotary_kernel
from shard.native.eager import eager_cpu_kernel, heads_contiguous

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


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
    # yarn only
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # cos and sin are multiplied by this (yarn's attention temperature; 1 for the others)
    attention_factor: float = 1.0

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
        original_max_pos = int(params.get("original_max_position_embeddings", max_pos))
        factor = params.get("factor")
        if factor is None:  # yarn as DeepSeek writes it: the factor is implied by the lengths
            factor = max_pos / original_max_pos if rope_type == "yarn" else 1.0
        factor = float(factor)
        return cls(
            head_dim=head_dim,
            max_position_embeddings=max_pos,
            theta=float(params.get("rope_theta", config.get("rope_theta", 10000.0))),
            rope_type=rope_type,
            factor=factor,
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=original_max_pos,
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=bool(params.get("truncate", True)),
            attention_factor=_attention_factor(rope_type, factor, params),
        )

    def inv_freq(self) -> torch.Tensor:
        """[head_dim / 2] float32, with the scaling of `rope_type` applied."""
        dim = self.head_dim
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        if self.rope_type == "linear":
            return inv_freq / self.factor
        if self.rope_type == "llama3":
            return self._llama3(inv_freq)
        if self.rope_type == "yarn":
            return self._yarn(inv_freq)
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

    def _yarn(self, inv_freq: torch.Tensor) -> torch.Tensor:
        # YaRN (arXiv 2309.00071): dimensions that turn fewer than beta_slow times over the
        # original context are interpolated (divided by `factor`), those that turn more than
        # beta_fast times are kept, with a linear ramp between; as transformers computes it.
        dim, base = self.head_dim, self.theta

        def dim_of(rotations: float) -> float:
            turns = self.original_max_position_embeddings / (rotations * 2 * math.pi)
            return dim * math.log(turns) / (2 * math.log(base))

        low, high = dim_of(self.beta_fast), dim_of(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # no zero-width ramp
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
        return inv_freq / self.factor * (1 - keep) + inv_freq * keep


def _attention_factor(rope_type: str, factor: float, params: dict[str, Any]) -> float:
    """YaRN's cos/sin scale: given, or 0.1 ln(factor) + 1 (DeepSeek's mscale variant when
    mscale and mscale_all_dim are both given); 1 for the other rope types."""
    if rope_type != "yarn":
        return 1.0
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    if m and m_all:
        return mscale(factor, m) / mscale(factor, m_all)
    return mscale(factor)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: RopeConfig, device: torch.device) -> None:
        super().__init__()
        self.config = config
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = positions[:, None] * config.inv_freq()[None, :]
        cos, sin = freqs.cos() * config.attention_factor, freqs.sin() * config.attention_factor
        # Tabulated over the whole head (cos for both halves; sin negated for the first half),
        # so rotating is x * cos + swap_halves(x) * sin: the products and sums transformers'
        # rotate_half form rounds, in the same order, in five ops rather than eight.
        self.register_buffer("cos", torch.cat((cos, cos), -1).to(device), persistent=False)
        self.register_buffer("sin", torch.cat((-sin, sin), -1).to(device), persistent=False)
        # One module serves every layer, and every layer of a step passes the same positions
        # tensor: its gathered cos/sin are kept for the next layer (keyed by identity, which
        # holding the tensor keeps unique) instead of being gathered again 30-odd times. Each
        # step builds a new positions tensor; a caller that reuses one buffer across steps
        # (CUDA graphs, later) must clear `_step` per step: steps run under inference mode,
        # whose tensors carry no version counter to notice an in-place write.
        self._step: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def _cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        step = self._step
        if step is not None and step[0] is positions and step[1] == dtype:
            return step[2], step[3]
        cos, sin = self._gather(positions, dtype)
        self._step = (positions, dtype, cos, sin)
        return cos, sin

    def _gather(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos[positions], self.sin[positions]
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64; q [T, H, D], k [T, Hkv, D] -> rotated q, k (same dtype)."""
        if torch.compiler.is_compiling():
            # Inductor fuses the gather and both rotations into one loop; the eager shortcuts
            # below (a per-step cache keyed by identity, a storage check) cannot be traced.
            cos, sin = self._gather(positions, q.dtype)
            return _rotate(q, cos, sin), _rotate(k, cos, sin)
        native = self._native(positions, q, k)
        if native is not None:
            return native
        joint = _joint_heads(q, k)
        if joint is not None and joint.is_cuda:
            from shard.kernels.elementwise import rotary_  # one kernel where torch takes four

            # In place: q and k are the qkv product's own rows, which nothing else reads.
            rotary_(joint, self.cos, self.sin, positions)
            return q, k
        cos, sin = self._cos_sin(positions, q.dtype)
        if joint is None:
            return _rotate(q, cos, sin), _rotate(k, cos, sin)
        # q and k are neighbouring heads of one fused qkv row: one pass over both.
        rotated = _rotate(joint, cos, sin)
        num_heads = q.shape[1]
        return rotated[:, :num_heads], rotated[:, num_heads:]

    def _native(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Rotated q and k from the native kernel, or None where it does not apply."""
        kernel = eager_cpu_kernel(rotary_kernel, q)
        if (
            kernel is None
            or positions.dtype != torch.int64
            or q.dtype != k.dtype
            or q.shape[-1] > MAX_NATIVE_HEAD_DIM
        ):
            return None
        joint = _joint_heads(q, k)
        if joint is not None:
            rotated = kernel(joint, self.cos, self.sin, positions.contiguous())
            return rotated[:, : q.shape[1]], rotated[:, q.shape[1] :]
        if not (heads_contiguous(q) and heads_contiguous(k)):
            return None
        positions = positions.contiguous()
        return kernel(q, self.cos, self.sin, positions), kernel(k, self.cos, self.sin, positions)


MAX_NATIVE_HEAD_DIM = 512  # elementwise.cpp's kMaxHeadDim


def _joint_heads(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """q and k as one [T, H + Hkv, D] view when k's heads follow q's in the same rows (as the
    fused qkv projection lays them out), else None."""
    if (
        q.dim() != 3
        or q.shape[0] != k.shape[0]
        or q.shape[2] != k.shape[2]
        or q.stride() != k.stride()
        or q.stride(2) != 1
        or q.stride(1) != q.shape[2]
        or q.dtype != k.dtype
        or q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()
        or k.storage_offset() != q.storage_offset() + q.shape[1] * q.shape[2]
    ):
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1], q.shape[2]), q.stride())


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox rotation of x [T, heads, D] by the whole-head tables: x * cos + (x2, x1) * sin,
    which is (x1 cos - x2 sin, x2 cos + x1 sin) with sin's first half negated."""
    half = x.shape[-1] // 2
    return x * cos + x.roll(half, dims=-1) * sin
