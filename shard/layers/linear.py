"""Tensor-parallel linears. Each layer knows how to read its own slice from the checkpoint.

Column layers split output features (no communication: their consumer is a row layer or the
attention of this rank's heads); row layers split input features and sum partial products with
one all_reduce. Fused layers run several projections as one matmul, packed per rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from shard.distributed import Distributed
from shard.layers.lora import LoraTerm
from shard.layers.quant.base import LinearWeight, Piece
from shard.layers.quant.select import linear_method
from shard.weights import Weights, WeightsError


def _param(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t, requires_grad=False)


def _column_bias(weights: Weights, pieces: Sequence[Piece]) -> torch.Tensor:
    return weights.get_concat([(f"{p.prefix}.bias", p.start, p.stop) for p in pieces], 0)


class ColumnParallelLinear(nn.Module):
    """y_r = x @ W_r.T + b_r, W_r the rank's block of output rows.

    `weight` is whatever the checkpoint's LinearMethod made of this rank's pieces (dense,
    int4...); the layers below only decide which output features each rank owns.
    """

    def __init__(self, weight: LinearWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = _param(bias)
        # What LoRA needs to cut an adapter like the weight: this rank's output pieces of each
        # checkpoint module, and each module's whole (in, out) shape. Set by `load_pieces`.
        self.pieces: tuple[Piece, ...] = ()
        self.module_shapes: dict[str, tuple[int, int]] = {}
        self.lora: LoraTerm | None = None  # attached by shard/lora/manager.py

    @classmethod
    def load_pieces(
        cls, weights: Weights, pieces: Sequence[Piece], *, bias: bool
    ) -> tuple[LinearWeight, torch.Tensor | None]:
        method = linear_method(weights, [p.prefix for p in pieces])
        return method.load_columns(weights, pieces), _column_bias(weights, pieces) if bias else None

    def _record(self, weights: Weights, pieces: Sequence[Piece]) -> ColumnParallelLinear:
        method = linear_method(weights, [p.prefix for p in pieces])
        self.pieces = tuple(pieces)
        self.module_shapes = {
            p.prefix: (
                method.in_features(weights, p.prefix),
                method.out_features(weights, p.prefix),
            )
            for p in pieces
        }
        return self

    @classmethod
    def load(cls, weights: Weights, prefix: str, *, bias: bool) -> ColumnParallelLinear:
        start, stop = weights.shard_bounds(prefix, 0, cls.out_features_of(weights, prefix))
        return cls.load_rows(weights, Piece(prefix, start, stop), bias=bias)

    @classmethod
    def load_rows(cls, weights: Weights, piece: Piece, *, bias: bool) -> ColumnParallelLinear:
        """Output rows [start, stop) of one module: this rank's heads, or every row for a
        layer each rank computes whole (MLA's latent projections)."""
        return cls(*cls.load_pieces(weights, [piece], bias=bias))._record(weights, [piece])

    @staticmethod
    def out_features_of(weights: Weights, prefix: str) -> int:
        return linear_method(weights, [prefix]).out_features(weights, prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lora is not None:
            return self.lora.linear(self.weight, x, self.bias)
        return self.weight(x, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Equal-sized column linears of one input fused into one matmul (gate_up_proj).

    The output is packed per rank as [block0_r, block1_r, ...], so `split` needs no communication.
    `prefixes` names each block's checkpoint module, or one module that already fuses them.
    """

    def __init__(self, weight: LinearWeight, bias: torch.Tensor | None, num_blocks: int) -> None:
        super().__init__(weight, bias)
        self.num_blocks = num_blocks

    @classmethod
    def load_merged(
        cls, weights: Weights, prefixes: Sequence[str], *, bias: bool, num_blocks: int
    ) -> MergedColumnParallelLinear:
        method = linear_method(weights, prefixes)
        if len(prefixes) == num_blocks:
            blocks = [(p, 0, method.out_features(weights, p)) for p in prefixes]
        elif len(prefixes) == 1:
            total = method.out_features(weights, prefixes[0])
            if total % num_blocks:
                raise WeightsError(f"{prefixes[0]}: {total} outputs are not {num_blocks} blocks")
            size = total // num_blocks
            blocks = [(prefixes[0], b * size, (b + 1) * size) for b in range(num_blocks)]
        else:
            raise WeightsError(f"{num_blocks} fused blocks cannot come from {list(prefixes)}")
        pieces = []
        for prefix, offset, end in blocks:
            start, stop = weights.shard_bounds(prefix, 0, end - offset)
            pieces.append(Piece(prefix, offset + start, offset + stop))
        layer = cls(*cls.load_pieces(weights, pieces, bias=bias), num_blocks)
        return layer._record(weights, pieces)

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return out.chunk(self.num_blocks, dim=-1)

    def act_and_mul(self, x: torch.Tensor, act: str) -> torch.Tensor:
        """act(gate) * up over a gate_up projection (`act` from activation.GATED_ACTIVATIONS),
        fused into the product where the weight's representation can (LinearWeight.gated). A
        step whose adapters add LoRA terms to the product (or a traced one that may) computes
        the product first."""
        if self.lora is not None and self.lora.adds_to_product():
            return self.lora.linear(self.weight, x, self.bias, gated=act)
        return self.weight.gated(x, self.bias, act)


def head_range(
    num_heads: int, rank: int, world_size: int, *, replicate: bool, tensor: str = ""
) -> tuple[int, int]:
    """Heads [start, stop) owned by `rank`. With `replicate`, fewer heads than ranks means each
    head is shared by world_size / num_heads consecutive ranks (the KV heads of GQA).
    `tensor` names the checkpoint tensor whose dim 0 holds the heads, for the error message."""
    if num_heads % world_size == 0:
        per_rank = num_heads // world_size
        return rank * per_rank, (rank + 1) * per_rank
    if replicate and world_size % num_heads == 0:
        head = rank // (world_size // num_heads)
        return head, head + 1
    where = f"cannot shard {tensor} along dim 0: " if tensor else ""
    rule = "divide it or be a multiple of it" if replicate else "divide it"
    raise WeightsError(
        f"{where}{num_heads} heads cannot be split across world size {world_size} "
        f"(the world size must {rule})"
    )


def gated_query_pieces(prefix: str, heads: range, head_dim: int, *, gate: bool) -> list[Piece]:
    """The query rows (or with `gate` the gate rows) of `heads` in a q_proj whose rows hold
    each head's query and then its output gate (Qwen3.5's)."""
    first = 1 if gate else 0
    return [
        Piece(prefix, (2 * h + first) * head_dim, (2 * h + first + 1) * head_dim) for h in heads
    ]


def _by_kv_head(
    prefix: str, heads: tuple[int, int], kv_heads: tuple[int, int], per_group: int, head_dim: int
) -> list[Piece]:
    """This rank's q rows, then k's, then v's, of a fused tensor grouped by KV head: group g
    holds query heads g * per_group ... (g + 1) * per_group - 1, then k_g, then v_g."""

    def rows(group: int, slot: int) -> Piece:
        start = (group * (per_group + 2) + slot) * head_dim
        return Piece(prefix, start, start + head_dim)

    return [
        *(rows(h // per_group, h % per_group) for h in range(*heads)),
        *(rows(g, per_group) for g in range(*kv_heads)),
        *(rows(g, per_group + 1) for g in range(*kv_heads)),
    ]


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul, packed per rank as [q_r, k_r, v_r].

    Query heads split evenly; KV heads split too, or are replicated when there are fewer KV
    heads than ranks, so every rank holds the KV heads its query heads attend to.
    """

    def __init__(
        self,
        weight: LinearWeight,
        bias: torch.Tensor | None,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        value_head_dim: int | None = None,
    ) -> None:
        super().__init__(weight, bias)
        self.num_heads = num_heads  # per rank
        self.num_kv_heads = num_kv_heads  # per rank
        self.head_dim = head_dim
        # v's heads where they are narrower than q's and k's (MiMo-V2-Flash's)
        self.value_head_dim = head_dim if value_head_dim is None else value_head_dim

    @classmethod
    def load_qkv(
        cls,
        weights: Weights,
        prefixes: Sequence[str],
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        bias: bool,
        gated_query: bool = False,
        queries_only: bool = False,
        by_head: bool = False,
        value_head_dim: int | None = None,
    ) -> QKVParallelLinear:
        """`prefixes`: the q, k, v checkpoint modules, or one module that already fuses them.
        `by_head`: the one fused module's rows are grouped by KV head, each group that KV
        head's query heads, then its k, then its v (Falcon's query_key_value; GPT-NeoX's, with
        as many KV heads as heads, is each head's q, k and v in turn), where a fused qkv_proj
        holds every q row, then k's, then v's.
        `gated_query`: q's rows hold each head's query and then its output gate (Qwen3.5); the
        queries are taken, every other head_dim rows. `queries_only`: q alone, for a layer that
        reads another's keys and values (`split` then gives k and v of no heads).
        `value_head_dim`: v's heads where they are narrower (three tensors only)."""
        rank, world = weights.dist.rank, weights.dist.world_size
        dv = head_dim if value_head_dim is None else value_head_dim
        if dv != head_dim and (len(prefixes) != 3 or by_head or gated_query):
            raise WeightsError(
                f"values of {dv} dims under heads of {head_dim} need q, k and v apart, got "
                f"{prefixes}"
            )
        if len(prefixes) == 3:
            sources = [(p, 0) for p in prefixes]
        elif len(prefixes) == 1:
            q_rows, kv_rows = num_heads * head_dim, num_kv_heads * head_dim
            sources = [(prefixes[0], 0), (prefixes[0], q_rows), (prefixes[0], q_rows + kv_rows)]
        else:
            raise WeightsError(f"qkv must come from 3 tensors or 1 fused tensor, got {prefixes}")
        q_name, k_name = f"{sources[0][0]}.weight", f"{sources[1][0]}.weight"
        q = head_range(num_heads, rank, world, replicate=False, tensor=q_name)
        kv = head_range(num_kv_heads, rank, world, replicate=True, tensor=k_name)
        pieces = [
            Piece(name, offset + a * dim, offset + b * dim)
            for (name, offset), (a, b), dim in zip(
                sources, (q, kv, kv), (head_dim, head_dim, dv), strict=True
            )
        ]
        if by_head:
            if len(prefixes) != 1 or num_heads % num_kv_heads:
                raise WeightsError(
                    f"q/k/v by KV head need one fused tensor and whole groups of query heads per "
                    f"KV head, got {prefixes} for {num_heads} heads, {num_kv_heads} KV heads"
                )
            pieces = _by_kv_head(prefixes[0], q, kv, num_heads // num_kv_heads, head_dim)
        if gated_query:
            if len(prefixes) != 3:
                raise WeightsError(f"a gated q_proj must be its own tensor, got {prefixes}")
            pieces = gated_query_pieces(prefixes[0], range(*q), head_dim, gate=False) + pieces[1:]
        if queries_only:
            pieces, kv = pieces[:1], (0, 0)
        layer = cls(
            *cls.load_pieces(weights, pieces, bias=bias),
            num_heads=q[1] - q[0],
            num_kv_heads=kv[1] - kv[0],
            head_dim=head_dim,
            value_head_dim=dv,
        )
        return layer._record(weights, pieces)

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[T, (H + Hkv) D + Hkv Dv] -> q [T, H, D], k [T, Hkv, D], v [T, Hkv, Dv] (this rank's
        heads; Dv = D but for narrower values)."""
        d, dv = self.head_dim, self.value_head_dim
        q, k, v = out.split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * dv], -1)
        tokens = out.shape[0]  # (k and v may have no heads: `queries_only`)
        return (
            q.view(tokens, self.num_heads, d),
            k.view(tokens, self.num_kv_heads, d),
            v.view(tokens, self.num_kv_heads, dv),
        )


class RowParallelLinear(nn.Module):
    """y = sum_r (x_r @ W_r.T) + b: W_r the rank's block of input columns, one all_reduce after.

    Only rank 0 holds the bias and adds it before the reduction, so the sum counts it exactly
    once and the add fuses into the matmul; the other ranks never read it.
    """

    def __init__(self, weight: LinearWeight, bias: torch.Tensor | None, dist: Distributed) -> None:
        super().__init__()
        self.weight = weight
        self.bias = _param(bias)
        self.dist = dist
        self.input_piece: Piece | None = None  # this rank's input features (for LoRA's A)
        self.module_shapes: dict[str, tuple[int, int]] = {}
        self.lora: LoraTerm | None = None  # attached by shard/lora/manager.py

    @classmethod
    def load(cls, weights: Weights, prefix: str, *, bias: bool) -> RowParallelLinear:
        bias_tensor = None
        if bias and weights.dist.rank == 0:
            bias_tensor = weights.get_tensor(f"{prefix}.bias")
        elif bias:
            weights.mark_consumed(f"{prefix}.bias")  # rank 0's copy stands for every rank
        method = linear_method(weights, [prefix])
        method.check_row_split(weights, prefix)
        in_features = method.in_features(weights, prefix)
        start, stop = weights.shard_bounds(prefix, 1, in_features)
        piece = Piece(prefix, start, stop)
        layer = cls(method.load_rows(weights, piece), bias_tensor, weights.dist)
        layer.input_piece = piece
        layer.module_shapes = {prefix: (in_features, method.out_features(weights, prefix))}
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dist.all_reduce(self.partial(x))

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share of the output, before the all_reduce (a caller that sums several
        shares first reduces them once: an MoE block's shared expert and routed experts)."""
        if self.lora is None:
            return self.weight(x, self.bias)
        # this rank's share of the term joins the same all_reduce
        return self.lora.linear(self.weight, x, self.bias)
