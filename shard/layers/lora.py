"""The LoRA term of a tensor-parallel linear: y += scaling[s] * (x @ A_s^T) @ B_s^T, where s is
the device slot of each token's adapter (-1: none).

Every LoRA-capable TP linear holds one `LoraTerm` with its slots' weights, padded to the
maximum rank, for its `n_sub` sub-modules (3 for fused q/k/v, 2 for gate/up, else 1):
    lora_a [S, n_sub, R, K]   K: this rank's input features
    lora_b [S, N, R]          N: this rank's output features; output slice j (out_slices) uses
                              sub-module j's rank columns
Tensor parallelism follows the base weight (seed 000): a column layer keeps A whole and holds
its rows of B, a row layer holds its columns of A and keeps B whole; each rank's partial
product then enters the row layer's existing all-reduce, so LoRA adds no collective.

Which token uses which slot is per step: the runner sets it once on the shared `LoraStep`
(built from the batch), and every term reads it there, so model files pass nothing new.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class LoraStep:
    """What every LoRA term needs to know: each slot's scaling, and the current step's tokens."""

    scaling: torch.Tensor  # [S] fp32 on the device (the kernels read it there)
    scaling_host: list[float]  # the same, for the torch path's per-slot calls
    triton: bool = False  # the Triton shrink/expand kernels (CUDA, or interpreted in tests)
    token_slots: torch.Tensor | None = None  # [T] int32, -1: no adapter
    # The torch path: (slot, indices of its tokens), one entry per slot the step uses.
    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    # The Triton path: the step's tokens grouped by slot into tiles, built once for all layers.
    tiles: object | None = None

    def set_scaling(self, slot: int, value: float) -> None:
        self.scaling[slot] = value
        self.scaling_host[slot] = value

    def set_tokens(self, token_slots: torch.Tensor | None) -> None:
        self.token_slots = token_slots
        self.groups, self.tiles = [], None
        if token_slots is None or not bool((token_slots >= 0).any()):
            self.token_slots = None  # base model only: the terms skip themselves
            return
        if self.triton:
            from shard.kernels.lora_tiles import default_block_m, slot_tiles

            block_m = default_block_m(len(token_slots))
            self.tiles = slot_tiles(token_slots.int(), len(self.scaling_host), block_m)
            return
        for slot in torch.unique(token_slots[token_slots >= 0]).tolist():
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

    def fill(self, slot: int, parts: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Slot `slot` of every sub-module: (A [r, K], B [n_j, r]) already cut to this rank's
        slice, or None for a sub-module the adapter leaves alone (zeros: no term)."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        offset = 0
        for j, (size, part) in enumerate(zip(self.out_slices, parts, strict=True)):
            if part is not None:
                a, b = part
                rank = a.shape[0]
                self.lora_a[slot, j, :rank].copy_(a)
                self.lora_b[slot, offset : offset + size, :rank].copy_(b)
            offset += size

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Adds the step's LoRA terms to y [T, N] in place; x [T, K]."""
        if self.step.token_slots is None:
            return
        step = self.step
        if step.triton:
            from shard.kernels.lora_expand import lora_expand
            from shard.kernels.lora_shrink import lora_shrink

            slots = step.token_slots.int()
            h = lora_shrink(x, self.lora_a, slots, tiles=step.tiles)
            lora_expand(h, self.lora_b, slots, step.scaling, self.out_slices, y, tiles=step.tiles)
            return
        for slot, rows in self.step.groups:
            xs = x.index_select(0, rows)
            h = torch.einsum("tk,jrk->tjr", xs, self.lora_a[slot])  # shrink: [t, n_sub, R]
            outs = [
                h[:, j] @ b.T
                for j, b in enumerate(self.lora_b[slot].split(list(self.out_slices), dim=0))
            ]
            delta = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
            y.index_add_(0, rows, delta.to(y.dtype), alpha=self.step.scaling_host[slot])
