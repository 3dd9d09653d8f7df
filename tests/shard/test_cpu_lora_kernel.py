"""The native CPU LoRA kernel (shard/platforms/cpu/native/lora.cpp) called directly, against a
float64 reference: every dtype, widths on and off its 16-lane vectors and 64-column tiles, slots
with 1 to 70 tokens (its 4-token tiles, its 16- and 64-token blocks and their tails), strided rows,
tokens left alone, both of its schedules (many slots: whole slots a thread; few: rows split
over the threads) on one, two and four threads; and its refusals of a bad plan, which leave y
untouched."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from shard.layers.lora_chunks import ChunkedB, chunk_rows
from shard.platforms.cpu.native.build import (
    BF16_DOTS_ENV,
    has_bf16_dots,
    lora_kernel,
    unavailable_reason,
)

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(
    REASON is not None, reason=f"the native kernels cannot be built here: {REASON}"
)


def plan(token_slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """order and segments as LoraStep builds them: tokens grouped by slot, ascending."""
    order, segments = [], []
    for slot in sorted({s for s in token_slots if s >= 0}):
        begin = len(order)
        order += [t for t, s in enumerate(token_slots) if s == slot]
        segments.append([slot, begin, len(order)])
    return torch.tensor(order, dtype=torch.long), torch.tensor(segments, dtype=torch.long).view(
        -1, 3
    )


def reference(x, y, a, b, token_slots, scaling, rank, out_slices):
    out = y.double().clone()
    n_sub = len(out_slices)
    for t, s in enumerate(token_slots):
        if s < 0:
            continue
        offset = 0
        for j, n in enumerate(out_slices):
            rows = slice((s * n_sub + j) * rank, (s * n_sub + j + 1) * rank)
            h = a[rows].double() @ x[t].double()
            out[t, offset : offset + n] += scaling[s].item() * (
                h @ b[rows, offset : offset + n].double()
            )
            offset += n
    return out


def packed_slots(slots, rank, k, out_slices, dtype, gen):
    """a and b in _Packed's layout: B_j^T in sub-module j's columns, zeros in the others'."""
    n_sub, n = len(out_slices), sum(out_slices)
    a = torch.randn(slots * n_sub * rank, k, generator=gen)
    b = torch.zeros(slots * n_sub * rank, n)
    for s in range(slots):
        offset = 0
        for j, width in enumerate(out_slices):
            rows = slice((s * n_sub + j) * rank, (s * n_sub + j + 1) * rank)
            b[rows, offset : offset + width] = torch.randn(rank, width, generator=gen)
            offset += width
    return a.to(dtype), b.to(dtype)


def case(token_slots, *, k, out_slices, rank, dtype, slots=4, seed=0, stride_pad=0):
    gen = torch.Generator().manual_seed(seed)
    a, b = packed_slots(slots, rank, k, out_slices, dtype, gen)
    t, n = len(token_slots), sum(out_slices)
    # Rows of x and y as strided views when stride_pad > 0 (the kernel takes any row stride).
    x = torch.randn(t, k + stride_pad, generator=gen).to(dtype)[:, :k]
    y = torch.randn(t, n + stride_pad, generator=gen).to(dtype)[:, :n]
    scaling = torch.rand(slots, generator=gen) + 0.5
    return x, y, a, b, scaling


def tolerance(dtype):
    return {torch.float32: 1e-4, torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "k,out_slices,rank",
    [(64, (64,), 16), (40, (24, 8, 8), 5), (576, (576, 192, 192), 16), (17, (70, 3), 1)],
    ids=["aligned", "q/k/v-tails", "smollm-qkv", "odd"],
)
@pytest.mark.parametrize(
    "token_slots",
    [
        [0],
        [2, 2, 2, 2, 2],
        [3, -1, 0, 3, 1, 1, -1, 0, 3, 3, 3, 3, 3, 3, 2],
        [-1, 1, -1],
        # Many slots of a token or two (a decode step over many adapters): each thread takes
        # whole slots (lora.cpp's by_slot), with rows left alone among them.
        [5, 0, 7, -1, 1, 6, 2, 4, 3, 5, -1, 1, 9, 8],
        # Many slots, one of them with most of the tokens: the rows split over the threads.
        [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 1, 2, 3, 5],
        # Prompts: 17-18 tokens a slot, past the 16 tokens an expand block covers.
        [-1 if t % 13 == 0 else t % 5 for t in range(96)],
        # Longer prompts: 70 tokens a slot, past the 64 a shrink block covers.
        [t % 4 for t in range(280)],
    ],
    ids=[
        "one",
        "five-one-slot",
        "mixed-9-of-a-slot",
        "gaps",
        "many-slots",
        "one-slot-outweighs",
        "prompts",
        "long-prompts",
    ],
)
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_matches_float64(dtype, k, out_slices, rank, token_slots, threads):
    slots = max(4, max(token_slots) + 1)
    x, y, a, b, scaling = case(
        token_slots, k=k, out_slices=out_slices, rank=rank, dtype=dtype, slots=slots
    )
    expected = reference(x, y, a, b, token_slots, scaling, rank, out_slices)
    order, segments = plan(token_slots)
    chunked = chunk_rows(b, out_slices, rank)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # the kernel schedules by the thread count (1 on one core)
    try:
        lora_kernel()(x, y, a, chunked, order, segments, scaling, rank, list(out_slices))
    finally:
        torch.set_num_threads(before)
    tol = tolerance(dtype)
    torch.testing.assert_close(y.double(), expected, rtol=tol, atol=tol * expected.abs().max())
    for t, s in enumerate(token_slots):  # rows without an adapter: bit for bit as they were
        if s < 0:
            assert torch.equal(y[t].double(), expected[t])


