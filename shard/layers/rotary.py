"""Rotary position embedding (neox style, as Llama: rotate the two halves of each head).

cos/sin are tabulated once in float32 for every position a request may reach and gathered by
the positions tensor, so a step costs an index rather than a cos/sin per token. The tables are
sized for the positions served, not for max_position_embeddings: Llama 4 Scout's 10M positions
would take 10 GiB a shard. A model is loaded with LOAD_POSITIONS rows at most; the shard's
warmup sizes them to the router's --max-total-tokens (`RotaryEmbedding.tabulate`) before the
KV cache takes the remaining memory and before CUDA graphs capture them. The
rotation is the platform's kernel where it has one (shard/platforms/: on the CPU in eager mode one
native pass, bit for bit the torch form's; on CUDA one Triton kernel in place), else torch's.

Two variants change what a token's table row is, not how it rotates:
- partial rotary (`partial_rotary_factor` < 1: Phi-3 small, Phi-4-mini): only the first
  `rotary_dim` dims of each head rotate (the neox halves taken within them), the rest pass
  through. The tables are `rotary_dim` wide, and every path (torch, native, Triton) reads the
  rotated width off the tables.
- longrope (Phi-3 128k, Phi-3.5, Phi-4-mini): two sets of frequencies, the short one for
  sequences up to `original_max_position_embeddings` and the long one past it, chosen for each
  token by its own sequence's length (see `_token_seq_lens`). Both tables are stacked in one
  buffer, short rows first, and a token reads row `position + long_offset` when long: the
  kernels see just another table row index.

- proportional (Gemma 4's global layers): whole heads rotate as halves, but only the first
  `rotated_fraction` of the frequency pairs turn (each pair (i, i + D/2) at base^(-2i/D)); the
  others have frequency zero, so their rows are cos 1, sin 0 and they pass through exactly.
  Not partial rotary, whose halves are taken within the leading dims.

And one changes which dims pair up: `interleaved` (GLM-4, DeepSeek) turns (x0, x1), (x2, x3)...
as pairs; each head's rotated dims are reordered evens-then-odds first, which makes them halves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from shard.attention.metadata import (
    AttentionMetadata,
    MixedMetadata,
    StepMetadata,
    prompt_token_rows,
)
from shard.platforms import platform_of

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")
# What Phi-3's first configs called longrope (transformers' Phi3Config renames it likewise).
_ROPE_TYPE_ALIASES = {
    "su": "longrope",
    # Qwen2-VL's and Qwen2.5-VL's multimodal rope (older configs say it so): every section turns
    # by the same position for text, the only input served (shard/models/text_only.py)
    "mrope": "default",
}
# The types whose pretraining length transformers takes from the config's top level first
# (standardize_rope_params: Phi-3 keeps `original_max_position_embeddings` there).
_ORIGINAL_LENGTH_TYPES = ("llama3", "yarn", "longrope")


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
    # llama3, yarn, longrope (longrope: the sequence length past which the long factors apply)
    original_max_position_embeddings: int = 8192
    # yarn only
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # cos and sin are multiplied by this (yarn's and longrope's attention scale; 1 for the others)
    attention_factor: float = 1.0
    # Only the first int(head_dim * partial_rotary_factor) dims of each head rotate.
    partial_rotary_factor: float = 1.0
    # longrope only: the inv_freq divisors, rotary_dim / 2 each, for sequences up to
    # original_max_position_embeddings (short) and past it (long).
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    # The rotated dims come as interleaved pairs (x0, x1), (x2, x3)... each turned by one
    # frequency (GLM-4's and DeepSeek's GPT-J-style rotation), not as two halves.
    interleaved: bool = False
    # proportional only: the fraction of each head's frequency pairs that turn (its
    # partial_rotary_factor); the tables still span the whole head
    rotated_fraction: float = 1.0
    # every pair turned the other way, by -position x frequency (NanoChat's rotate_half is
    # (x2, -x1)): the sin table negated, which every kernel reads as it is
    reverse: bool = False

    def __post_init__(self) -> None:
        dim = self.rotary_dim
        if dim % 2 or not 0 < dim <= self.head_dim:
            raise ValueError(
                f"rotary_dim = int(head_dim {self.head_dim} x partial_rotary_factor "
                f"{self.partial_rotary_factor}) = {dim} must be even and in (0, head_dim]"
            )
        if self.rope_type == "longrope":
            for name in ("short_factor", "long_factor"):
                got = len(getattr(self, name))
                if got != dim // 2:
                    raise ValueError(
                        f"longrope's {name} has {got} entries, not rotary_dim / 2 = {dim // 2} "
                        f"(head_dim {self.head_dim} x partial_rotary_factor "
                        f"{self.partial_rotary_factor})"
                    )

    @property
    def rotary_dim(self) -> int:
        """The leading dims of each head that rotate (head_dim unless partial rotary)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_config_dict(
        cls, config: dict[str, Any], head_dim: int, *, layer_type: str | None = None
    ) -> RopeConfig:
        """Reads `rope_parameters` (transformers 5) or `rope_scaling` + `rope_theta` (older).

        Where transformers 5 keys the parameters by layer type (Gemma 3: {"sliding_attention":
        {...}, "full_attention": {...}}), `layer_type` names the entry to read; with flat
        parameters every layer type has the same rope and `layer_type` is not needed."""
        max_pos = config.get("max_position_embeddings", 2048)
        params, per_type = _rope_parameters(config, layer_type)
        rope_type = params.get("rope_type", params.get("type", "default"))
        rope_type = _ROPE_TYPE_ALIASES.get(rope_type, rope_type)
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope type {rope_type!r} is not supported; one of {SUPPORTED_ROPE_TYPES}"
            )
        partial = params.get("partial_rotary_factor")
        if partial is None:
            partial = config.get("partial_rotary_factor")
        original_max_pos = params.get("original_max_position_embeddings")
        top_level = config.get("original_max_position_embeddings")
        if not per_type and rope_type in _ORIGINAL_LENGTH_TYPES and top_level is not None:
            original_max_pos = top_level
        original_max_pos = int(max_pos if original_max_pos is None else original_max_pos)
        factor = params.get("factor")
        if factor is None:
            # yarn as DeepSeek writes it, longrope as Phi-3 does: implied by the two lengths
            implied = rope_type in ("yarn", "longrope")
            factor = max_pos / original_max_pos if implied else 1.0
        factor = float(factor)
        longrope = rope_type == "longrope"
        # proportional rope reads partial_rotary_factor as the share of frequencies that turn,
        # over the whole head (transformers' _compute_proportional_rope_parameters)
        proportional = rope_type == "proportional"
        rotated_fraction = float(partial or 1.0) if proportional else 1.0
        if proportional:
            partial = 1.0
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
            attention_factor=_attention_factor(rope_type, factor, params, original_max_pos),
            partial_rotary_factor=float(partial or 1.0),
            short_factor=_factor_list(params, "short_factor") if longrope else (),
            long_factor=_factor_list(params, "long_factor") if longrope else (),
            rotated_fraction=rotated_fraction,
        )

    def inv_freq(self, long: bool = False) -> torch.Tensor:
        """[rotary_dim / 2] float32, with the scaling of `rope_type` applied; `long`: longrope's
        long-context frequencies (its short ones otherwise; no other type has two sets)."""
        dim = self.rotary_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        if self.rope_type == "longrope":
            ext = torch.tensor(self.long_factor if long else self.short_factor, dtype=torch.float32)
            # In transformers' order of roundings: the divisor times the base's power, inverted.
            return 1.0 / (ext * self.theta**exponents)
        if self.rope_type == "proportional":
            return self._proportional()
        inv_freq = 1.0 / (self.theta**exponents)
        if self.rope_type == "linear":
            return inv_freq / self.factor
        if self.rope_type == "llama3":
            return self._llama3(inv_freq)
        if self.rope_type == "yarn":
            return self._yarn(inv_freq)
        return inv_freq

    def _proportional(self) -> torch.Tensor:
        # The turning pairs' exponents are over the whole head (2i / head_dim), then zeros for
        # the rest, all divided by `factor`: in transformers' order of roundings.
        turning = int(self.rotated_fraction * self.head_dim // 2)
        exponents = torch.arange(0, 2 * turning, 2, dtype=torch.int64).float() / self.head_dim
        still = torch.zeros(self.head_dim // 2 - turning, dtype=torch.float32)
        return torch.cat((1.0 / (self.theta**exponents), still)) / self.factor

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
        dim, base = self.rotary_dim, self.theta

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


def _rope_parameters(config: dict[str, Any], layer_type: str | None) -> tuple[dict[str, Any], bool]:
    """The rope parameters that apply (a copy), and whether they were keyed by layer type."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    # Flat parameters hold numbers, strings and lists; keyed by layer type, dicts (or None for
    # a layer type without rope).
    if not any(isinstance(v, dict) for v in params.values()):
        return dict(params), False
    if layer_type is None:
        raise ValueError(
            f"the rope parameters are given per layer type ({', '.join(map(str, params))}): "
            "from_config_dict needs the layer_type to read"
        )
    if layer_type not in params:
        raise ValueError(
            f"no rope parameters for layer type {layer_type!r}; the config gives them for "
            f"{', '.join(map(str, params))}"
        )
    entry = params[layer_type]
    if not isinstance(entry, dict):
        raise ValueError(
            f"layer type {layer_type!r} has rope parameters {entry!r}: layers without a rotary "
            "embedding are not supported"
        )
    return dict(entry), True


def _factor_list(params: dict[str, Any], name: str) -> tuple[float, ...]:
    """longrope's short_factor or long_factor as a tuple of floats (the length is checked by
    RopeConfig, which knows rotary_dim)."""
    value = params.get(name)
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    ):
        raise ValueError(f"longrope needs {name}, a list of numbers; got {value!r}")
    return tuple(float(v) for v in value)


def yarn_mscale(factor: float, m: float = 1.0) -> float:
    """YaRN's magnitude scale for a context `factor` times the original (DeepSeek's `m`)."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def _attention_factor(
    rope_type: str, factor: float, params: dict[str, Any], original_max_pos: int
) -> float:
    """The cos/sin scale, as transformers computes it. YaRN: given, or 0.1 ln(factor) + 1
    (DeepSeek's mscale variant when mscale and mscale_all_dim are both given). longrope: given,
    or sqrt(1 + ln(factor) / ln(original_max_position_embeddings)), 1 for factor <= 1. 1 for the
    other rope types."""
    if rope_type not in ("yarn", "longrope"):
        return 1.0
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    if rope_type == "longrope":
        if factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(factor) / math.log(original_max_pos))
    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    if m and m_all:
        return yarn_mscale(factor, m) / yarn_mscale(factor, m_all)
    return yarn_mscale(factor)


