"""Multi-head latent attention (MLA: DeepSeek-V2 and V3, and the models built on them), in its
absorbed form, over the same paged cache and attention kernels as every other model.

MLA compresses each token's keys and values into one latent c (kv_lora_rank wide, normed) and
one rotary key part k_r shared by every head; head h's key is [c W_UK_h, k_r] and its value
c W_UV_h, W_UK and W_UV being kv_b_proj's rows. Since q_h . (c W_UK_h) = (q_h W_UK_h^T) . c, a
query multiplied by W_UK_h ahead of the attention scores the latent directly; and since the
softmax weights sum the values linearly, attending over c and multiplying the result by W_UV_h
afterwards gives head h's output. So the cache holds, per token, the one vector [c, k_r]
(kv_lora_rank + rope dims: 576 for DeepSeek-V3, against 128 heads x 2 x 192 expanded), and
the attention is multi-query attention of one KV head over it: every query head's
[q_h W_UK_h^T, rotated q_r] against [c, rotated k_r] as keys, with those same vectors as values
(the output's first kv_lora_rank dims are the softmax-weighted latent; the rest is dropped).
The cache keeps that vector once (`values_are_keys`: its value plane is a view of its key
plane, shard/models/base.py), so a token costs one 576-wide row per layer.
The query scale stays the expanded head's (qk_nope + qk_rope dims), as transformers computes it.

Tensor parallel: query heads (q_b_proj or q_proj rows, kv_b_proj rows, o_proj columns) split
across ranks; the latent's projection (kv_a_proj_with_mqa) and the query's down projection
(q_a_proj) are computed whole on every rank, so every rank caches the same latent.

DeepSeek stores the rotary dims as interleaved pairs (rope_interleave, and V2's complex
rotation): the rotary's `interleaved` option (shard/layers/rotary.py).
"""

from __future__ import annotations

import torch
from torch import nn

from shard.attention import AttentionBackend, StepMetadata, attend
from shard.layers.head_position_scale import HeadPositionScale
from shard.layers.linear import ColumnParallelLinear, RowParallelLinear, head_range
from shard.layers.norm import NORMS, RMSNorm
from shard.layers.quant.base import Piece
from shard.layers.rotary import NoRotary, QueryPositionScale, RotaryEmbedding, scaled_by_position
from shard.models.config import MlaConfig, ModelConfig
from shard.models.names import Names
from shard.weights import Weights


