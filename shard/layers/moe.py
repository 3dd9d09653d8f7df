"""The experts of a Mixture-of-Experts MLP as one layer: every expert's gate_up and down weights
stacked ([E, 2I, H] and [E, H, I]), the router's top-k choice, and one grouped computation over
the whole step (the platform's `fused_moe`: grouped GEMMs on the CPU, the Triton kernel on a GPU).

Parallelism, from the checkpoint's own per-rank reads (each rank reads only what it keeps):
- tensor parallel (the default): every expert on every rank, each expert's intermediate
  dimension split across ranks (gate/up rows, down columns); a rank's output is a partial sum.
- expert parallel (`--expert-parallel`): rank r holds experts [r E/N, (r+1) E/N) whole; a token's
  choices of other ranks' experts are skipped here (id -1), so the output is again a partial sum.
Either way the caller all-reduces once, as after a dense MLP's row-parallel down projection.

Checkpoints come in these layouts, all read: the Hub's per-expert modules
(`experts.{e}.gate_proj.weight` ..., Mixtral's `w1/w3/w2`), transformers 5's own stacked
parameters (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]; Llama 4's
transposed: [E, H, 2I] and [E, I, H]), and gpt-oss's transposed, interleaved ones with biases,
in floating point or MXFP4 (shard/layers/moe_interleaved.py). Quantized experts: FP8 per
expert (shard/layers/moe_fp8.py) and int4 per expert (AWQ, GPTQ, compressed-tensors:
shard/layers/moe_int4.py).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from shard.layers.moe_fp8 import keeps_fp8_experts, read_fp8_expert, stack_fp8_experts
from shard.layers.moe_int4 import (
    INT4_TENSORS,
    Int4Layer,
    int4_layer,
    is_int4_expert,
    read_int4_expert,
)
from shard.layers.moe_interleaved import read_interleaved
from shard.layers.quant.fp8 import SCALE_NAMES, UNUSED, Fp8Weight, scale_name
from shard.layers.quant.fp8_source import read_dequantized
from shard.layers.quant.int4 import QuantizedWeight
from shard.layers.quant.reader import FeatureRange
from shard.platforms import platform_of
from shard.platforms.fp8_scales import Fp8Scales
from shard.weights import Weights, WeightsError

log = logging.getLogger(__name__)
_logged: list[str] = []  # the first FP8 expert read in this process, once logged

# A layer's experts of one kind: floating point or FP8 [E, N, K], or int4 (moe_int4.py)
ExpertWeights = torch.Tensor | Int4Layer

# The placeholder of a per-expert checkpoint name ("model.layers.0.mlp.experts.{e}.gate_proj").
EXPERT = "{e}"


def route(
    logits: torch.Tensor,
    top_k: int,
    *,
    renormalize: bool,
    round_to: torch.dtype | None,
    num_groups: int = 1,
    top_groups: int = 1,
    scale: float = 1.0,
    correction_bias: torch.Tensor | None = None,
    renormalize_min: float = 0.0,
    group_score: str = "max",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, K] float32, expert ids [T, K] int32): softmax in
    float32, the top k, divided by their sum (at least `renormalize_min`) with `renormalize`,
    times `scale` (DeepSeek-V2's routed_scaling_factor), rounded to `round_to` where the model's
    reference weights its experts in its dtype (transformers' Qwen MoE blocks, ERNIE 4.5).
    With `correction_bias` ([E], ERNIE 4.5) the choice reads the probabilities plus the bias,
    the weights the probabilities. With `num_groups` > 1 (DeepSeek-V2's group-limited greedy
    choice) the top k come from the `top_groups` of `num_groups` equal groups of experts whose
    best probability is highest (`group_score` "max"), or whose two best summed are ("top2":
    Mistral 4)."""
    probs = torch.softmax(logits.float(), dim=-1)
    choice = probs if correction_bias is None else probs + correction_bias
    if num_groups > 1:
        tokens, experts = probs.shape
        grouped = choice.view(tokens, num_groups, experts // num_groups)
        if group_score == "top2":
            ranked = torch.topk(grouped, 2, dim=-1)[0].sum(dim=-1)
        else:
            ranked = grouped.amax(dim=-1)
        kept = torch.topk(ranked, top_groups, dim=-1, sorted=False)[1]
        mask = torch.zeros(tokens, num_groups, dtype=torch.bool, device=probs.device)
        mask.scatter_(1, kept, True)
        choice = grouped.masked_fill(~mask[:, :, None], float("-inf")).view(tokens, experts)
    ids = torch.topk(choice, top_k, dim=-1)[1]
    weights = probs.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=renormalize_min)
    if scale != 1.0:
        weights = weights * scale
    if round_to is not None:
        weights = weights.to(round_to).float()
    return weights, ids.to(torch.int32)


