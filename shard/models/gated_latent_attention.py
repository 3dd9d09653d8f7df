"""Multi-head latent attention with a sigmoid gate a head on its output (Ling/Ring hybrid's MLA
layers: transformers' `BailingHybridAttention`, its g_proj hidden -> heads; selected by
`ModelConfig.attention_output_gate` with `attention_head_gate`, as Attention's LFM3 gate).

Each head's output is its softmax-weighted latent up-projected by W_UV_h, a linear map: the
gate is applied to the latent before the up-projection, which is the same product.
"""

from __future__ import annotations

import torch

from shard.attention import AttentionBackend
from shard.layers.linear import ColumnParallelLinear, head_range
from shard.layers.quant.base import Piece
from shard.layers.rotary import RotaryEmbedding
from shard.models.config import ModelConfig
from shard.models.latent_attention import LatentAttention
from shard.models.names import Names
from shard.weights import Weights


class GatedLatentAttention(LatentAttention):
    output_gate: ColumnParallelLinear  # hidden -> this rank's heads' gates [T, H]

    @classmethod
    def load(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
    ) -> GatedLatentAttention:
        attention = super().load(weights, names, config, rotary, backend)
        assert isinstance(attention, GatedLatentAttention)
        dist = weights.dist
        first, last = head_range(config.num_heads, dist.rank, dist.world_size, replicate=False)
        rows = Piece(names.one("attn_output_gate"), first, last)
        attention.output_gate = ColumnParallelLinear.load_rows(weights, rows, bias=False)
        return attention

    def gated(self, out: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        # sigmoid in float32, rounded to the model's dtype, as transformers gates
        gate = torch.sigmoid(self.output_gate(hidden).float()).to(out.dtype)
        return out * gate.unsqueeze(-1)
