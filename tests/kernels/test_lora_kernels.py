"""LoRA shrink/expand kernels against a float64 reference computed with plain loops over tokens.

Adapters are random with true ranks below the max rank R (zero-padded, as the slots hold them),
sized so that h and the LoRA term are O(1); y ends up with |y| up to ~10. The reference uses the
very same (already rounded) inputs. "Seen" is the largest |error| / (atol + rtol |ref|) over the
mixed-slot and prefill tests in the interpreter.

Tolerances (atol = rtol):
  h, every dtype, 1e-5: products of fp16/bf16/fp32 inputs are exact in fp32 (ieee dots for fp32),
      only the fp32 accumulation order differs from the reference.
  y fp32 1e-5: ieee dots, one fp32 add (h and y fp32 together seen at 5% of the bound).
  y fp16 2e-3: y + term is rounded once to fp16 (half an ulp: 2^-11 relative); on a GPU the
      TF32 expand also rounds h to 2^-11 relative, on the LoRA term alone (seen: 19%).
  y bf16 2e-2: the same with bf16's 2^-8; in triton's interpreter fp32 -> bf16 conversions
      truncate (a whole ulp, 2^-7, biased), still well inside the bound (seen: 31%).
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE

from shard.platforms.cuda.kernels.lora_expand import ExpandConfig, lora_expand
from shard.platforms.cuda.kernels.lora_shrink import ShrinkConfig, lora_shrink
from shard.platforms.cuda.kernels.lora_tiles import max_tiles, slot_tiles

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
H_TOL = dict(atol=1e-5, rtol=1e-5)
Y_TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def adapters(
    slots: int, k: int, out_slices: tuple[int, ...], rank: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lora_a [S, n_sub, R, K], lora_b [S, N, R], scaling [S]; slot s has true rank
    rank - 3 s (at least 1), zero-padded to R in both A and B."""
    gen = torch.Generator().manual_seed(seed)
    n_sub, n = len(out_slices), sum(out_slices)
    a = torch.randn(slots, n_sub, rank, k, generator=gen) / k**0.5
    b = torch.randn(slots, n, rank, generator=gen) / rank**0.5
    for s in range(slots):
        true_rank = max(1, rank - 3 * s)
        a[s, :, true_rank:] = 0
        b[s, :, true_rank:] = 0
    scaling = torch.rand(slots, generator=gen) + 0.5
    return a.to(dtype), b.to(dtype), scaling


def reference(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scaling: torch.Tensor,
    token_slots: torch.Tensor,
    out_slices: tuple[int, ...],
    y: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y + LoRA term) in float64, one token and one sub-module at a time."""
    n_sub, rank = a.shape[1], a.shape[2]
    h = torch.zeros(x.shape[0], n_sub, rank, dtype=torch.float64)
    out = y.double().clone()
    for t, s in enumerate(token_slots.tolist()):
        if s < 0:
            continue
        start = 0
        for j, size in enumerate(out_slices):
            h[t, j] = a[s, j].double() @ x[t].double()
            out[t, start : start + size] += (
                scaling[s].double() * b[s, start : start + size].double() @ h[t, j]
            )
            start += size
    return h, out


def check(
    token_slots: list[int],
    k: int,
    out_slices: tuple[int, ...],
    rank: int,
    dtype: torch.dtype,
    *,
    num_slots: int = 4,
    seed: int = 0,
    shrink_config: ShrinkConfig | None = None,
    expand_config: ExpandConfig | None = None,
    x_view: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs both kernels on DEVICE and checks them against the reference; returns (h, y)."""
    gen = torch.Generator().manual_seed(seed + 1)
    t = len(token_slots)
    a, b, scaling = adapters(num_slots, k, out_slices, rank, dtype, seed)
    x = torch.randn(t, k, generator=gen).to(dtype)
    y0 = (torch.randn(t, sum(out_slices), generator=gen) * 2).to(dtype)
    slots = torch.tensor(token_slots, dtype=torch.int32)
    h_ref, y_ref = reference(x, a, b, scaling, slots, out_slices, y0)

    x_dev = x.to(DEVICE)
    if x_view:  # a column slice of a wider tensor: row stride != K
        x_dev = torch.zeros(t, k + 5, dtype=dtype, device=DEVICE)[:, 3 : 3 + k]
        x_dev.copy_(x)
    slots_dev = slots.to(DEVICE)
    h = lora_shrink(x_dev, a.to(DEVICE), slots_dev, config=shrink_config)
    assert h.shape == (t, len(out_slices), rank) and h.dtype == torch.float32
    torch.testing.assert_close(h.cpu().double(), h_ref, **H_TOL)
    no_adapter = slots < 0
    assert (h.cpu()[no_adapter] == 0).all()  # exactly zero, not just small

    y = y0.to(DEVICE)
    lora_expand(h, b.to(DEVICE), slots_dev, scaling.to(DEVICE), out_slices, y, config=expand_config)
    assert y.dtype == dtype
    torch.testing.assert_close(y.cpu().double(), y_ref, **Y_TOL[dtype])
    assert torch.equal(y.cpu()[no_adapter], y0[no_adapter])  # left alone, bit for bit
    return h.cpu(), y.cpu()


