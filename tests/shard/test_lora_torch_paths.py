"""The CPU paths of the LoRA term (shard/layers/lora.py) against a float64 reference computed one
token and one sub-module at a time: the native kernel (small steps, where it builds), the torch
dense path (small steps: every slot at once, masked), the grouped path (large steps: slot by
slot) and its one-slot shortcut, with slots of different ranks, tokens without an adapter, and
slots refilled between steps."""

from __future__ import annotations

import sys

import pytest
import torch

from shard.layers import lora as lora_mod
from shard.layers.lora import LoraStep, LoraTerm
from shard.platforms.cpu.native.build import lora_kernel, unavailable_reason

K, OUT_SLICES, MAX_RANK, SLOTS = 40, (24, 8, 8), 16, 4
NATIVE_REASON = unavailable_reason()
needs_native = pytest.mark.skipif(
    NATIVE_REASON is not None, reason=f"the native kernels cannot be built: {NATIVE_REASON}"
)
# The kernel the terms' step is given (the `path` fixture sets it for the native case).
_native = None


def empty_term(dtype: torch.dtype = torch.float32) -> LoraTerm:
    """A fused three-way term (q/k/v-like) with its slots all zero."""
    step = LoraStep(scaling=torch.zeros(SLOTS), scaling_host=[0.0] * SLOTS, dtype=dtype)
    step.native = _native
    return LoraTerm(
        step,
        num_slots=SLOTS,
        max_rank=MAX_RANK,
        in_features=K,
        out_slices=OUT_SLICES,
        dtype=dtype,
        device=torch.device("cpu"),
    )


def term(seed: int = 0, dtype: torch.dtype = torch.float32) -> LoraTerm:
    """A fused three-way term whose slot s holds rank 4 + 3 s; slot 2 leaves sub-module 1 alone."""
    t = empty_term(dtype)
    step = t.step
    gen = torch.Generator().manual_seed(seed)
    for s in range(SLOTS):
        rank = 4 + 3 * s
        parts = [
            None
            if (s == 2 and j == 1)
            else (torch.randn(rank, K, generator=gen), torch.randn(n, rank, generator=gen))
            for j, n in enumerate(OUT_SLICES)
        ]
        t.fill(s, parts)
        step.set_scaling(s, 0.5 + s)
    return t


def reference(t: LoraTerm, x: torch.Tensor, slots: list[int], y: torch.Tensor) -> torch.Tensor:
    out = y.double().clone()
    for i, s in enumerate(slots):
        if s < 0:
            continue
        start = 0
        for j, size in enumerate(OUT_SLICES):
            a = t.lora_a[s, j].double()
            b = t.lora_b[s, start : start + size].double()
            out[i, start : start + size] += t.step.scaling_host[s] * (b @ (a @ x[i].double()))
            start += size
    return out


def run(t: LoraTerm, slots: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(len(slots), K, generator=gen).to(t.lora_a.dtype)
    y0 = torch.randn(len(slots), sum(OUT_SLICES), generator=gen).to(t.lora_a.dtype)
    t.step.set_tokens(torch.tensor(slots, dtype=torch.int32))
    y = y0.clone()
    with torch.inference_mode():  # as the runner steps; fills happen outside it, between steps
        t(x, y)
    return y, reference(t, x, slots, y0)


def use_native(monkeypatch) -> None:
    """Terms made from here on get the native kernel on their step."""
    monkeypatch.setattr(sys.modules[__name__], "_native", lora_kernel())


@pytest.fixture(
    params=[
        pytest.param("native", marks=needs_native),
        "dense",
        "grouped",
        "dense-packed",
        "grouped-packed",
    ]
)
def path(request, monkeypatch):
    if request.param == "native":
        use_native(monkeypatch)
    # The dense path takes steps of up to DENSE_MAX_CELLS tokens x slots; 0 forces grouped.
    if request.param.startswith("grouped"):
        monkeypatch.setattr(lora_mod, "DENSE_MAX_CELLS", 0)
    # A slot set runs on plain weights for its first PACK_AFTER_USES steps, then on copies
    # packed for the CPU GEMM; 0 packs at once.
    if request.param.endswith("packed"):
        monkeypatch.setattr(lora_mod, "PACK_AFTER_USES", 0)
    return request.param


MIXED = [-1, 0, 3, 1, 1, -1, 2, 0, 3, 3, 2]


def test_mixed_slots_and_tokens_without_adapter(path):
    t = term()
    y, ref = run(t, MIXED)
    assert (t.step.mask is not None) == path.startswith("dense")
    assert (t.step.segments is not None) == (path == "native")
    torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-5)
    packed_copies = [s for s in t._packed.subsets.values() if "a_mm" in vars(s)]
    assert bool(packed_copies) == path.endswith("packed")  # which GEMM branch ran


