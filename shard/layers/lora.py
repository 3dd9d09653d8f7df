"""The LoRA term of a tensor-parallel linear: y += scaling[s] * (x @ A_s^T) @ B_s^T, where s is
the device slot of each token's adapter (-1: none).

Every LoRA-capable TP linear holds one `LoraTerm` with its slots' weights, padded to the
maximum rank, for its `n_sub` sub-modules, one per checkpoint module the linear fuses (3 for
q/k/v, 2 for gate/up, else 1; 1 for a checkpoint that stores q/k/v or gate/up as one tensor, as
Phi-3's does, whose adapters have one A for the fused module; shard/lora/manager.py):
    lora_a [S, n_sub, R, K]   K: this rank's input features
    lora_b [S, N, R]          N: this rank's output features; output slice j (out_slices) uses
                              sub-module j's rank columns
Tensor parallelism follows the base weight (seed 000): a column layer keeps A whole and holds
its rows of B, a row layer holds its columns of A and keeps B whole; each rank's partial
product then enters the row layer's existing all-reduce, so LoRA adds no collective.

Which token uses which slot is per step: the runner sets it once on the shared `LoraStep`
(built from the batch), and every term reads it there, so model files pass nothing new.

On CPU, terms work on packed copies of the slots, in which every slot's weights are one
contiguous block. A step of up to NATIVE_TOKENS_PER_SLOT adapter tokens a slot it uses (at most
NATIVE_MAX_TOKENS) runs the native kernel (shard/platforms/cpu/native/lora.cpp) where it was built:
tokens grouped by slot, each slot's rows read once for all its tokens, one call per linear; or, for
a bf16 linear whose weight the AMX tile kernel holds, the base product and the terms in one call
of that kernel (`LoraTerm.linear`, shard/platforms/cpu/lora_amx.py, up to TILE_MAX_TOKENS).
Otherwise, or without the kernel, the torch path. Its matmuls are tiny (a decode step's few rows,
rank 16), so on CPU they cost per call more than per FLOP. A small step computes every slot it uses
for all its tokens at once (the "dense" shape: one shrink GEMM, a mask that keeps each token's own
slot with its scaling, one expand GEMM per sub-module, whatever the number of adapters); a step
using one slot is exact that way at any size. A large step over several slots would multiply its
FLOPs by their count, so it goes slot by slot over each slot's tokens (the "grouped" shape). A
half-precision model's small terms (a decode step's) multiply fp32 copies of the slots with MKL,
cheaper per call than oneDNN's half-precision GEMMs at that size, and round once into the
output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shard.layers.activation import SILU, act_and_mul
from shard.layers.lora_chunks import ChunkedB
from shard.layers.quant.base import LinearWeight
from shard.layers.quant.unquantized import DenseWeight
from shard.platforms import Platform, platform_of
from shard.platforms.cpu.compiled import lora_in_graph, register_lora_term

# Adapter tokens up to which a CPU step runs the native kernel: NATIVE_TOKENS_PER_SLOT for each
# slot the step uses, at most NATIVE_MAX_TOKENS. Past them, one slot's oneDNN GEMM wins, or the
# torch path's slot-by-slot GEMMs do for a step that large. Measured in process on a 2-core EPYC
# (bench/profile_lora.py --prefill, LoRA terms of a prefill step, SmolLM2 shape, bf16, rank 16):
# 15 prompts of 128 tokens over 4 adapters 72 ms in the kernel against 168 ms by slot in torch;
# over 15 adapters 74 ms against 248 ms; on one adapter 80 ms against the single GEMM's 57-60 ms;
# 4 prompts on one adapter 16 ms against ~24. (Before the kernel kept its register tiles in
# registers, the caps were 128 and 512: a 2-vCPU Xeon's 1 slot 256 tokens 167 us a term
# against oneDNN's 126.)
NATIVE_TOKENS_PER_SLOT = 512
NATIVE_MAX_TOKENS = 4096
# Adapter tokens up to which a bf16 linear on the AMX tile kernel adds its terms in the same call
# (lora_amx.py): the sizes that kernel was measured at (decode steps and prompt chunks).
TILE_MAX_TOKENS = 512
# Tokens x slots up to which a step over several slots takes the dense shape: it computes every
# slot it uses for every token (T * U * rank per layer), which beats a handful of calls per
# slot only while that is small (measured on a 2-core EPYC: 16-row decode steps over 4-16 slots).
DENSE_MAX_CELLS = 1024
# Steps a slot set serves on plain weights before its packed copies are made (see _Packed).
PACK_AFTER_USES = 16
# A half-precision term of at most this many FLOPs (shrink and expand, 2 T R (K + N)) runs as
# two fp32 MKL GEMMs on fp32 copies of the slots: ~8 us a call hot against ~17-20 us for
# oneDNN's bf16 ones, whose fixed cost dominates at a decode step's size. In a 16-row decode
# step of the SmolLM2 shape (rank 16, 2-vCPU Xeon with AMX; bench/profile_lora.py) this cut the
# LoRA terms from 11.3 to 8.6 ms with one adapter, and left them as they were with 4 or 16
# (which a 10 MFLOP limit made slower: the fp32 copies are twice the bytes to read). fp32 is
# also the more exact: the term is rounded once, into the output.
FP32_MAX_FLOPS = 4_000_000


@dataclass
class LoraStep:
    """What every LoRA term needs to know: each slot's scaling, and the current step's tokens."""

    scaling: torch.Tensor  # [S] fp32 on the device (the kernels read it there)
    scaling_host: list[float]  # the same, for the torch path's per-slot calls
    triton: bool = False  # the Triton shrink/expand kernels (CUDA, or interpreted in tests)
    # the native CPU kernel (shard/platforms/cpu/native/build.py)
    native: Callable[..., None] | None = None
    dtype: torch.dtype = torch.float32  # the LoRA weights' (the model's): the dense mask's too
    token_slots: torch.Tensor | None = None  # [T] int32, -1: no adapter
    # The native kernel: the adapter tokens grouped by slot (order [U] int64) and each group's
    # (slot, begin, end) in order (segments [G, 3] int64).
    order: torch.Tensor | None = None
    segments: torch.Tensor | None = None
    adapter_tokens: int = 0  # the step's tokens that use an adapter (len(order) where set)
    # The torch path, dense shape: the slots the step uses (`dense_slots`, ascending) and mask
    # [T, len(dense_slots)] holding scaling[s] where token t uses the j-th of them, else 0.
    dense_slots: tuple[int, ...] | None = None
    mask: torch.Tensor | None = None
    mask32: torch.Tensor | None = None  # the same in fp32, for the fp32 GEMMs
    # The torch path, grouped shape: (slot, indices of its tokens), one entry per slot used.
    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    # The Triton path: the step's tokens grouped by slot into tiles, built by the first layer
    # that needs them (`slot_tiles`) and shared by the others. Not before: a decode step that
    # a CUDA graph replays computes them inside the graph, and would waste an eager copy.
    tiles: object | None = None

    def set_scaling(self, slot: int, value: float) -> None:
        self.scaling[slot] = value
        self.scaling_host[slot] = value

    def slot_tiles(self) -> object:
        """The Triton kernels' tiles of this step's tokens (token_slots set), built once."""
        if self.tiles is None:
            from shard.platforms.cuda.kernels.lora_tiles import default_block_m, slot_tiles

            assert self.token_slots is not None, "no adapter token this step"
            slots = self.token_slots.int()
            self.tiles = slot_tiles(slots, len(self.scaling_host), default_block_m(len(slots)))
        return self.tiles

    def set_tokens(self, token_slots: torch.Tensor | None) -> None:
        self.token_slots = token_slots
        self.groups, self.tiles, self.dense_slots = [], None, None
        self.mask = self.mask32 = self.order = self.segments = None
        self.adapter_tokens = 0
        if token_slots is None:
            return  # base model only: the terms skip themselves
        if self.triton:
            # Tiles on first use (slot_tiles); base-model tokens are skipped there. Not asking
            # the device whether any token uses an adapter: the runner passes None when none
            # does (the host knows, shard/step_inputs.py).
            return
        if not bool((token_slots >= 0).any()):
            self.token_slots = None
            return
        rows = (token_slots >= 0).nonzero().squeeze(1)
        slots = token_slots[rows].long()
        self.adapter_tokens = len(rows)
        in_order, by_slot = torch.sort(slots, stable=True)
        used, counts = torch.unique_consecutive(in_order, return_counts=True)
        ends = counts.cumsum(0)
        if self.native is not None and len(rows) <= min(
            NATIVE_MAX_TOKENS, NATIVE_TOKENS_PER_SLOT * len(used)
        ):
            self.order = rows[by_slot].contiguous()
            self.segments = torch.stack([used, ends - counts, ends], dim=1).contiguous()
            return
        if len(used) == 1 or len(token_slots) * len(used) <= DENSE_MAX_CELLS:
            column = torch.full(
                (len(self.scaling_host),), -1, dtype=torch.long, device=slots.device
            )
            column[used] = torch.arange(len(used), device=slots.device)
            mask = torch.zeros(len(token_slots), len(used), device=token_slots.device)
            mask[rows, column[slots]] = self.scaling.to(token_slots.device)[slots]
            self.dense_slots, self.mask = tuple(used.tolist()), mask.to(self.dtype)
            self.mask32 = mask
            return
        for slot in used.tolist():
            self.groups.append((slot, (token_slots == slot).nonzero().squeeze(1)))


class LoraTerm(nn.Module):
    def __init__(
        self,
        step: LoraStep,
        *,
        num_slots: int,
        max_rank: int,
        in_features: int,
        out_slices: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.step = step
        self.out_slices = out_slices
        n_sub = len(out_slices)
        a_shape = (num_slots, n_sub, max_rank, in_features)
        b_shape = (num_slots, sum(out_slices), max_rank)
        self.register_buffer("lora_a", torch.zeros(a_shape, dtype=dtype, device=device))
        self.register_buffer("lora_b", torch.zeros(b_shape, dtype=dtype, device=device))
        # Each slot's rank here (largest over sub-modules; 0: the adapter leaves this layer
        # alone). Columns past it are zero padding up to --max-lora-rank, so the torch path
        # multiplies only the first `rank` columns: 4x less work for rank 16 under the default 64.
        self.ranks = [0] * num_slots
        # The platform's kernels: the GEMM layout of the packed copies, the tile kernel.
        self.ops = platform_of(device)
        self._packed: _Packed | None = None  # the dense path's copies (CPU), built on first use
        # The tile kernel's copies (the CPU's: shard/platforms/cpu/lora_amx.py), built on first
        # use, and its call for the weight `_tile_base` (None: that weight is not the kernel's).
        self._tiles: Any = None
        self._tile_base: torch.Tensor | None = None
        self._tile_kernel: Callable[..., torch.Tensor] | None = None
        # --compile calls this term through an opaque op that names it by this id
        # (shard/platforms/cpu/compiled.py): the slots and the step's mapping stay outside the
        # graph.
        self.term_id = register_lora_term(self)

    def fill(self, slot: int, parts: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Slot `slot` of every sub-module: (A [r, K], B [n_j, r]) already cut to this rank's
        slice, or None for a sub-module the adapter leaves alone (zeros: no term)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        self.ranks[slot] = max((part[0].shape[0] for part in parts if part is not None), default=0)
        offset = 0
        for j, (size, part) in enumerate(zip(self.out_slices, parts, strict=True)):
            if part is not None:
                a, b = part
                rank = a.shape[0]
                self.lora_a[slot, j, :rank].copy_(a)
                self.lora_b[slot, offset : offset + size, :rank].copy_(b)
            offset += size
        packed = self._packed
        if packed is not None and self.ranks[slot] <= packed.rank:
            # Adapters come and go one slot at a time: rewrite that slot's rows in place
            # rather than rebuild every slot (a rebuild of all ~200 terms costs ~30 ms). The
            # copy was made by a step, under inference mode, and may only be written there.
            with torch.inference_mode():
                packed.refill(slot, self.lora_a, self.lora_b, self.out_slices)
        else:
            self._packed = None  # rebuilt on first use, cut to the new largest rank
        tiles = self._tiles
        if tiles is not None and self.ranks[slot] <= tiles.rank:
            with torch.inference_mode():  # likewise
                tiles.refill(slot, self.lora_a, self.lora_b)
        else:
            self._tiles = None

    def adds_to_product(self) -> bool:
        """Whether forward adds anything to this step's product: some token uses an adapter, or
        a traced graph (which must keep the term for the steps that will)."""
        return torch.compiler.is_compiling() or self.step.token_slots is not None

    def linear(
        self,
        weight: LinearWeight,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        gated: str | None = None,
    ) -> torch.Tensor:
        """weight(x, bias) plus this step's LoRA terms (with `gated`, an activation name,
        act(gate) * up of that): in one call of the tile kernel where the weight is its and the
        step small (lora_amx.py; its epilogue fuses SwiGLU only), else the base product and
        then `forward`."""
        fused = gated == SILU
        y = self._tile_product(weight, x, bias, fused)
        if y is None:
            y = weight(x, bias)
            self(x, y)
            fused = False
        return act_and_mul(y, gated) if gated is not None and not fused else y

    def _tile_product(
        self, weight: LinearWeight, x: torch.Tensor, bias: torch.Tensor | None, gated: bool
    ) -> torch.Tensor | None:
        if torch.compiler.is_compiling():  # first: nothing below may become a graph guard
            return None
        step = self.step
        if step.segments is None or not isinstance(weight, DenseWeight):
            return None  # no adapter token, a large step, or not a plain weight
        if step.adapter_tokens > TILE_MAX_TOKENS:
            return None  # a prompt's worth: measured at decode and chunk sizes only
        if weight.weight is not self._tile_base:  # checked once per weight, not per call
            self._tile_base = weight.weight
            self._tile_kernel = self.ops.lora_tile_kernel(weight.weight, self.out_slices)
        if self._tile_kernel is None:
            return None
        tiles = self._tiles
        if tiles is None:
            rank = max(self.ranks, default=0)
            if rank == 0:  # no adapter touches this layer
                return None
            tiles = self._tiles = self.ops.lora_tiles(self.lora_a, self.lora_b, rank)
        if x.dim() != 2 or x.stride(1) != 1:  # (kernel_for: every sub-module whole 16-blocks)
            return None
        return self._tile_kernel(  # type: ignore[no-any-return]
            x, weight.weight, bias, gated, tiles.a, tiles.b, step.token_slots, step.scaling,
            tiles.rank, self.out_slices,
        )  # fmt: skip

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Adds the step's LoRA terms to y [T, N] in place; x [T, K]."""
        if torch.compiler.is_compiling():  # first: nothing below may become a graph guard
            lora_in_graph(x, y, self.term_id)
            return
        if self.step.token_slots is None:
            return
        step = self.step
        if step.triton:
            from shard.platforms.cuda.kernels.lora_expand import lora_expand
            from shard.platforms.cuda.kernels.lora_shrink import lora_shrink

            slots = step.token_slots.int()
            tiles = step.slot_tiles()
            h = lora_shrink(x, self.lora_a, slots, tiles=tiles)
            lora_expand(h, self.lora_b, slots, step.scaling, self.out_slices, y, tiles=tiles)
            return
        packed = self._packed
        if packed is None:  # first use since a slot was filled
            packed = self._packed = _Packed.build(
                self.lora_a, self.lora_b, self.out_slices, self.ranks, self.ops
            )
        if packed.rank == 0:  # no adapter touches this layer
            return
        if step.segments is not None:
            # The kernel reads and writes rows whose values are contiguous (any row stride).
            out = y if y.stride(-1) == 1 else y.contiguous()
            step.native(  # type: ignore[misc]
                x if x.stride(-1) == 1 else x.contiguous(), out, packed.a,
                packed.chunked_b(self.out_slices), step.order, step.segments, step.scaling,
                packed.rank, self.out_slices,
            )  # fmt: skip
            if out is not y:
                y.copy_(out)
            return
        if step.mask is not None:
            self._add(packed.select(step.dense_slots), x, y, step.mask, step.mask32)
            return
        for slot, rows in step.groups:
            xs = x.index_select(0, rows)
            delta = y.new_zeros(len(rows), y.shape[1])
            scale32 = torch.full((len(rows), 1), self.step.scaling_host[slot], device=x.device)
            self._add(packed.select((slot,)), xs, delta, scale32.to(x.dtype), scale32)
            y.index_add_(0, rows, delta)

    def _add(
        self,
        packed: _Packed,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        mask32: torch.Tensor,
    ) -> None:
        """y += the LoRA terms of every slot in `packed` for every row of x, each weighted by its
        column of mask [T, slots] (a row's scaling on its own slot, zero elsewhere; mask32 the
        same in fp32): one shrink GEMM, one scale, one expand GEMM into the whole of y, however
        many sub-modules; in fp32 for a small half-precision term (FP32_MAX_FLOPS)."""
        rows, flops = len(x), 2 * len(x) * packed.a.shape[0] * (x.shape[1] + y.shape[1])
        if x.dtype != torch.float32 and flops <= FP32_MAX_FLOPS:
            h = torch.mm(x.float(), packed.a32_t)  # [T, slots * n_sub * r]
            h.view(rows, mask32.shape[1], -1).mul_(mask32.view(rows, -1, 1))
            y.add_(torch.mm(h, packed.b32))  # rounded once, into y's dtype
            return
        packed.uses += 1
        plain = packed.uses <= PACK_AFTER_USES  # a subset that may not last: plain GEMMs
        linear = self.ops.linear
        h = F.linear(x, packed.a) if plain else linear(x, packed.a_mm)  # [T, slots * n_sub * r]
        h.view(rows, mask.shape[1], -1).mul_(mask.view(rows, -1, 1))
        if plain:
            y.addmm_(h, packed.b)  # expand
        else:
            y.add_(linear(h, packed.b_mm))


