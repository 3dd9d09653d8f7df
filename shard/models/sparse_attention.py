"""DeepSeek Sparse Attention (DSA: DeepSeek-V3.2, GLM-5): latent attention
(shard/models/latent_attention.py) in which each token attends over the `top_k` earlier tokens
its layer's lightning indexer scores best, not over its whole context.

The indexer, per layer: each token's key, LayerNorm(wk x) (one head of `head_dim`), and its
queries, wq_b of the query's normed low-rank latent (`num_heads` heads), the first
qk_rope_head_dim dims of both rotated by the layer's frequencies (in halves for DeepSeek-V3.2,
in interleaved pairs for GLM-5, whatever pairing the attention itself turns); token t scores
position j as sum_h w[t, h] * relu(q[t, h] . k_j / sqrt(head_dim)), w = weights_proj(x) /
sqrt(num_heads), in float32 (shard/attention/sparse.py). All as transformers computes it.

Where it is kept: each token's indexer key is stored in the layer's paged cache after its latent
vector, one row of kv_lora_rank + qk_rope_head_dim + head_dim a token, so blocks, prefix caching,
chunked prefill and the block tables carry it with no second cache. The attention's queries
get zeros there: a dense kernel reading the whole row scores exactly what it would without it.

When a step's every context fits in top_k (its block tables span at most top_k positions), the
indexer would choose every token: the layer then attends with the backend's dense kernels and
skips the indexer's queries. Otherwise, and always inside a captured CUDA graph (which cannot
branch on a step's lengths), it chooses, and attends over the chosen rows with the backend's
decode kernel: each query token a row whose block table lists its chosen slots, over the cache
viewed as blocks of one slot (`chosen_rows`).

GLM-5's shared layers run no indexer: they reuse the choice of the layer before them (passed
along in the step metadata's `derived`), and their rows hold the latent vector alone.
"""

from __future__ import annotations

import torch
from torch import nn

from shard.attention import AttentionBackend, StepMetadata, attend
from shard.attention.metadata import AttentionMetadata
from shard.attention.sparse import context_slots, select_tokens, token_tables
from shard.layers.head_position_scale import HeadPositionScale
from shard.layers.linear import ColumnParallelLinear
from shard.layers.norm import BiasLayerNorm, LayerNorm
from shard.layers.quant.base import Piece
from shard.layers.rotary import NoRotary, RotaryEmbedding
from shard.models.config import IndexerConfig, ModelConfig
from shard.models.latent_attention import LatentAttention
from shard.models.names import Names
from shard.weights import Weights

# transformers builds the indexer's key norm with this eps, whatever the config says
INDEXER_NORM_EPS = 1e-6
# Where a layer leaves its choice for the next (a shared layer's) in the step's `derived`
_CHOICE = "sparse_attention_choice"
_SLOTS = "sparse_attention_slots"

# ([T, K] int32 each token's chosen slots, best first, [T] int32 how many of them are real
# positions): a decode step's block tables and contexts over blocks of one slot; None: all
Choice = tuple[torch.Tensor, torch.Tensor] | None


def chosen_rows(
    kv_cache: torch.Tensor, choice: tuple[torch.Tensor, torch.Tensor], meta: StepMetadata
) -> tuple[torch.Tensor, AttentionMetadata]:
    """The chosen rows as a decode step over blocks of one slot: the cache viewed with a block
    size of 1, each query token a row whose block table is its chosen slots and whose context
    is how many are valid (`choice`, as _choice keeps it). Every backend's decode kernel then
    attends over them, without a copy of the rows."""
    planes, blocks, block_size, heads, width = kv_cache.shape
    slots = kv_cache.view(planes, blocks * block_size, 1, heads, width)
    tables, counts = choice
    captured = isinstance(meta, AttentionMetadata) and meta.captured
    step = AttentionMetadata(
        is_prefill=False,
        slot_mapping=meta.slot_mapping,
        block_tables=tables,
        context_lens=counts,
        captured=captured,
    )
    return slots, step


def every_position_chosen(
    tables: torch.Tensor, block_size: int, top_k: int, meta: StepMetadata
) -> bool:
    """Whether the step's block tables span at most top_k positions, so that the indexer would
    choose every token of every context and the dense kernels serve; never inside a captured
    graph, whose replays see other lengths. (By the tables' width: no host read.)"""
    captured = isinstance(meta, AttentionMetadata) and meta.captured
    return not captured and tables.shape[1] * block_size <= top_k