def test_strided_rows():
    token_slots = [1, 0, 1, -1, 1]
    x, y, a, b, scaling = case(
        token_slots, k=48, out_slices=(32, 16), rank=8, dtype=torch.bfloat16, stride_pad=24
    )
    assert not x.is_contiguous() and not y.is_contiguous()
    expected = reference(x, y, a, b, token_slots, scaling, 8, (32, 16))
    order, segments = plan(token_slots)
    lora_kernel()(x, y, a, chunk_rows(b, (32, 16), 8), order, segments, scaling, 8, [32, 16])
    torch.testing.assert_close(y.double(), expected, rtol=2**-7, atol=2**-7 * expected.abs().max())


def test_bf16_output_is_the_fp32_sum_rounded_once_to_nearest_even():
    token_slots = [0, 1, 1]
    x, y, a, b, scaling = case(token_slots, k=64, out_slices=(96,), rank=4, dtype=torch.bfloat16)
    exact = reference(x, y, a, b, token_slots, scaling, 4, (96,))
    order, segments = plan(token_slots)
    lora_kernel()(x, y, a, chunk_rows(b, (96,), 4), order, segments, scaling, 4, [96])
    # Rounding the float64 result to bf16 differs from the kernel only where fp32's own
    # summation error crosses a rounding boundary: nearly never.
    agree = (y == exact.to(torch.bfloat16)).float().mean().item()
    assert agree > 0.97


def _good():
    token_slots = [0, 1, -1, 1]
    x, y, a, b, scaling = case(token_slots, k=32, out_slices=(16, 16), rank=4, dtype=torch.float32)
    order, segments = plan(token_slots)
    return dict(x=x, y=y, a=a, b=chunk_rows(b, (16, 16), 4), order=order, segments=segments,
                scaling=scaling, rank=4, out_slices=[16, 16])  # fmt: skip


def _call(args):
    lora_kernel()(
        args["x"], args["y"], args["a"], args["b"], args["order"], args["segments"],
        args["scaling"], args["rank"], args["out_slices"],
    )  # fmt: skip


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(order=torch.tensor([0, 1, 4])), "is not a token"),
        (dict(order=torch.tensor([0, 1, 1])), "appears twice"),
        (dict(order=torch.tensor([0, -1, 3])), "is not a token"),
        (dict(segments=torch.tensor([[0, 0, 1], [4, 1, 3]])), "is not one of the 4 slots"),
        (dict(segments=torch.tensor([[0, 0, 1], [1, 2, 3]])), "does not continue"),
        (dict(segments=torch.tensor([[0, 0, 1], [1, 1, 4]])), "does not continue"),
        (dict(segments=torch.tensor([[0, 0, 1]])), "must cover order"),
        (dict(out_slices=[16, 8]), "out_slices"),
        (dict(rank=3), "rows per slot"),
        (dict(scaling=torch.ones(2)), "one per slot"),
        (dict(order=torch.tensor([0, 1, 3], dtype=torch.int32)), "int64"),
        (dict(b=torch.zeros(4 * 2 * 4, 32)), "column chunks"),  # B^T's rows, not chunks
        (dict(b=torch.zeros(4 * 1 * 4, 64)), "column chunks"),  # a chunk short a slot
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_refuses_a_bad_plan_and_writes_nothing(change, message):
    args = _good()
    args.update(change)
    before = args["y"].clone()
    with pytest.raises(RuntimeError, match=message):
        _call(args)
    assert torch.equal(args["y"], before)


def test_refuses_mixed_dtypes():
    args = _good()
    args["a"] = args["a"].to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="share a dtype"):
        _call(args)


@pytest.mark.skipif(
    not has_bf16_dots(),
    reason="this CPU has no bf16 dot products: the tests above already ran the widening path",
)
def test_the_widening_path_of_cpus_without_bf16_dot_products():
    """Where the CPU has AVX512-BF16 the tests above run the bf16 dot-product shrink; this runs
    them again on a build without it, the path other AVX-512 CPUs take (a second build, ~30 s
    once per machine)."""
    env = {**os.environ, BF16_DOTS_ENV: "0"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
         "not widening"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1]


def test_chunks_follow_a_slot_refilled_in_place():
    """ChunkedB.refill rewrites one slot's chunks as chunk_rows would from the whole B."""
    gen = torch.Generator().manual_seed(3)
    out_slices, rank = (70, 3, 64), 5
    _, b = packed_slots(3, rank, 8, out_slices, torch.float32, gen)
    chunked = ChunkedB(b, out_slices, rank)
    _, new = packed_slots(3, rank, 8, out_slices, torch.float32, gen)
    rows = slice(1 * len(out_slices) * rank, 2 * len(out_slices) * rank)
    b[rows] = new[rows]
    chunked.refill(1, b[rows])
    assert torch.equal(chunked.values, chunk_rows(b, out_slices, rank))
    assert chunked.values.shape == (3 * (2 + 1 + 1) * rank, 64)  # 70 columns: 2 chunks