def _tables(
    inv_freq: torch.Tensor, rows: int, attention_factor: float, reverse: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [rows, rotary_dim] for positions 0..rows-1, over the whole rotated width (cos
    for both halves; sin negated for the first half), so rotating is x * cos + swap_halves(x) *
    sin: the products and sums transformers' rotate_half form rounds, in the same order, in five
    ops rather than eight."""
    freqs = torch.arange(rows, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos() * attention_factor, freqs.sin() * attention_factor
    if reverse:
        sin = -sin
    return torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)


# The positions a model's tables hold when it is loaded (at most max_position_embeddings): what
# a model run without a shard's warmup (tests, tools) may reach. 64 MiB at head dim 128.
LOAD_POSITIONS = 65536


class RotaryEmbedding(nn.Module):
    def __init__(self, config: RopeConfig, device: torch.device) -> None:
        super().__init__()
        self.config = config
        self.rotary_dim = config.rotary_dim
        self.ops = platform_of(device)
        self.long_offset: int | None = None
        self.positions = 0  # the tables' rows (and the short ones before them, for longrope)
        # learned multipliers of the frequencies (Mistral Large 4's LeRoPE), float32, or None
        self.frequency_scale: torch.Tensor | None = None
        self.tabulate(LOAD_POSITIONS, device)
        # Interleaved pairs are reordered evens-then-odds (the dims past rotary_dim stay) and
        # then turned as halves: the same rotation of each pair, the dims of q and of k in the
        # same new order, so every query-key product is transformers'.
        order = None
        if config.interleaved:
            r = self.rotary_dim
            parts = (torch.arange(0, r, 2), torch.arange(1, r, 2), torch.arange(r, config.head_dim))
            order = torch.cat(parts).to(device)
        self.register_buffer("deinterleave", order, persistent=False)
        # One module serves every layer, and every layer of a step passes the same positions
        # tensor (and metadata): its table rows and gathered cos/sin are kept for the next layer
        # (keyed by identity, which holding the tensors keeps unique) instead of being computed
        # again 30-odd times. Each step builds a new positions tensor; a caller that reuses one
        # buffer across steps (CUDA graphs, later) must clear `_step` and `_kept_rows` per step:
        # steps run under inference mode, whose tensors carry no version counter to notice an
        # in-place write.
        self._step: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None
        self._kept_rows: tuple[torch.Tensor, StepMetadata | None, torch.Tensor] | None = None

    def tabulate(self, positions: int, device: torch.device | None = None) -> None:
        """(Re)builds the tables for positions 0 .. positions - 1, at most the model's
        max_position_embeddings (a shard's warmup: the router's longest request)."""
        config = self.config
        positions = max(1, min(positions, config.max_position_embeddings))
        device = self.cos.device if device is None else device
        if self.positions == positions and self.cos.device == device:
            return  # the same tables: kept (a compiled forward's graphs hold these tensors)
        # longrope: the row of the long table for position p is p + long_offset. Short rows are
        # read only by sequences no longer than original_max_position_embeddings, whose
        # positions are below it, so the short table stops there.
        if config.rope_type == "longrope":
            self.long_offset = min(config.original_max_position_embeddings, positions)
            factor, reverse = config.attention_factor, config.reverse
            short = _tables(config.inv_freq(long=False), self.long_offset, factor, reverse)
            long = _tables(config.inv_freq(long=True), positions, factor, reverse)
            cos, sin = torch.cat((short[0], long[0])), torch.cat((short[1], long[1]))
        else:
            inv_freq = config.inv_freq()
            if self.frequency_scale is not None:
                inv_freq = inv_freq * self.frequency_scale.to(inv_freq.device)
            cos, sin = _tables(inv_freq, positions, config.attention_factor, config.reverse)
        self.register_buffer("cos", cos.to(device), persistent=False)
        self.register_buffer("sin", sin.to(device), persistent=False)
        self._step = self._kept_rows = None
        self.positions = positions

    def scale_frequencies(self, scale: torch.Tensor) -> None:
        """Every frequency times `scale` [rotary_dim / 2] (Mistral Large 4's learned LeRoPE:
        exp(alpha), in float32 as transformers keeps it), the tables rebuilt."""
        if self.config.rope_type == "longrope" or scale.shape != (self.rotary_dim // 2,):
            raise ValueError(
                f"frequency scale of shape {tuple(scale.shape)} for {self.rotary_dim // 2} "
                f"{self.config.rope_type} frequencies"
            )
        self.frequency_scale = scale.float()
        positions, self.positions = self.positions, 0  # (so that tabulate rebuilds)
        self.tabulate(positions)

    @property
    def plain(self) -> bool:
        """True when this is the plain rotation of whole heads with one table row per position,
        which a caller may apply itself with `cos`, `sin` and the native kernel at `positions`
        (the CPU decode fast path). False for partial rotary (`rotary_dim` < head_dim: only the
        leading dims rotate, the tables are that wide) and longrope (the row depends on the
        token's sequence length): call the module, with the step's metadata, then."""
        return (
            self.rotary_dim == self.config.head_dim
            and self.long_offset is None
            and not self.config.interleaved
        )

    def _cos_sin(self, rows: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        step = self._step
        if step is not None and step[0] is rows and step[1] == dtype:
            return step[2], step[3]
        cos, sin = self._gather(rows, dtype)
        self._step = (rows, dtype, cos, sin)
        return cos, sin

    def _gather(self, rows: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos[rows], self.sin[rows]
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)

    def _rows(self, positions: torch.Tensor, meta: StepMetadata | None) -> torch.Tensor:
        """Each token's row of the tables: its position, or for longrope past the short table
        where its sequence is long."""
        if self.long_offset is None:
            return positions
        if torch.compiler.is_compiling():
            return self._longrope_rows(positions, meta)
        kept = self._kept_rows
        if kept is not None and kept[0] is positions and kept[1] is meta:
            return kept[2]
        rows = self._longrope_rows(positions, meta)
        self._kept_rows = (positions, meta, rows)
        return rows

    def _longrope_rows(self, positions: torch.Tensor, meta: StepMetadata | None) -> torch.Tensor:
        # Tensor ops only (no host read, no branch on values): a decode step stays capturable.
        assert self.long_offset is not None
        long = _token_seq_lens(positions, meta) > self.config.original_max_position_embeddings
        return torch.where(long, positions + self.long_offset, positions)

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        meta: StepMetadata | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64; q [T, H, D], k [T, Hkv, D] -> rotated q, k (same dtype).

        `meta`, the step's metadata, matters to longrope only (which tables each token reads,
        see `_token_seq_lens`); without it every token counts as the last of its sequence."""
        rows = self._rows(positions, meta)
        if self.deinterleave is not None:
            q, k = q[..., self.deinterleave], k[..., self.deinterleave]
        if torch.compiler.is_compiling():
            # Inductor fuses the gather and both rotations into one loop; the eager shortcuts
            # below (a per-step cache keyed by identity, a storage check) cannot be traced.
            cos, sin = self._gather(rows, q.dtype)
            return _rotate(q, cos, sin), _rotate(k, cos, sin)
        joint = _joint_heads(q, k)
        rotated = self.ops.rotate(q, k, joint, self.cos, self.sin, rows)
        if rotated is not None:
            return rotated
        cos, sin = self._cos_sin(rows, q.dtype)
        if joint is None:
            return _rotate(q, cos, sin), _rotate(k, cos, sin)
        # q and k are neighbouring heads of one fused qkv row: one pass over both.
        rotated = _rotate(joint, cos, sin)
        num_heads = q.shape[1]
        return rotated[:, :num_heads], rotated[:, num_heads:]

    def rotate_queries(
        self, positions: torch.Tensor, q: torch.Tensor, meta: StepMetadata | None = None
    ) -> torch.Tensor:
        """q [T, H, D] rotated alone, for a layer that reads another layer's rotated keys
        (Gemma 4's KV-sharing layers): the torch form on every platform (the platforms' kernels
        take q and k together, some in place)."""
        rows = self._rows(positions, meta)
        if self.deinterleave is not None:
            q = q[..., self.deinterleave]
        if torch.compiler.is_compiling():
            cos, sin = self._gather(rows, q.dtype)
        else:
            cos, sin = self._cos_sin(rows, q.dtype)
        return _rotate(q, cos, sin)

    def rotate_leading(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        meta: StepMetadata | None = None,
        *,
        interleaved: bool = False,
    ) -> torch.Tensor:
        """x [T, heads, D >= rotary_dim] with its first rotary_dim dims turned by this module's
        frequencies, as halves or, `interleaved`, as neighbouring pairs (reordered
        evens-then-odds first, as this module reorders its own), whatever pairing this module
        itself turns; the dims past them pass. The torch form: a second rotation over the
        same tables (DeepSeek Sparse Attention's indexer, shard/models/sparse_attention.py)."""
        rotary_dim = self.rotary_dim
        part = x[..., :rotary_dim]
        if interleaved:
            part = torch.cat((part[..., 0::2], part[..., 1::2]), -1)
        cos, sin = self._cos_sin(self._rows(positions, meta), x.dtype)
        return torch.cat((_rotate(part, cos, sin), x[..., rotary_dim:]), -1)


class NoRotary(nn.Module):
    """A layer without position encoding (NoPE: SmolLM3's every fourth layer): q and k pass as
    they are. Not `plain`, so a caller that rotates itself calls this module instead."""

    plain = False

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        meta: StepMetadata | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def rotate_queries(
        self, positions: torch.Tensor, q: torch.Tensor, meta: StepMetadata | None = None
    ) -> torch.Tensor:
        return q

    def rotate_leading(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        meta: StepMetadata | None = None,
        *,
        interleaved: bool = False,
    ) -> torch.Tensor:
        return x


def _token_seq_lens(positions: torch.Tensor, meta: StepMetadata | None) -> torch.Tensor:
    """[T] the length of each token's sequence, as longrope reads it: transformers picks the long
    factors for a whole forward pass when max(position_ids) + 1 > original_max, so for one
    sequence its prompt is long iff the prompt is, and a decode token at p iff p + 1 is. Per
    token here, from its own row: a prompt token gets its row's known length (`seq_lens`, the
    whole prompt even while it is computed in chunks; the context after its chunk where the
    metadata's builder gave none), a decode token its position + 1 (or `seq_lens` where given).
    The same whatever else the batch holds."""
    if meta is None:
        return positions + 1
    if isinstance(meta, MixedMetadata):
        n = meta.num_prefill_tokens
        parts = []
        if meta.prefill is not None:
            parts.append(_part_seq_lens(positions[:n], meta.prefill))
        if meta.decode is not None:
            parts.append(_part_seq_lens(positions[n:], meta.decode))
        return parts[0] if len(parts) == 1 else torch.cat(parts)
    return _part_seq_lens(positions, meta)


def _part_seq_lens(positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    if not meta.is_prefill:  # one token a row
        return positions + 1 if meta.seq_lens is None else meta.seq_lens
    lens = meta.context_lens if meta.seq_lens is None else meta.seq_lens
    return lens[prompt_token_rows(meta, positions.shape[0])]


def _joint_heads(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """q and k as one [T, H + Hkv, D] view when k's heads follow q's in the same rows (as the
    fused qkv projection lays them out), else None. With one token, the stride between tokens
    is whatever view() made of it (q's and k's differ after a split), and never read."""
    if (
        q.dim() != 3
        or k.dim() != 3
        or q.shape[0] != k.shape[0]
        or q.shape[2] != k.shape[2]
        or q.stride()[1:] != k.stride()[1:]
        or (q.shape[0] > 1 and q.stride(0) != k.stride(0))
        or q.stride(2) != 1
        or q.stride(1) != q.shape[2]
        or q.dtype != k.dtype
        or q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()
        or k.storage_offset() != q.storage_offset() + q.shape[1] * q.shape[2]
    ):
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1], q.shape[2]), q.stride())


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox rotation of x [T, heads, D] by the tables' rows [T, 1, R] (R <= D): over the first
    R dims, x * cos + (x2, x1) * sin, which is (x1 cos - x2 sin, x2 cos + x1 sin) with sin's
    first half negated; the dims past R pass through (partial rotary), as in transformers'
    apply_rotary_pos_emb."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        return torch.cat((_rotate(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), -1)
    return x * cos + x.roll(rotary_dim // 2, dims=-1) * sin


@dataclass(frozen=True)
class QueryPositionScale:
    """Llama 4's attention temperature: each query, once rotated, times
    1 + beta * log(1 + floor((position + offset) / interval)), which leaves the queries below
    position interval - offset as they are. Llama 4 applies it in its layers without rotary
    (offset 1, `floor_scale`, the product formed in float32 and rounded once); Ministral 3 and
    Mistral 4 in every layer (offset 0, the rope's original length, the factor rounded to the
    queries' dtype before the product), each as transformers computes it."""

    beta: float
    interval: int
    offset: int = 0
    wide_product: bool = False


def scaled_by_position(
    q: torch.Tensor, positions: torch.Tensor, scale: QueryPositionScale | None
) -> torch.Tensor:
    """Rotated queries [T, heads, D] scaled by their positions (QueryPositionScale); None: q as
    it is."""
    if scale is None:
        return q
    steps = torch.floor((positions + scale.offset) / scale.interval)
    factor = (1 + scale.beta * torch.log1p(steps))[:, None, None]
    if scale.wide_product:
        return (q * factor).to(q.dtype)
    return q * factor.to(q.dtype)