@pytest.mark.parametrize(
    "slots", [[0] * 5, [3, -1, 3], [1, 2, 2, -1], [3, 0, -1, 3, 0], [2, 0, 0]], ids=str
)
def test_one_slot_a_run_of_slots_or_scattered_ones(path, slots):
    t = term()
    y, ref = run(t, slots)
    torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-5)


def test_no_adapter_leaves_y_alone(path):
    t = term()
    y, ref = run(t, [-1, -1, -1])
    assert torch.equal(y.double(), ref)


@pytest.mark.parametrize("slots", [MIXED, [3, 1, -1, 1, 3]], ids=["all", "scattered"])
# 16: larger than any rank before, the packed copy is rebuilt; 2: it is rewritten in place.
@pytest.mark.parametrize("rank", [MAX_RANK, 2], ids=["rank-grows", "rank-fits"])
def test_refilling_a_slot_between_steps_uses_the_new_weights(path, slots, rank):
    t = term()
    run(t, slots)  # builds the packed copies (and, scattered, a compact subset of them)
    run(t, slots)  # twice: packed copies of the subset too on the packed paths
    before = t._packed
    if path.startswith("dense") and slots != MIXED:
        assert (1, 3) in t._packed.subsets
    gen = torch.Generator().manual_seed(7)
    t.fill(
        1,
        [
            (torch.randn(rank, K, generator=gen), torch.randn(n, rank, generator=gen))
            for n in OUT_SLICES
        ],
    )
    assert (t._packed is before) == (rank < MAX_RANK)
    t.step.set_scaling(1, 3.0)
    y, ref = run(t, slots, seed=2)
    torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-5)