class Indexer(nn.Module):
    def __init__(
        self,
        wq_b: ColumnParallelLinear,
        wk: ColumnParallelLinear,
        k_norm: LayerNorm,
        weights_proj: ColumnParallelLinear,
        config: IndexerConfig,
        q_norm: LayerNorm | None = None,
        head_scale: HeadPositionScale | None = None,
    ) -> None:
        super().__init__()
        # the query's normed latent (or with `q_norm` the normed input) -> num_heads x head_dim,
        # on every rank whole
        self.wq_b = wq_b
        self.wk = wk  # hidden -> head_dim
        self.k_norm = k_norm
        self.weights_proj = weights_proj  # hidden -> num_heads
        self.config = config
        self.q_norm = q_norm  # IndexerConfig.query_norm (Mistral Large 4's), or None
        self.head_scale = head_scale  # its queries' scale by position, or None

    @classmethod
    def load(
        cls, weights: Weights, names: Names, config: IndexerConfig, *, head_scale: bool = False
    ) -> Indexer:
        def whole(ours: str) -> ColumnParallelLinear:
            prefix = names.one(ours)
            rows = Piece(prefix, 0, ColumnParallelLinear.out_features_of(weights, prefix))
            return ColumnParallelLinear.load_rows(weights, rows, bias=False)

        k_norm = BiasLayerNorm.load(weights, names.one("indexer_k_norm"), INDEXER_NORM_EPS)
        q_norm = scale = None
        if config.query_norm:
            q_norm = BiasLayerNorm.load(weights, names.one("indexer_q_norm"), INDEXER_NORM_EPS)
        if head_scale:
            scale = HeadPositionScale.load(weights, names.one("indexer_head_position_scale"))
        return cls(
            whole("indexer_wq_b"), whole("indexer_wk"), k_norm, whole("indexer_weights_proj"),
            config, q_norm, scale,
        )  # fmt: skip

    def keys(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding | NoRotary,
        meta: StepMetadata,
    ) -> torch.Tensor:
        """[T, head_dim] each token's indexer key, rotated (in a rotating layer)."""
        key = self.k_norm(self.wk(hidden))[:, None]
        key = rotary.rotate_leading(positions, key, meta, interleaved=self.config.rope_interleaved)
        return key[:, 0]

    def queries(
        self,
        q_latent: torch.Tensor | None,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding | NoRotary,
        meta: StepMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """([T, num_heads, head_dim] each token's rotated queries, [T, num_heads] float32 their
        weights), from the query's latent or with `q_norm` from the layer's input."""
        spec = self.config
        source = self.q_norm(hidden) if self.q_norm is not None else q_latent
        assert source is not None
        q = self.wq_b(source).view(-1, spec.num_heads, spec.head_dim)
        if self.head_scale is not None:
            q = self.head_scale(q, positions)
        q = rotary.rotate_leading(positions, q, meta, interleaved=spec.rope_interleaved)
        weights = self.weights_proj(hidden).float() * spec.num_heads**-0.5
        return q, weights


class SparseLatentAttention(LatentAttention):
    """LatentAttention over the tokens an indexer chooses (its own, or with `indexer` None the
    choice of the layer before)."""

    indexer: Indexer | None
    top_k: int

    @classmethod
    def load(
        cls,
        weights: Weights,
        names: Names,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
    ) -> SparseLatentAttention:
        attention = super().load(weights, names, config, rotary, backend)
        assert isinstance(attention, SparseLatentAttention) and config.mla is not None
        spec = config.mla.indexer
        assert spec is not None
        attention.top_k = spec.top_k
        shared = spec.shared(names.layer)
        scaled = config.mla.head_position_scale
        indexer = None if shared else Indexer.load(weights, names, spec, head_scale=scaled)
        attention.indexer = indexer
        return attention

    @property
    def cache_shape(self) -> tuple[int, int]:
        heads, width = super().cache_shape
        return heads, width + (0 if self.indexer is None else self.indexer.config.head_dim)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: StepMetadata,
    ) -> torch.Tensor:
        q_latent: torch.Tensor | None = None
        if isinstance(self.q_proj, nn.Sequential):  # through the bottleneck the indexer reads
            q_a_proj, q_a_norm, q_b_proj = self.q_proj
            q_latent = q_a_norm(q_a_proj(hidden))
            q = q_b_proj(q_latent)
        else:  # (Mistral Large 4's indexer normalises the layer's input itself)
            q = self.q_proj(hidden)
        query, key = self.query_key(q, hidden, positions, meta)
        width = query.shape[-1]
        if self.indexer is not None:
            index_key = self.indexer.keys(hidden, positions, self.rotary, meta)
            key = torch.cat((key, index_key[:, None].to(key.dtype)), -1)
        self.backend.store_kv(key, key, kv_cache, meta.slot_mapping)
        rows = kv_cache[0].reshape(-1, kv_cache.shape[-1])  # one row a slot
        choice = self._choice(q_latent, hidden, positions, rows, kv_cache.shape[2], meta)
        if key.shape[-1] > width:  # zeros against the indexer's keys: the same scores
            query = nn.functional.pad(query, (0, key.shape[-1] - width))
        if choice is None:
            out = attend(self.backend, query, key, key, kv_cache, meta, self.scale, store=False)
        else:
            out = self.backend.decode(query, *chosen_rows(kv_cache, choice, meta), self.scale)
        return self.output(out)

    def _choice(
        self,
        q_latent: torch.Tensor | None,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        rows: torch.Tensor,
        block_size: int,
        meta: StepMetadata,
    ) -> Choice:
        derived = meta.derived
        if self.indexer is None:  # a shared layer: the choice of the layer before
            if _CHOICE not in derived:
                raise ValueError("a shared sparse-attention layer runs before any indexer")
            return derived[_CHOICE]  # type: ignore[return-value]
        if _SLOTS not in derived:  # once a step: every layer's tokens read the same slots
            tables = token_tables(meta, positions.shape[0])
            dense = every_position_chosen(tables, block_size, self.top_k, meta)
            derived[_SLOTS] = None if dense else context_slots(tables, block_size)
        slots = derived[_SLOTS]
        choice: Choice = None
        if slots is not None:
            spec = self.indexer.config
            queries, weights = self.indexer.queries(q_latent, hidden, positions, self.rotary, meta)
            keys = rows[:, rows.shape[1] - spec.head_dim :]
            chosen, valid = select_tokens(
                queries, weights, keys, slots, positions, self.top_k, spec.head_dim**-0.5
            )
            # (in the decode kernels' form once: a shared layer reads it as it is)
            choice = (chosen.to(torch.int32), valid.sum(1, dtype=torch.int32))
        derived[_CHOICE] = choice
        return choice