def route_top_sigmoid(
    logits: torch.Tensor, top_k: int, *, round_to: torch.dtype | None, renormalize: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's router: logits [T, E] -> (weights [T, K] float32, expert ids [T, K] int32): the
    k highest logits, each weighted by its sigmoid (in float32, rounded to `round_to` as
    transformers rounds it to the model's dtype); with `renormalize` divided by their sum
    (Command A+'s sigmoid selection), else not renormalised."""
    top, ids = torch.topk(logits, top_k, dim=-1)
    weights = torch.sigmoid(top.float())
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if round_to is not None:
        weights = weights.to(round_to).float()
    return weights, ids.to(torch.int32)


def route_grouped_sigmoid(
    logits: torch.Tensor,
    top_k: int,
    *,
    correction_bias: torch.Tensor | None,
    num_groups: int,
    top_groups: int,
    renormalize: bool,
    scale: float,
    renormalize_eps: float = 1e-20,
    bias_on_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's and GLM-4.5's router: logits [T, E] float32 -> (weights [T, K] float32,
    expert ids [T, K] int32). Each expert's score is sigmoid(logit); the choice reads the score
    plus the expert's `correction_bias` (load balancing), first keeping the `top_groups` of
    `num_groups` equal groups of experts whose two best biased scores sum highest, then the top k
    experts within them; the weights are the chosen experts' unbiased scores, divided by their
    sum with `renormalize` (plus `renormalize_eps`: 1e-20 as transformers' DeepSeek-V3, 1e-6 as its
    LFM2-MoE), times `scale`
    (routed_scaling_factor). With `bias_on_logits` the choice reads the logits plus the bias
    (Kolibri's), the weights still the chosen experts' sigmoids."""
    scores = torch.sigmoid(logits.float())
    choice = logits.float() if bias_on_logits else scores
    choice = choice if correction_bias is None else choice + correction_bias
    if num_groups > 1:
        tokens, experts = choice.shape
        grouped = choice.view(tokens, num_groups, experts // num_groups)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
        kept = torch.topk(group_scores, top_groups, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
        choice = grouped.masked_fill(~mask[:, :, None], float("-inf")).view(tokens, experts)
    ids = torch.topk(choice, top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + renormalize_eps)
    return weights * scale, ids.to(torch.int32)


def route_sparsemixer(logits: torch.Tensor, jitter_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi-3.5-MoE's router at inference (transformers' sparsemixer, top-2): logits [T, E] in the
    model's dtype, where it computes -> (weights [T, 2] float32, expert ids [T, 2] int32). The
    first expert is the largest logit; its weight is its softmax among the logits within a
    relative 2 * jitter_eps of it. The second is the largest of the others, weighted likewise
    among the others near it."""
    first_value, first = logits.max(dim=-1, keepdim=True)
    first_weight = _sparsemixer_weight(logits, logits, first_value, first, jitter_eps)
    others = logits.scatter(-1, first, float("-inf"))
    second_value, second = others.max(dim=-1, keepdim=True)
    second_weight = _sparsemixer_weight(logits, others, second_value, second, jitter_eps)
    weights = torch.cat([first_weight, second_weight], dim=-1)
    return weights.float(), torch.cat([first, second], dim=-1).to(torch.int32)


def _sparsemixer_weight(
    logits: torch.Tensor, candidates: torch.Tensor, top: torch.Tensor, chosen: torch.Tensor,
    jitter_eps: float,
) -> torch.Tensor:  # fmt: skip
    """The chosen expert's softmax over the candidates whose logit is within a relative
    2 * jitter_eps of `top` (the relative gap measured against max(|logit|, top))."""
    factor = logits.abs().clamp(min=top)
    far = ((top - logits) / factor) > (2 * jitter_eps)
    return torch.softmax(candidates.masked_fill(far, float("-inf")), dim=-1).gather(-1, chosen)


class FusedMoE(nn.Module):
    """This rank's experts: w13 [E_r, 2 I_r, H] (gate rows first), w2 [E_r, H, I_r], or int4
    experts of those shapes (shard/layers/moe_int4.py); gpt-oss's biases w13_bias [E_r, 2 I_r]
    and w2_bias [E_r, H] (None on the ranks that leave it to rank 0) and its clamped SwiGLU's
    (alpha, limit). Ungated experts (`gated` False, Nemotron 3's): w13 [E_r, I_r, H] holds the
    up projection alone, and an expert computes act(up) where gated ones take act(gate) * up."""

    def __init__(
        self,
        w13: ExpertWeights,
        w2: ExpertWeights,
        *,
        num_experts: int,
        first_expert: int,
        act: str,
        triton: bool,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
        swiglu: tuple[float, float] | None = None,
        w13_scales: Fp8Scales | None = None,
        w2_scales: Fp8Scales | None = None,
        gated: bool = True,
    ) -> None:
        super().__init__()
        self.w13: ExpertWeights
        self.w2: ExpertWeights
        if isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor):
            self.w13 = nn.Parameter(w13, requires_grad=False)
            self.w2 = nn.Parameter(w2, requires_grad=False)
        else:  # int4: submodules holding their packed buffers
            self.w13, self.w2 = w13, w2
        self.register_buffer("w13_bias", w13_bias, persistent=False)
        self.register_buffer("w2_bias", w2_bias, persistent=False)
        # FP8 experts (w13 and w2 float8_e4m3fn): their scales and inputs per scale
        self.register_buffer("w13_scales", w13_scales and w13_scales.scales, persistent=False)
        self.register_buffer("w2_scales", w2_scales and w2_scales.scales, persistent=False)
        self.scale_blocks = (
            (w13_scales.block_k, w2_scales.block_k) if w13_scales and w2_scales else None
        )
        # the platform's fused_moe keywords beyond the weights (none for plain experts)
        self.extras: dict[str, float] = {}
        if swiglu is not None:
            self.extras = {"swiglu_alpha": swiglu[0], "swiglu_limit": swiglu[1]}
        if not gated:
            self.extras = {**self.extras, "gated": False}
        self.num_experts = num_experts  # the model's, over all ranks
        self.first_expert = first_expert  # this rank's first (expert parallel), else 0
        self.local_experts = len(w13)
        self.act = act  # a name of shard/platforms/activations.py's table
        self.triton = triton  # the Triton kernel (always on CUDA; interpreted in CPU tests)

    @classmethod
    def load(
        cls,
        weights: Weights,
        gate_up: list[str],
        down: str,
        *,
        num_experts: int,
        intermediate_size: int,
        act: str,
        expert_parallel: bool,
        interleaved: bool = False,
        swiglu: tuple[float, float] | None = None,
        transposed: bool | None = False,
        gated: bool = True,
    ) -> FusedMoE:
        """`gate_up`: the gate and up modules' names with `{e}` for the expert (per-expert
        checkpoints), or the one stacked gate_up parameter; `down` likewise; with `gated` False
        (ungated experts), the up module's name or the stacked up parameter. `interleaved`:
        gpt-oss's layout (shard/layers/moe_interleaved.py), with biases; `swiglu`: the clamped
        SwiGLU's (alpha, limit); `transposed`: the stacked parameters are Llama 4's, input
        dimension first (gate_up [E, H, 2I], down [E, I, H]); None: as their shapes say
        (Qwen3-VL-MoE's Hub files are, transformers 5's own module layout is not)."""
        world, rank = weights.dist.world_size, weights.dist.rank
        if not interleaved:  # MXFP4 is gpt-oss's layout's own, dequantized by its reader
            _refuse_quantized(weights, gate_up + [down])
        if expert_parallel:
            if num_experts % world:
                raise WeightsError(
                    f"--expert-parallel: {num_experts} experts cannot be split across "
                    f"{world} shards; the shard count must divide the number of experts"
                )
            per_rank = num_experts // world
            experts = range(rank * per_rank, (rank + 1) * per_rank)
            cols = (0, intermediate_size)
        else:
            experts = range(num_experts)
            cols = weights.shard_bounds(f"{down} (intermediate size)", 0, intermediate_size)
        b13: torch.Tensor | None = None
        b2: torch.Tensor | None = None
        s13: Fp8Scales | None = None
        s2: Fp8Scales | None = None
        if interleaved:
            (stacked,) = gate_up
            w13, w2, b13, b2 = read_interleaved(
                weights, stacked, down, experts, cols, intermediate_size
            )
        elif EXPERT in down:
            w13, w2, s13, s2 = _read_per_expert(
                weights, gate_up, down, num_experts, experts, cols, intermediate_size
            )
        else:
            w13, w2 = _read_stacked(
                weights, gate_up, down, experts, cols, intermediate_size, transposed, gated
            )
        return cls(
            w13,
            w2,
            num_experts=num_experts,
            first_expert=experts.start,
            act=act,
            triton=weights.triton,
            w13_bias=b13,
            w2_bias=b2,
            swiglu=swiglu,
            w13_scales=s13,
            w2_scales=s2,
            gated=gated,
        )

    def forward(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """This rank's part of sum_k w[t, k] expert_{ids[t, k]}(x[t]) (the caller all-reduces)."""
        if self.local_experts != self.num_experts:
            local = topk_ids - self.first_expert
            outside = (local < 0) | (local >= self.local_experts)
            topk_ids = local.masked_fill(outside, -1)
        extras = self.extras
        if self.w13_bias is not None or self.w2_bias is not None:
            extras = {**extras, "w13_bias": self.w13_bias, "w2_bias": self.w2_bias}
        if self.scale_blocks is not None:
            extras = {
                **extras,
                "w13_scales": Fp8Scales(self.w13_scales, self.scale_blocks[0]),
                "w2_scales": Fp8Scales(self.w2_scales, self.scale_blocks[1]),
            }
        if self.triton:
            from shard.platforms.cuda.kernels.fused_moe import fused_moe

            return fused_moe(x, self.w13, self.w2, topk_weights, topk_ids, self.act, **extras)
        return platform_of(x).fused_moe(
            x, self.w13, self.w2, topk_weights, topk_ids, self.act, **extras
        )


def _refuse_quantized(weights: Weights, names: list[str]) -> None:
    """Quantized experts in transformers' stacked layout (one tensor for every expert): refused
    at load, naming the format and the module; the Hub's per-expert tensors are read."""
    config = weights.quantization
    if config is None:
        return
    for name in names:
        module = name.replace(EXPERT, "0")
        if config.fp8 and any(weights.has(f"{module}_{s}") for s in ("scale_inv", "scale")):
            raise WeightsError(
                f"FP8 experts in transformers' stacked layout ({module} with its scales) are "
                "not supported; checkpoints with a tensor per expert (the Hub's layout) are"
            )
        if EXPERT in name:
            continue  # one module per expert: read by its format (int4 or FP8)
        if (
            config.quantizes(module)
            and not weights.has(f"{module}.weight")
            and not (weights.has(module))
        ):
            raise WeightsError(
                f"{config.method} {'int4 ' if config.int4_linears else ''}experts in one "
                f"stacked tensor are not supported: {module} is quantized; checkpoints with "
                "tensors per expert (experts.{e}.gate_proj ..., the Hub's layout) are"
            )


def _read_per_expert(
    weights: Weights,
    gate_up: list[str],
    down: str,
    num_experts: int,
    experts: range,
    cols: tuple[int, int],
    intermediate_size: int,
) -> tuple[ExpertWeights, ExpertWeights, Fp8Scales | None, Fp8Scales | None]:
    """w13 and w2 stacked over this rank's experts, and FP8 experts' scales where the Triton
    kernel takes them as stored (else FP8 experts are dequantized, and the scales None); int4
    experts as moe_int4.int4_layer keeps them. `gate_up`: the first GEMM's modules, gate and
    up, or up alone (ungated experts)."""
    start, stop = cols
    w13: torch.Tensor | None = None
    w2: torch.Tensor | None = None
    kept: list[tuple[Fp8Weight, Fp8Weight]] = []
    int4: list[tuple[QuantizedWeight, QuantizedWeight]] = []
    for j, e in enumerate(experts):
        modules = [m.replace(EXPERT, str(e)) for m in (*gate_up, down)]
        if is_int4_expert(weights, modules[0]):
            int4.append(read_int4_expert(weights, modules, start, stop, intermediate_size))
            continue
        _check_intermediate(weights, f"{modules[-1]}.weight", 1, intermediate_size)
        if _fp8(weights, modules[0]):
            if keeps_fp8_experts(weights):
                kept.append(read_fp8_expert(weights, modules, start, stop))
                continue
            pair = torch.cat([_fp8_part(weights, m, 0, start, stop) for m in modules[:-1]])
            rows = _fp8_part(weights, modules[-1], 1, start, stop)
        else:
            names = [f"{m}.weight" for m in modules]
            pair = weights.get_concat([(name, start, stop) for name in names[:-1]], 0)
            rows = weights.get_range(names[-1], 1, start, stop)
        if w13 is None or w2 is None:
            w13 = pair.new_empty((len(experts), *pair.shape))
            w2 = rows.new_empty((len(experts), *rows.shape))
        w13[j], w2[j] = pair, rows
    _mark_other_experts(weights, gate_up + [down], experts, num_experts)
    if int4:
        if len(int4) != len(experts):
            raise WeightsError(f"{down}: some experts are int4 and some are not")
        w13s, w2s = zip(*int4, strict=True)
        layers = int4_layer(list(w13s), weights, gate_up[0]), int4_layer(list(w2s), weights, down)
        return *layers, None, None
    if kept:
        return stack_fp8_experts(kept, down)
    if w13 is None or w2 is None:
        raise WeightsError(f"no experts to read for {down}")
    return w13, w2, None, None


def _fp8(weights: Weights, module: str) -> bool:
    """Whether an expert's weight is FP8 (with scales), which is dequantized at load: the
    experts' GEMMs take floating-point weights."""
    config = weights.quantization
    # `--quantize fp8` leaves floating-point experts as they are: they would be dequantized
    # again at load, with FP8's rounding and no memory saved
    online = config is not None and config.online
    return (
        config is not None and config.fp8 and not online and scale_name(weights, module) is not None
    )


def _fp8_part(weights: Weights, module: str, dim: int, start: int, stop: int) -> torch.Tensor:
    """Rows (dim 0) or columns (dim 1) start:stop of an FP8 expert weight, dequantized."""
    out, k = weights.shape(f"{module}.weight")
    part = (FeatureRange(start, stop, out), FeatureRange.whole(k))
    if dim == 1:
        part = (FeatureRange.whole(out), FeatureRange(start, stop, k))
    if not _logged:
        _logged.append(module)
        log.info(
            "FP8 experts are dequantized to %s at load (no grouped FP8 kernel): they take "
            "that dtype's memory",
            str(weights.dtype).removeprefix("torch."),
        )
    return read_dequantized(weights, module, *part)


def _mark_other_experts(weights: Weights, names: list[str], experts: range, total: int) -> None:
    """Other ranks' experts (expert parallel) are theirs to read: not unexpected tensors here."""
    for e in range(total):
        if e not in experts:
            for m in names:
                module = m.replace(EXPERT, str(e))
                for suffix in ("weight", *SCALE_NAMES, *UNUSED, *INT4_TENSORS):
                    if weights.has(f"{module}.{suffix}"):
                        weights.mark_consumed(f"{module}.{suffix}")


def _read_stacked(
    weights: Weights,
    gate_up: list[str],
    down: str,
    experts: range,
    cols: tuple[int, int],
    intermediate_size: int,
    transposed: bool | None = False,
    gated: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked experts (transformers 5's [E, 2I, H] and [E, H, I]; `transposed`: Llama 4's
    [E, H, 2I] and [E, I, H]; ungated: the up parameter [E, I, H]) -> this rank's w13 and w2
    in ours."""
    (stacked,) = gate_up
    if transposed is None:
        transposed = _transposed(weights.shape(stacked), weights.shape(down), intermediate_size)
    # the dims of gate_up's and of down's intermediate size
    pair_dim, down_dim = (2, 1) if transposed else (1, 2)
    shape = weights.shape(stacked)
    e_all, rows = shape[0], shape[pair_dim]
    halves = 2 if gated else 1
    if rows != halves * intermediate_size:
        what = "gate and up" if gated else "up"
        raise WeightsError(
            f"{stacked}: dim {pair_dim} is {rows}, not {what} of intermediate size "
            f"{intermediate_size}"
        )
    _check_intermediate(weights, down, down_dim, intermediate_size)
    start, stop = cols
    if len(experts) != e_all:  # expert parallel: this rank's experts, whole
        w13 = weights.get_range(stacked, 0, experts.start, experts.stop)
        w2 = weights.get_range(down, 0, experts.start, experts.stop)
    else:
        up = intermediate_size
        pieces = [(stacked, start, stop), (stacked, up + start, up + stop)][:halves]
        w13 = weights.get_concat(pieces, pair_dim)
        w2 = weights.get_range(down, down_dim, start, stop)
    if transposed:
        return w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
    return w13, w2


def _transposed(pair: tuple[int, ...], down: tuple[int, ...], intermediate_size: int) -> bool:
    """Whether stacked experts are stored input dimension first, by their shapes: down is
    [E, I, H] so, else [E, H, I]; where I = H, gate_up's 2I tells."""
    if down[1] != down[2]:
        return down[1] == intermediate_size
    return pair[2] != pair[1] and pair[2] % intermediate_size == 0 and pair[1] == down[1]


def _check_intermediate(weights: Weights, name: str, dim: int, intermediate_size: int) -> None:
    size = weights.shape(name)[dim]
    if size != intermediate_size:
        raise WeightsError(
            f"{name}: dim {dim} is {size}, not the config's expert intermediate size "
            f"{intermediate_size}"
        )
