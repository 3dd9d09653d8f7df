"""Kimi Delta Attention (KDA), the linear attention of Kimi Linear's and Ling/Ring hybrid's linear
layers (transformers' `KimiLinearDeltaAttention`, `BailingHybridDeltaAttention`).

Gated DeltaNet's layer (shard/models/linear_attention.py) with a forget gate per key channel:
q, k and v projected apart (as many heads of each, one head size), one causal depthwise conv
over [q | k | v] then SiLU, the delta rule with a log decay g [heads, head_dim] per token and a
write strength beta per head (shard/layers/kimi_delta.py), and a gated RMSNorm per head, its
gate through a sigmoid, before o_proj. The state pools and slots are every recurrent mixer's
(`RecurrentState`, `RecurrentMixer`): a conv window over the 3 H D channels and a [D, D] float32
state per head.

The forget gate reads f = f_proj(x) + dt_bias (Kimi: a low-rank f_b_proj(f_a_proj(x))):
- "softplus" (Kimi Linear): g = -exp(A_log) softplus(f);
- "bounded" (Ling's kda_safe_gate): g = lower_bound sigmoid(exp(A_log) f), so no channel forgets
  faster than exp(lower_bound) a token; Ling rounds g to the model's dtype, as transformers does.
The output gate is g_proj(x) (Kimi: low-rank g_b_proj(g_a_proj(x))).

Tensor parallel splits the heads: q, k, v, f, g and b's rows (the low-rank projections' first
halves computed whole on every rank), the conv's channels and the pools; o_proj is row-parallel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shard.attention import StepMetadata
from shard.layers.kimi_delta import kda_decode, kda_prefill
from shard.layers.linear import ColumnParallelLinear, RowParallelLinear, head_range
from shard.layers.quant.base import Piece
from shard.models.config import KdaConfig, ModelConfig
from shard.models.linear_attention import (
    LinearShape,
    RecurrentMixer,
    RecurrentState,
    gated_rms_norm,
    state_slots,
    step_parts,
)
from shard.models.names import Names
from shard.weights import Weights, WeightsError


def kda_names(prefix: str, *, low_rank: bool, out: str) -> dict[str, tuple[str, ...]]:
    """Our names of a KDA layer's modules -> the checkpoint's, under `prefix` (the layer's
    attention module, "{i}" its index): q_proj, k_proj, v_proj, b_proj, q_conv1d, k_conv1d,
    v_conv1d, the forget and output gates' f_proj and g_proj (`low_rank`: Kimi's f_a_proj,
    f_b_proj, g_a_proj, g_b_proj), dt_bias, A_log, o_norm and the output projection `out`."""
    names = {f"kda_{x}": (f"{prefix}{x}_proj",) for x in "qkvb"}
    names["kda_conv"] = tuple(f"{prefix}{x}_conv1d" for x in "qkv")
    gates = [f"{x}_{part}" for x in "fg" for part in "ab"] if low_rank else ["f", "g"]
    names.update({f"kda_{gate}": (f"{prefix}{gate}_proj",) for gate in gates})
    names.update(kda_dt_bias=(f"{prefix}dt_bias",), kda_a_log=(f"{prefix}A_log",))
    names.update(kda_norm=(f"{prefix}o_norm",), kda_out=(f"{prefix}{out}",))
    return names


class KimiDeltaAttention(RecurrentMixer):
    def __init__(
        self,
        in_proj: ColumnParallelLinear,
        widths: list[int],
        f_up: ColumnParallelLinear | None,
        g_up: ColumnParallelLinear | None,
        conv_weight: torch.Tensor,
        dt_bias: torch.Tensor,
        a_log: torch.Tensor,
        norm_weight: torch.Tensor,
        out_proj: RowParallelLinear,
        shape: LinearShape,
        eps: float,
        kda: KdaConfig,
    ) -> None:
        super().__init__()
        # [q | k | v | f | g | b] of this rank's heads (f and g the low-rank halves, whole)
        self.in_proj = in_proj
        self.widths = widths
        self.f_up, self.g_up = f_up, g_up  # the low-rank projections' second halves, or None
        self.register_buffer("conv_weight", conv_weight, persistent=False)  # [channels, K]
        self.register_buffer("conv_bias", None, persistent=False)
        self.register_buffer("dt_bias", dt_bias.float(), persistent=False)  # [heads, D]
        # the decay rate exp(A_log) per head, float32 as transformers computes it: [heads, 1]
        self.register_buffer("decay_rate", a_log.float().exp()[:, None], persistent=False)
        self.register_buffer("norm_weight", norm_weight, persistent=False)
        self.out_proj = out_proj
        self.shape = shape
        self.eps = eps
        self.kda = kda

    @classmethod
    def load(cls, weights: Weights, names: Names, config: ModelConfig) -> KimiDeltaAttention:
        kda = config.kda
        assert kda is not None
        dist = weights.dist
        if kda.num_heads % dist.world_size:
            raise WeightsError(
                f"{dist.world_size} shards cannot split the {kda.num_heads} Kimi Delta Attention "
                "heads: the shard count must divide them"
            )
        first, last = head_range(kda.num_heads, dist.rank, dist.world_size, replicate=False)
        d = kda.head_dim
        rows = (first * d, last * d)
        low_rank = "kda_f_a" in names.table

        def whole(ours: str) -> Piece:
            prefix = names.one(ours)
            return Piece(prefix, 0, ColumnParallelLinear.out_features_of(weights, prefix))

        pieces = [Piece(names.one(f"kda_{x}"), *rows) for x in "qkv"]
        if low_rank:
            pieces += [whole("kda_f_a"), whole("kda_g_a")]
        else:
            pieces += [Piece(names.one("kda_f"), *rows), Piece(names.one("kda_g"), *rows)]
        pieces.append(Piece(names.one("kda_b"), first, last))
        in_proj = ColumnParallelLinear(
            *ColumnParallelLinear.load_pieces(weights, pieces, bias=False)
        )
        f_up = g_up = None
        if low_rank:
            f_up, g_up = (
                ColumnParallelLinear.load_rows(weights, Piece(names.one(x), *rows), bias=False)
                for x in ("kda_f_b", "kda_g_b")
            )
        convs = names.many("kda_conv")  # q_conv1d, k_conv1d, v_conv1d: one conv's rows
        conv_weight = torch.cat(
            [weights.get_range(f"{c}.weight", 0, *rows, stored_dtype=True) for c in convs]
        ).flatten(1)  # [3 heads D, 1, K] -> [3 heads D, K]
        if conv_weight.shape[1] != kda.conv_kernel:
            raise WeightsError(
                f"{convs[0]}.weight has a kernel of {conv_weight.shape[1]}, the config says "
                f"{kda.conv_kernel}"
            )
        if any(weights.has(f"{c}.bias") for c in convs):
            raise WeightsError(f"{convs[0]}.bias: a biased KDA conv is not supported")
        # Ling keeps its convs in float32 (transformers' _keep_in_fp32_modules), Kimi does not
        conv_weight = conv_weight.float() if kda.float32_conv else conv_weight.to(weights.dtype)
        # dt_bias and A_log stay float32 in both (Kimi's A_log is [1, 1, heads, 1])
        a_log = weights.get_tensor(names.one("kda_a_log"), stored_dtype=True).flatten()
        dt_bias = weights.get_range(names.one("kda_dt_bias"), 0, *rows, stored_dtype=True)
        f_width = d if low_rank else (last - first) * d
        widths = [3 * (last - first) * d, f_width, f_width, last - first]
        return cls(
            in_proj._record(weights, pieces),
            widths,
            f_up._record(weights, f_up.pieces) if f_up is not None else None,
            g_up._record(weights, g_up.pieces) if g_up is not None else None,
            conv_weight,
            dt_bias.view(last - first, d),
            a_log[first:last],
            weights.get_tensor(f"{names.one('kda_norm')}.weight"),
            RowParallelLinear.load(weights, names.one("kda_out"), bias=False),
            LinearShape(last - first, last - first, d, d, kda.conv_kernel),
            config.rms_norm_eps,
            kda,
        )

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: RecurrentState,
        meta: StepMetadata,
    ) -> torch.Tensor:
        s = self.shape
        heads, dim = (s.key_heads, s.key_dim)
        mixed, f, gate, b = self.in_proj(hidden).split(self.widths, dim=-1)
        if self.f_up is not None:
            f, gate = self.f_up(f), self.g_up(gate)
        g = self.log_decay(f.unflatten(-1, (heads, dim)))
        beta = b.sigmoid()
        out = torch.empty(hidden.shape[0], heads, dim, dtype=hidden.dtype, device=hidden.device)
        for part, start, stop in step_parts(meta, hidden.shape[0]):
            q, k, v = (
                self._conv(mixed[start:stop], cache, part).unflatten(-1, (3, heads, dim)).unbind(1)
            )
            slots = state_slots(part)
            args = (q, k, v, g[start:stop], beta[start:stop], cache.state, slots)
            if part.is_prefill:
                lengths, fresh = list(part.host_query_lens), list(part.host_fresh)
                out[start:stop] = kda_prefill(*args, lengths, fresh)
            else:
                out[start:stop] = kda_decode(*args)
        normed = gated_rms_norm(out, gate.unflatten(-1, (heads, dim)), self.norm_weight, self.eps,
                                in_float32=True, activation=torch.sigmoid)  # fmt: skip
        return self.out_proj(normed.flatten(1))

    def log_decay(self, f: torch.Tensor) -> torch.Tensor:
        """The forget gate's per-channel log decay [T, heads, D], float32 (an exp of it in half
        precision would overflow), from f_proj's output [T, heads, D]."""
        x = f.float() + self.dt_bias
        if self.kda.gate == "bounded":
            g = self.kda.gate_lower_bound * torch.sigmoid(self.decay_rate * x)
        else:
            g = -self.decay_rate * F.softplus(x)
        if self.kda.decay_in_model_dtype:  # Ling's gate returns g in the model's dtype
            g = g.to(f.dtype).float()
        return g