def test_dense_shape_for_small_steps_or_one_slot():
    t = term()
    cells = lora_mod.DENSE_MAX_CELLS
    t.step.set_tokens(torch.tensor([1, 2] * (cells // 4), dtype=torch.int32))  # 2 slots
    assert t.step.mask is not None and t.step.dense_slots == (1, 2) and not t.step.groups
    t.step.set_tokens(torch.tensor([1, 2] * (cells // 4 + 1), dtype=torch.int32))
    assert t.step.mask is None and [slot for slot, _ in t.step.groups] == [1, 2]
    t.step.set_tokens(torch.full((cells + 1,), 3, dtype=torch.int32))  # one slot: exact anyway
    assert t.step.mask is not None and t.step.dense_slots == (3,)


def test_a_layer_no_adapter_touches_is_left_alone(path):
    t = empty_term()
    t.step.set_scaling(0, 1.0)
    t.fill(0, [None] * len(OUT_SLICES))  # an adapter that targets other modules
    y, ref = run(t, [0, 1, -1])
    assert torch.equal(y.double(), ref)


def _half_ulp_bf16(v: torch.Tensor) -> torch.Tensor:
    """Half the spacing of bfloat16 numbers (8 significant bits) around each value of v."""
    exponent = torch.floor(torch.log2(v.abs().clamp(min=2.0**-126)))
    return 2.0 ** (exponent - 8)


@pytest.mark.parametrize("slots", [MIXED, [2, 2, -1]], ids=["several-slots", "one-slot"])
def test_small_half_precision_terms_are_computed_in_fp32_and_rounded_once(monkeypatch, slots):
    """A bf16 step of the dense shape within FP32_MAX_FLOPS: the exact sum rounded once to bf16,
    up to fp32's own error; the bf16 GEMMs (FP32_MAX_FLOPS 0) round the shrink's output and miss
    that bound. (The grouped shape, for large steps, adds each slot's part through a bf16 delta:
    two roundings, as before.)"""
    y, ref = run(term(dtype=torch.bfloat16), slots)
    bound = _half_ulp_bf16(ref) + 1e-5 * ref.abs() + 1e-6
    assert bool(((y.double() - ref).abs() <= bound).all())

    monkeypatch.setattr(lora_mod, "FP32_MAX_FLOPS", 0)
    y_bf16, ref_bf16 = run(term(dtype=torch.bfloat16), slots)
    torch.testing.assert_close(y_bf16.double(), ref_bf16, rtol=2**-6, atol=0.5)  # bf16 GEMMs
    assert not bool(((y_bf16.double() - ref_bf16).abs() <= bound).all())


@needs_native
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("slots", [MIXED, [2, 2, -1]], ids=["several-slots", "one-slot"])
def test_native_half_precision_terms_are_rounded_once(monkeypatch, dtype, slots):
    """The native kernel sums in fp32 and rounds once into y, as the torch path's fp32 GEMMs."""
    use_native(monkeypatch)
    t = term(dtype=dtype)
    y, ref = run(t, slots)
    assert t.step.segments is not None
    # Half a unit in the last place of the type's significand (bf16: 8 bits, fp16: 11).
    exponent = torch.floor(torch.log2(ref.abs().clamp(min=2.0**-14)))
    half_ulp = 2.0 ** (exponent - (8 if dtype == torch.bfloat16 else 11))
    assert bool(((y.double() - ref).abs() <= half_ulp + 1e-5 * ref.abs() + 1e-6).all())


@needs_native
def test_native_path_takes_column_strided_inputs_and_outputs(monkeypatch):
    """x and y as transposed views (values not contiguous in a row): the same result."""
    use_native(monkeypatch)
    t = term()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(K, len(MIXED), generator=gen).t()
    y0 = torch.randn(sum(OUT_SLICES), len(MIXED), generator=gen).t()
    t.step.set_tokens(torch.tensor(MIXED, dtype=torch.int32))
    y = y0.clone().t().contiguous().t()  # y's own column-strided storage, written in place
    with torch.inference_mode():
        t(x, y)
    assert t.step.segments is not None and y.stride(-1) != 1
    torch.testing.assert_close(y.double(), reference(t, x, MIXED, y0), atol=1e-4, rtol=1e-5)


@needs_native
def test_native_kernel_takes_small_steps_only(monkeypatch):
    """Up to NATIVE_TOKENS_PER_SLOT adapter tokens a slot used, at most NATIVE_MAX_TOKENS."""
    use_native(monkeypatch)
    monkeypatch.setattr(lora_mod, "NATIVE_TOKENS_PER_SLOT", 8)
    monkeypatch.setattr(lora_mod, "NATIVE_MAX_TOKENS", 20)
    t = term()
    # 16 adapter tokens over 2 slots (every third token has none): native.
    t.step.set_tokens(torch.tensor([1, -1, 2] * 8, dtype=torch.int32))
    assert t.step.segments.tolist() == [[1, 0, 8], [2, 8, 16]] and t.step.mask is None
    assert t.step.order.tolist() == list(range(0, 24, 3)) + list(range(2, 24, 3))
    t.step.set_tokens(torch.full((9,), 3, dtype=torch.int32))  # 9 tokens of one slot: torch
    assert t.step.segments is None and t.step.mask is not None
    t.step.set_tokens(torch.tensor([0, 1, 2] * 7, dtype=torch.int32))  # 21 > 20: torch
    assert t.step.segments is None and t.step.mask is not None
    y, ref = run(t, [1, 2, 3] * 7)  # and the torch path's result is the same
    assert t.step.segments is None
    torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-5)
    y, ref = run(t, [1, 2, 3] * 6)  # 18 over 3 slots: native
    assert t.step.segments is not None
    torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-5)


def test_grouped_half_precision_steps_stay_within_bf16_error(monkeypatch):
    monkeypatch.setattr(lora_mod, "DENSE_MAX_CELLS", 0)
    for limit in (lora_mod.FP32_MAX_FLOPS, 0):  # fp32 GEMMs, then bf16 ones
        monkeypatch.setattr(lora_mod, "FP32_MAX_FLOPS", limit)
        y, ref = run(term(dtype=torch.bfloat16), MIXED)
        torch.testing.assert_close(y.double(), ref, rtol=2**-6, atol=0.5)