def mixed_slots(t: int, num_slots: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randint(-1, num_slots, (t,), generator=gen).tolist()
    slots[0] = -1  # at least one token without an adapter
    return slots


# (out_slices, rank, K): n_sub 1, 2 and 3 with unequal slices off the 16-wide N tile, ranks off
# and on the 16-wide rank tile, K off the 32-wide K tile (and on it for the unmasked loop).
LAYERS = (
    ((45,), 8, 70),
    ((33, 20), 16, 64),
    ((40, 9, 23), 12, 100),
)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layer", LAYERS, ids=lambda c: f"slices{c[0]}-r{c[1]}-k{c[2]}")
def test_mixed_slots_odd_token_count(dtype, layer):
    out_slices, rank, k = layer
    check(mixed_slots(37, 4, seed=k), k, out_slices, rank, dtype, seed=k)


@pytest.mark.parametrize("slot", (-1, 0, 2))
def test_one_token(slot):
    check([slot], 70, (40, 9, 23), 12, torch.float16)


def test_prefill_segments_and_decode_tokens():
    # A prefill-like step: long same-slot runs (several 16-token tiles each, a run of -1, one
    # slot's tokens in two runs that end up in shared tiles), then decode tokens of mixed slots.
    slots = [2] * 70 + [-1] * 9 + [0] * 50 + [2] * 21 + [3, 1, -1, 2, 0, 3, 3]
    check(slots, 96, (48, 16, 16), 16, torch.bfloat16)


def test_all_tokens_without_adapter():
    check([-1] * 5, 40, (20, 12), 8, torch.float32)


def test_rank_past_one_rank_tile():
    # Rank 40 is two 32-wide rank tiles in the interpreter's expand config, the last one masked.
    check(mixed_slots(9, 3, seed=1), 48, (30, 18), 40, torch.float16, num_slots=3)


@pytest.mark.parametrize("split_k", (2, 3, 8))
def test_split_k(split_k):
    # K = 100 is 4 tiles of 32: 3 splits round to 2 of 2 tiles, 8 to one per tile.
    cfg = ShrinkConfig(block_q=16, block_k=32, num_warps=1, num_stages=1, split_k=split_k)
    check(mixed_slots(21, 4, seed=2), 100, (40, 9, 23), 12, torch.float16, shrink_config=cfg)


def test_strided_x_and_wide_q_tiles():
    # x a column slice of a wider tensor; the fused A (3 x 12 = 36 rows) in 16-row tiles.
    cfg = ShrinkConfig(block_q=16, block_k=32, num_warps=1, num_stages=1)
    check(
        mixed_slots(19, 4, seed=3), 70, (40, 9, 23), 12, torch.float32,
        shrink_config=cfg, x_view=True,
    )  # fmt: skip


def test_deterministic():
    slots = mixed_slots(30, 4, seed=4)
    cfg = ShrinkConfig(block_q=64, block_k=32, num_warps=1, num_stages=1, split_k=3)
    first = check(slots, 100, (33, 20), 16, torch.bfloat16, shrink_config=cfg)
    second = check(slots, 100, (33, 20), 16, torch.bfloat16, shrink_config=cfg)
    assert all(torch.equal(f, s) for f, s in zip(first, second, strict=True))


@pytest.mark.parametrize("block_m", (1, 4, 16))
def test_slot_tiles_cover_every_token_once(block_m):
    gen = torch.Generator().manual_seed(block_m)
    num_slots = 5
    for t in (0, 1, 7, 40):
        slots = torch.randint(-1, num_slots, (t,), generator=gen, dtype=torch.int32)
        tiles = slot_tiles(slots.to(DEVICE), num_slots, block_m)
        assert tiles.max_tiles == max_tiles(t, num_slots, block_m)
        order = tiles.order.cpu().tolist()
        seen = []
        for slot, begin, end in zip(
            tiles.tile_slot.tolist(), tiles.tile_begin.tolist(), tiles.tile_end.tolist(),
            strict=True,
        ):  # fmt: skip
            tokens = order[begin : min(begin + block_m, end)]
            assert all(slots[i] == slot for i in tokens)
            seen += tokens
        assert sorted(seen) == list(range(t))
        # The tiles the kernels run: one per started block of each group, none left over.
        counts = torch.bincount(slots.long() + 1, minlength=num_slots + 1)
        real = sum(-(-int(c) // block_m) for c in counts)
        assert sum(e > b for b, e in zip(tiles.tile_begin, tiles.tile_end, strict=True)) == real


def test_max_tiles_is_reached():
    # Worst case: every group one token past a whole number of tiles.
    slots = torch.tensor([s for s in range(-1, 3) for _ in range(5)], dtype=torch.int32)
    tiles = slot_tiles(slots, 3, 4)
    assert (tiles.tile_end > tiles.tile_begin).sum() == tiles.max_tiles == 8


def test_shape_errors():
    x = torch.zeros(3, 8, device=DEVICE)
    a = torch.zeros(2, 1, 4, 8, device=DEVICE)
    slots = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="lora_a"):
        lora_shrink(x, a.half(), slots)
    with pytest.raises(ValueError, match="token_slots"):
        lora_shrink(x, a, slots[:2])
    h = lora_shrink(x, a, slots)
    b = torch.zeros(2, 6, 4, device=DEVICE)
    scaling = torch.ones(2, device=DEVICE)
    y = torch.zeros(3, 6, device=DEVICE)
    with pytest.raises(ValueError, match="out_slices"):
        lora_expand(h, b, slots, scaling, (5,), y)
    with pytest.raises(ValueError, match="h "):
        lora_expand(h, b, slots, scaling, (3, 3), y)
    with pytest.raises(ValueError, match="scaling"):
        lora_expand(h, b, slots, scaling.double(), (6,), y)