class LatentAttention(nn.Module):
    def __init__(
        self,
        q_proj: nn.Module,
        kv_a_proj: ColumnParallelLinear,
        kv_a_norm: RMSNorm,
        w_uk: torch.Tensor,
        w_uv: torch.Tensor,
        o_proj: RowParallelLinear,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
        *,
        mla: MlaConfig,
        scale: float,
    ) -> None:
        super().__init__()
        self.q_proj = q_proj  # hidden -> this rank's heads' queries [T, H (nope + rope)]
        self.kv_a_proj = kv_a_proj  # hidden -> [latent, rotary key part], on every rank whole
        self.kv_a_norm = kv_a_norm
        # this rank's heads' key and value up-projections, [H, nope, rank] and [H, rank, v]
        self.register_buffer("w_uk", w_uk, persistent=False)
        self.register_buffer("w_uv", w_uv, persistent=False)
        self.o_proj = o_proj
        self.rotary = rotary
        self.backend = backend
        self.mla = mla
        self.scale = scale
        self.num_heads = w_uk.shape[0]
        self.position_scale: QueryPositionScale | None = None  # ModelConfig.query_position_scale
        # this rank's heads' learned scale by position (MlaConfig.head_position_scale), or None
        self.head_scale: HeadPositionScale | None = None

    # the cached vectors serve as keys and as values: the cache stores them once
    values_are_keys = True

    @property
    def cache_shape(self) -> tuple[int, int]:
        """(KV heads, head dims) of this layer's cache entry: the one latent vector."""
        return 1, self.mla.kv_lora_rank + self.mla.qk_rope_head_dim

    @classmethod
    def load(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding | NoRotary,
        backend: AttentionBackend,
    ) -> LatentAttention:
        assert config.mla is not None
        mla = config.mla.of_layer(names.layer)
        if isinstance(rotary, NoRotary) != (mla.qk_rope_head_dim == 0):
            raise ValueError(
                f"layer {names.layer}: latent attention with {mla.qk_rope_head_dim} rotary dims "
                f"and {'no ' if isinstance(rotary, NoRotary) else ''}rotary embedding"
            )
        dist = weights.dist
        first, last = head_range(
            config.num_heads, dist.rank, dist.world_size, replicate=False,
            tensor=f"{names.one('o_proj')}.weight",
        )  # fmt: skip
        qk_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim

        def heads(prefix: str, per_head: int) -> ColumnParallelLinear:
            return _columns(weights, prefix, first * per_head, last * per_head, bias=False)

        q_proj: nn.Module
        if mla.q_lora_rank is None:
            q_proj = heads(names.one("q_proj"), qk_dim)
        else:
            q_proj = nn.Sequential(
                _columns(weights, names.one("q_a_proj"), bias=config.qkv_bias),
                _norm(weights, names.one("q_a_layernorm"), config, mla),
                heads(names.one("q_b_proj"), qk_dim),
            )
        kv_a_proj = _columns(weights, names.one("kv_a_proj"), bias=config.qkv_bias)
        kv_a_norm = _norm(weights, names.one("kv_a_layernorm"), config, mla)
        # kv_b_proj is only ever multiplied into q and the attention's output: read as its
        # representation computes it (quantized ones dequantized) and kept as two tensors
        kv_b = heads(names.one("kv_b_proj"), mla.qk_nope_head_dim + mla.v_head_dim)
        rank = mla.kv_lora_rank
        eye = torch.eye(rank, dtype=weights.dtype, device=weights.device)
        with torch.no_grad():
            w_b = kv_b(eye).T.reshape(last - first, -1, rank)  # [H, nope + v, rank]
        w_uk = w_b[:, : mla.qk_nope_head_dim].contiguous()
        w_uv = w_b[:, mla.qk_nope_head_dim :].transpose(1, 2).contiguous()
        o_proj = RowParallelLinear.load(weights, names.one("o_proj"), bias=config.o_bias)
        scale = config.attention_scale or qk_dim**-0.5
        attention = cls(
            q_proj, kv_a_proj, kv_a_norm, w_uk, w_uv, o_proj, rotary, backend,
            mla=mla, scale=scale,
        )  # fmt: skip
        attention.position_scale = config.position_scale_of(names.layer)
        if mla.head_position_scale:
            prefix = names.one("head_position_scale")
            attention.head_scale = HeadPositionScale.load(weights, prefix, first, last)
        return attention

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: StepMetadata,
    ) -> torch.Tensor:
        query, key = self.query_key(self.q_proj(hidden), hidden, positions, meta)
        out = attend(self.backend, query, key, key, kv_cache, meta, self.scale)
        return self.output(self.gated(out, hidden))

    def gated(self, out: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The heads' attended latents [T, H, >= rank], gated by the layer's input where the
        model gates them (GatedLatentAttention); as they are here."""
        return out

    def query_key(
        self, q: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, meta: StepMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The heads' queries [T, H (nope + rope)] and the layer's input -> what attention
        reads: each head's query in latent space with its rotated part [T, H, rank + rope], and
        the token's one key, the normed latent with the rotated key part [T, 1, rank + rope]."""
        mla, rank = self.mla, self.mla.kv_lora_rank
        nope, rope = mla.qk_nope_head_dim, mla.qk_rope_head_dim
        q_nope, q_rope = q.view(-1, self.num_heads, nope + rope).split([nope, rope], -1)
        latent, k_rope = self.kv_a_proj(hidden).split([rank, rope], -1)
        latent = self.kv_a_norm(latent.contiguous())
        q_rope, k_rope = self.rotary(
            positions, q_rope.contiguous(), k_rope[:, None].contiguous(), meta
        )
        # Mistral 4 scales the whole query by position, before it meets the keys; Mistral
        # Large 4 by a learned factor a head
        q_nope = scaled_by_position(q_nope, positions, self.position_scale)
        q_rope = scaled_by_position(q_rope, positions, self.position_scale)
        if self.head_scale is not None:  # (one factor for both parts)
            factor = self.head_scale.factor(positions, q_nope.dtype)
            q_nope, q_rope = q_nope * factor, q_rope * factor
        # each head's query in latent space: q_nope W_UK^T, [T, H, rank]
        q_latent = torch.bmm(q_nope.transpose(0, 1), self.w_uk).transpose(0, 1)
        query = torch.cat((q_latent, q_rope), -1)
        key = torch.cat((latent.unsqueeze(1), k_rope), -1)  # [T, 1, rank + rope]
        return query, key

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """Attention's output [T, H, >= rank] -> the layer's [T, hidden]: the softmax-weighted
        latent of each head, up-projected to its values, through o_proj."""
        rank = self.mla.kv_lora_rank
        values = torch.bmm(out[..., :rank].transpose(0, 1), self.w_uv).transpose(0, 1)
        return self.o_proj(values.reshape(values.shape[0], -1))


def _columns(
    weights: Weights, prefix: str, start: int = 0, stop: int | None = None, *, bias: bool
) -> ColumnParallelLinear:
    """Output rows [start, stop) of `prefix` (all of them: the layer every rank holds whole)."""
    if stop is None:
        stop = ColumnParallelLinear.out_features_of(weights, prefix)
    return ColumnParallelLinear.load_rows(weights, Piece(prefix, start, stop), bias=bias)


def _norm(weights: Weights, prefix: str, config: ModelConfig, mla: MlaConfig) -> RMSNorm:
    eps = config.rms_norm_eps if mla.latent_norm_eps is None else mla.latent_norm_eps
    return NORMS[config.norm].load(weights, prefix, eps)