@dataclass
class _Packed:
    """A LoRA term's slots for the torch path, cut to the largest rank in use r, each slot one
    contiguous block of rows, in the same order in both:
        a  [S * n_sub * r, K]   slot s, sub-module j: rows (s * n_sub + j) * r ...
        b  [S * n_sub * r, N]   the same rows hold B_j^T in sub-module j's output columns and
                                zeros in the others', so one GEMM expands every sub-module into
                                the fused output (the zeros cost FLOPs a CPU has to spare at
                                these sizes; a call per sub-module and its strided output cost
                                more)
    `select` gives the same for a subset of the slots (views when they are consecutive, else a
    compact copy), built once and kept while steps keep using that subset (a slot's fill drops
    them all with the packed copy). `a_mm` and `b_mm` are the two in the layout the CPU GEMM
    reads fastest (shard/platforms/cpu/matmul.py): 20-35% less time per term than F.linear and addmm
    on the plain ones (measured at decode shapes, 1-12 slots), but packing a term's pair costs
    as much as ~15 such calls, so a subset is packed only once it has served PACK_AFTER_USES
    steps: with many adapters the subset a step uses changes every few steps."""

    a: torch.Tensor
    b: torch.Tensor
    rank: int
    n_sub: int
    ops: Platform  # whose layout a_mm and b_mm take
    subsets: dict[tuple[int, ...], _Packed] = field(default_factory=dict, repr=False)
    uses: int = 0  # steps this slot set has served (per term)
    # b in the native kernel's layout (lora_chunks.py), made by its first step.
    chunked: ChunkedB | None = field(default=None, repr=False)

    def chunked_b(self, out_slices: tuple[int, ...]) -> torch.Tensor:
        if self.chunked is None:
            self.chunked = ChunkedB(self.b, out_slices, self.rank)
        return self.chunked.values

    @cached_property
    def a32_t(self) -> torch.Tensor:  # [K, S * n_sub * r] fp32: the shrink as torch.mm reads it
        return self.a.float().t().contiguous()

    @cached_property
    def b32(self) -> torch.Tensor:
        return self.b.float()

    @cached_property
    def a_mm(self) -> torch.Tensor:
        return self.ops.prepare_weight(self.a)

    @cached_property
    def b_mm(self) -> torch.Tensor:  # [N, S * n_sub * r]: the expand as a linear
        return self.ops.prepare_weight(self.b.t().contiguous())

    @staticmethod
    def build(
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        out_slices: tuple[int, ...],
        ranks: list[int],
        ops: Platform,
    ) -> _Packed:
        rank = max(ranks, default=0)
        a, b = _slot_rows(lora_a, lora_b, out_slices, rank)
        return _Packed(a, b, rank, lora_a.shape[1], ops)

    def refill(
        self,
        slot: int,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        out_slices: tuple[int, ...],
    ) -> None:
        """Slot `slot`'s rows again from the term's buffers (its rank fits this copy's)."""
        rows = slice(slot * self.n_sub * self.rank, (slot + 1) * self.n_sub * self.rank)
        one = slice(slot, slot + 1)
        self.a[rows], self.b[rows] = _slot_rows(lora_a[one], lora_b[one], out_slices, self.rank)
        if self.chunked is not None:
            self.chunked.refill(slot, self.b[rows])
        # Steps only ever multiply subsets (`select`), which may be copies or packed copies
        # that never see the rows change: drop them all.
        self.subsets.clear()

    def select(self, slots: tuple[int, ...]) -> _Packed:
        if slots not in self.subsets:  # once per subset, not once per layer call
            if len(self.subsets) >= 4:  # the step's subset changes rarely: keep a few
                self.subsets.clear()
            self.subsets[slots] = self._cut(slots)
        return self.subsets[slots]

    def _cut(self, slots: tuple[int, ...]) -> _Packed:
        lo, hi, rows = slots[0], slots[-1], self.n_sub * self.rank  # rows per slot
        if hi - lo + 1 == len(slots):  # consecutive: views
            return _Packed(
                self.a[lo * rows : (hi + 1) * rows],
                self.b[lo * rows : (hi + 1) * rows],
                self.rank,
                self.n_sub,
                self.ops,
            )
        index = torch.cat([torch.arange(s * rows, (s + 1) * rows) for s in slots])
        index = index.to(self.a.device)
        return _Packed(
            self.a.index_select(0, index),
            self.b.index_select(0, index),
            self.rank,
            self.n_sub,
            self.ops,
        )


def _slot_rows(
    lora_a: torch.Tensor, lora_b: torch.Tensor, out_slices: tuple[int, ...], rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `_Packed` rows (a, b) of the slots in lora_a [S, n_sub, R, K] / lora_b [S, N, R],
    cut to `rank`: each sub-module's B^T in its own output columns, zeros elsewhere."""
    num_slots, n_sub, _, in_features = lora_a.shape
    a = lora_a[:, :, :rank].reshape(num_slots * n_sub * rank, in_features).contiguous()
    b = lora_b.new_zeros(num_slots, n_sub, rank, lora_b.shape[1])
    offset = 0
    for j, size in enumerate(out_slices):  # [S, n_j, r] -> [S, r, n_j]
        b[:, j, :, offset : offset + size] = lora_b[:, offset : offset + size, :rank].transpose(
            1, 2
        )
        offset += size
    return a, b.view(num_slots * n_sub * rank, lora_b.shape[1])
