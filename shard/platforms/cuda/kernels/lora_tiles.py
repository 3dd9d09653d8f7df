"""The tokens of a step grouped by adapter slot and cut into tiles, for the LoRA kernels
(`lora_shrink.py`, `lora_expand.py`).

Both kernels run one program per (tile, ...), where a tile is up to `block_m` tokens that use
the same slot: the program loads that slot's A or B tile once for all of them. Tokens are
grouped by a stable sort of `token_slots`, so a slot's tokens share tiles wherever they sit in
the batch (a prefill chunk, or decode tokens of many requests of one adapter), not only when
they are consecutive as in punica's SGMV segments. Tokens without an adapter (-1) are a group
of their own: the shrink writes zeros for them, the expand skips them.

Everything is computed with a few tiny torch ops on the device, with fixed shapes bounded from
T, S and block_m alone: no device-to-host sync, and the kernels' grids are known on the host
(CUDA-graph friendly). A tile past the real count is empty (begin == end) and its programs
return at once. Build it once per step: every LoRA layer of the step can share it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shard.platforms.cuda.kernels import interpreting

# Up to this many tokens a step is decode-like: few tokens per slot, so 16-token tiles (tl.dot's
# minimum) waste least; above it, 64-token tiles read each A/B tile a quarter as often.
DECODE_MAX_TOKENS = 256


def default_block_m(num_tokens: int) -> int:
    if interpreting() or num_tokens <= DECODE_MAX_TOKENS:
        return 16
    return 64


@dataclass(frozen=True)
class SlotTiles:
    order: torch.Tensor  # int32 [T]: token indices, sorted by slot (stable)
    tile_slot: torch.Tensor  # int32 [max_tiles]: the slot of the tile's tokens (-1: none)
    tile_begin: torch.Tensor  # int32 [max_tiles]: the tile's first position in `order`
    tile_end: torch.Tensor  # int32 [max_tiles]: the end of its group in `order` (exclusive)
    block_m: int

    @property
    def max_tiles(self) -> int:
        return self.tile_slot.shape[0]


def max_tiles(num_tokens: int, num_slots: int, block_m: int) -> int:
    """An upper bound on the tiles of any assignment of T tokens to S slots and -1: the sum of
    ceil(count_g / block_m) over the at most min(S + 1, T) non-empty groups."""
    groups = min(num_slots + 1, num_tokens)
    return (num_tokens + groups * (block_m - 1)) // block_m


def slot_tiles(token_slots: torch.Tensor, num_slots: int, block_m: int) -> SlotTiles:
    """token_slots int [T] with values in -1 .. num_slots - 1 (not checked: that would sync)."""
    device = token_slots.device
    slots = token_slots.to(torch.int64)
    sorted_slots, order = torch.sort(slots, stable=True)
    groups = torch.arange(-1, num_slots, device=device)  # group g holds slot g - 1
    g_begin = torch.searchsorted(sorted_slots, groups)
    g_end = torch.searchsorted(sorted_slots, groups, right=True)
    g_tiles = (g_end - g_begin + block_m - 1) // block_m
    g_last = torch.cumsum(g_tiles, 0)  # tiles of groups 0..g
    tiles = torch.arange(max_tiles(slots.shape[0], num_slots, block_m), device=device)
    g = torch.searchsorted(g_last, tiles, right=True)  # == S + 1 past the last real tile
    real = g <= num_slots
    g = g.clamp(max=num_slots)
    begin = g_begin[g] + (tiles - (g_last[g] - g_tiles[g])) * block_m
    end = torch.where(real, g_end[g], begin)
    return SlotTiles(
        order=order.to(torch.int32),
        tile_slot=(g - 1).to(torch.int32),
        tile_begin=begin.to(torch.int32),
        tile_end=end.to(torch.int32),
        block_m=block_m,
    )
