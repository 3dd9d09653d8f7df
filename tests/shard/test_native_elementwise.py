"""The native CPU elementwise kernels (shard/platforms/cpu/native/elementwise.cpp) against float64,
and the layers' choice between them and their torch forms.

RMSNorm and SiLU compute one fp32 intermediate differently from torch (a sum's order; exp), so
they are held to where that intermediate's fp32 error can take them: with the intermediate
anywhere within a few fp32 ulps of its float64 value, each later step rounded exactly where
Llama's forms round (to the dtype, before the weight or `up` multiplies). Where those bounds
coincide, as they nearly always do in bf16 and fp16, that is a single value. Rotary must be the
torch form bit for bit (test_rmsnorm_rotary.py)."""

from __future__ import annotations

import pytest
import torch

import shard.platforms.cpu.native.build
from shard.layers.activation import silu_and_mul
from shard.layers.norm import RMSNorm
from shard.layers.rotary import RopeConfig, RotaryEmbedding, _rotate
from shard.platforms.cpu.native.build import (
    add_rms_norm_kernel,
    rms_norm_kernel,
    rotary_kernel,
    silu_mul_kernel,
    unavailable_reason,
)

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(
    REASON is not None, reason=f"the native kernels cannot be built here: {REASON}"
)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
EPS32 = 2.0**-24  # fp32's unit roundoff


def _between(got: torch.Tensor, bound_a: torch.Tensor, bound_b: torch.Tensor) -> None:
    lo, hi = torch.minimum(bound_a, bound_b), torch.maximum(bound_a, bound_b)
    outside = (got < lo) | (got > hi)
    assert not outside.any(), (
        f"{int(outside.sum())} of {got.numel()} values outside their bounds; first at "
        f"{outside.nonzero()[0].tolist()}: {got[outside][0]} not in "
        f"[{lo[outside][0]}, {hi[outside][0]}]"
    )


def _rms_norm_bounds(x: torch.Tensor, weight: torch.Tensor, eps: float, ulps: float):
    """The outputs Llama's RMSNorm gives with 1 / sqrt(mean(x^2) + eps) anywhere within `ulps`
    fp32 ulps of its float64 value, at both ends of that range."""
    x64 = x.double()
    inv = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    ends = []
    for factor in (1 - ulps * EPS32, 1 + ulps * EPS32):
        r = (inv * factor).float()
        ends.append(weight * (x.float() * r).to(x.dtype))
    return ends


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "hidden", "magnitude"),
    [(7, 32, 3.0), (16, 576, 40.0), (3, 1000, 1e-3), (1, 4096, 1.0), (130, 40, 1.0), (5, 17, 2.0)],
)
def test_rms_norm_kernel_within_fp32_of_float64(dtype, rows, hidden, magnitude):
    torch.manual_seed(hidden + rows)
    weight = torch.randn(hidden).to(dtype)
    x = (torch.randn(rows, hidden) * magnitude).to(dtype)
    got = rms_norm_kernel()(x, weight, 1e-5)
    assert got.dtype == dtype and got.shape == x.shape
    # The sum of squares: 32 fp32 partial sums of up to n / 32 terms each, then 1 / sqrt.
    _between(got, *_rms_norm_bounds(x, weight, 1e-5, ulps=8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "hidden"), [(1, 16), (16, 576), (5, 17), (130, 40)])
def test_add_rms_norm_is_the_add_then_the_norm(dtype, rows, hidden):
    # The sum is torch's add bit for bit (one rounding to the dtype), and the normed output is
    # the norm kernel's of that sum, bit for bit: fusing the two changes no value.
    torch.manual_seed(rows + hidden)
    weight = torch.randn(hidden).to(dtype)
    wide = (torch.randn(rows, hidden + 7) * 3).to(dtype)
    x = wide[:, 3 : 3 + hidden]  # rows apart by more than their width
    residual = (torch.randn(rows, hidden) * 30).to(dtype)
    normed, summed = add_rms_norm_kernel()(x, residual, weight, 1e-6)
    assert torch.equal(summed, x + residual)
    assert torch.equal(normed, rms_norm_kernel()(summed, weight, 1e-6))
    _between(normed, *_rms_norm_bounds(x + residual, weight, 1e-6, ulps=8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_kernel_takes_strided_heads(dtype):
    # Qwen3's per-head norms: [T, heads, D] views of the fused qkv rows.
    torch.manual_seed(3)
    fused = (torch.randn(6, 11 * 64) * 3).to(dtype)
    q = fused[:, 64 : 9 * 64].view(6, 8, 64)
    weight = torch.randn(64).to(dtype)
    got = rms_norm_kernel()(q, weight, 1e-6)
    assert got.shape == (6, 8, 64) and got.is_contiguous()
    _between(got, *_rms_norm_bounds(q, weight, 1e-6, ulps=8))


def _silu_mul_bounds(gate: torch.Tensor, up: torch.Tensor, ulps: float):
    """silu(gate) * up with the fp32 silu anywhere within `ulps` fp32 ulps of its float64 value,
    rounded to the dtype before `up` multiplies it (as F.silu(gate) * up rounds)."""
    g = gate.double()
    # e^-g as fp32 holds it: past ~88.7 it overflows to inf (and silu to -0), as in torch's form.
    silu = g / (1 + torch.exp(-g).float().double())
    return [((silu * (1 + s * ulps * EPS32)).float().to(gate.dtype) * up) for s in (-1, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "width"), [(1, 16), (7, 40), (16, 1536), (33, 5), (300, 96)])
def test_silu_mul_kernel_within_fp32_of_float64(dtype, rows, width):
    torch.manual_seed(rows * width)
    gate_up = (torch.randn(rows, 2 * width) * 4).to(dtype)
    gate_up[0, 0] = 90.0  # e^-g underflows toward 0: silu(g) = g
    if width > 1:
        gate_up[0, 1] = -90.0  # e^-g overflows fp32: silu(g) = -0
    gate, up = gate_up[:, :width], gate_up[:, width:]  # the halves of a gate_up product
    got = silu_mul_kernel()(gate, up)
    assert got.dtype == dtype and got.shape == (rows, width) and got.is_contiguous()
    # exp: ~1 ulp here, then 1 + e and the division round once each.
    _between(got, *_silu_mul_bounds(gate, up, ulps=4))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [18, 40, 64, 128])
def test_rotary_kernel_is_the_torch_form_bit_for_bit(dtype, head_dim):
    rope = RotaryEmbedding(
        RopeConfig(head_dim=head_dim, max_position_embeddings=300), torch.device("cpu")
    )
    torch.manual_seed(head_dim)
    rows = (torch.randn(9, 7 * head_dim) * 3).to(dtype)
    x = rows[:, : 5 * head_dim].view(9, 5, head_dim)  # strided rows, heads contiguous
    positions = torch.tensor([0, 1, 2, 299, 150, 7, 7, 64, 3])
    cos, sin = rope._gather(positions, dtype)
    got = rotary_kernel()(x, rope.cos, rope.sin, positions)
    assert torch.equal(got, _rotate(x, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("head_dim", "factor"), [(32, 0.5), (40, 0.75), (128, 0.75), (64, 0.25)])
def test_rotary_kernel_rotates_the_tables_width_and_copies_the_rest(dtype, head_dim, factor):
    # Partial rotary: tables rotary_dim wide, the dims past them passed through bit for bit.
    rope = RotaryEmbedding(
        RopeConfig(head_dim=head_dim, max_position_embeddings=300, partial_rotary_factor=factor),
        torch.device("cpu"),
    )
    assert rope.cos.shape == (300, rope.rotary_dim) and rope.rotary_dim < head_dim
    torch.manual_seed(head_dim)
    rows = (torch.randn(9, 7 * head_dim) * 3).to(dtype)
    rows[2, head_dim - 1] = float("nan")  # in a passed-through dim: copied as it is
    x = rows[:, : 5 * head_dim].view(9, 5, head_dim)
    positions = torch.tensor([0, 1, 2, 299, 150, 7, 7, 64, 3])
    cos, sin = rope._gather(positions, dtype)
    got = rotary_kernel()(x, rope.cos, rope.sin, positions)
    want = _rotate(x, cos, sin)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(got[..., rope.rotary_dim :].view(torch.uint8),
                       x[..., rope.rotary_dim :].view(torch.uint8))  # fmt: skip


def test_bf16_rounding_keeps_denormals_and_canonical_nans():
    """The kernels round to bf16 with vcvtneps2bf16 where the CPU has it, which reads denormal
    inputs as zero and keeps NaN payloads: vectors with such lanes must still round as torch
    does (rotary's products of bf16-denormal inputs are fp32 denormals) and a NaN stay a NaN
    (its bits are not compared: torch's own vectorized and scalar casts give different ones)."""
    rope = RotaryEmbedding(RopeConfig(head_dim=64, max_position_embeddings=40), torch.device("cpu"))
    torch.manual_seed(0)
    x = torch.randn(6, 4, 64) * 1e-38  # mostly below fp32's smallest normal, 1.2e-38
    x[0, 0, 3] = float("nan")
    x[1, 2, 40] = -float("nan")
    x[2] *= 1e38  # a row of normal values beside them
    x = x.bfloat16()
    positions = torch.tensor([0, 1, 5, 17, 33, 39])
    cos, sin = rope._gather(positions, torch.bfloat16)
    got = rotary_kernel()(x, rope.cos, rope.sin, positions)
    want = _rotate(x, cos, sin)
    assert (want.float().abs() < 1.2e-38).sum() > 500  # the case is really denormal
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == 4
    numbers = ~want.isnan()
    assert torch.equal(got[numbers].view(torch.int16), want[numbers].view(torch.int16))


def test_kernels_refuse_what_they_cannot_compute():
    rope = RotaryEmbedding(RopeConfig(head_dim=8, max_position_embeddings=16), torch.device("cpu"))
    x = torch.randn(2, 3, 8)
    with pytest.raises(RuntimeError, match="position 16 is outside"):
        rotary_kernel()(x, rope.cos, rope.sin, torch.tensor([0, 16]))
    with pytest.raises(RuntimeError, match="position -1 is outside"):
        rotary_kernel()(x, rope.cos, rope.sin, torch.tensor([-1, 0]))
    with pytest.raises(RuntimeError, match="heads must be contiguous"):
        rotary_kernel()(x.transpose(0, 1), rope.cos, rope.sin, torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="positions must be contiguous int64"):
        rotary_kernel()(x, rope.cos, rope.sin, torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="R even and <= 8"):
        rotary_kernel()(x, rope.cos[:, :5].contiguous(), rope.sin[:, :5].contiguous(),
                        torch.tensor([0, 1]))  # fmt: skip
    with pytest.raises(RuntimeError, match="R even and <= 4"):
        rotary_kernel()(torch.randn(2, 3, 4), rope.cos, rope.sin, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="weight and x differ in dtype"):
        rms_norm_kernel()(torch.randn(2, 8), torch.randn(8).bfloat16(), 1e-5)
    with pytest.raises(RuntimeError, match="rows must be contiguous"):
        rms_norm_kernel()(torch.randn(8, 2).t(), torch.randn(8), 1e-5)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        rms_norm_kernel()(torch.randn(2, 8).double(), torch.randn(8).double(), 1e-5)
    with pytest.raises(RuntimeError, match="gate and up"):
        silu_mul_kernel()(torch.randn(2, 8), torch.randn(2, 9))
    with pytest.raises(RuntimeError, match="x and residual \\[R, n\\]"):
        add_rms_norm_kernel()(torch.randn(2, 8), torch.randn(3, 8), torch.randn(8), 1e-5)
    with pytest.raises(RuntimeError, match="x and residual differ in dtype"):
        add_rms_norm_kernel()(torch.randn(2, 8), torch.randn(2, 8).bfloat16(), torch.randn(8), 1e-5)


def _counting(monkeypatch, module, name):
    """Replaces module.name (a kernel accessor) by one that counts the kernel's calls."""
    real = getattr(module, name)()
    calls = []

    def kernel(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(module, name, lambda: kernel)
    return calls


def test_layers_take_the_native_kernels_in_eager_cpu_steps(monkeypatch):
    norm_calls = _counting(monkeypatch, shard.platforms.cpu.native.build, "rms_norm_kernel")
    add_norm_calls = _counting(monkeypatch, shard.platforms.cpu.native.build, "add_rms_norm_kernel")
    silu_calls = _counting(monkeypatch, shard.platforms.cpu.native.build, "silu_mul_kernel")
    rope_calls = _counting(monkeypatch, shard.platforms.cpu.native.build, "rotary_kernel")
    x = torch.randn(4, 32).bfloat16()
    RMSNorm(torch.randn(32).bfloat16(), 1e-5)(x)
    gate_up = torch.randn(4, 64)
    silu_and_mul(gate_up[:, :32], gate_up[:, 32:])
    rope = RotaryEmbedding(RopeConfig(head_dim=8, max_position_embeddings=16), torch.device("cpu"))
    qkv = torch.randn(4, 6 * 8)
    rope(torch.arange(4), qkv[:, :24].view(4, 3, 8), qkv[:, 24:40].view(4, 2, 8))
    normed, summed = RMSNorm(torch.randn(32).bfloat16(), 1e-5)(x, x * 2)
    assert torch.equal(summed, x * 3) and len(add_norm_calls) == 1
    assert (len(norm_calls), len(silu_calls), len(rope_calls)) == (1, 1, 1)
    # q and k were neighbours in one row: rotated in one call over both, as [4, 5, 8].
    assert rope_calls[0][0].shape == (4, 5, 8)
    # What the kernels cannot take goes the torch way: a norm weight of another dtype, float64.
    RMSNorm(torch.randn(32), 1e-5)(x)
    silu_and_mul(gate_up[:, :32].double(), gate_up[:, 32:].double())
    assert (len(norm_calls), len(silu_calls)) == (1, 1)


ACCESSORS = (
    (shard.platforms.cpu.native.build, "rms_norm_kernel"),
    (shard.platforms.cpu.native.build, "add_rms_norm_kernel"),
    (shard.platforms.cpu.native.build, "silu_mul_kernel"),
    (shard.platforms.cpu.native.build, "rotary_kernel"),
)


def test_compiled_layers_keep_their_torch_forms(monkeypatch):
    # Under torch.compile a native call would be opaque to inductor, which fuses the torch forms
    # itself: the layers must not reach for a kernel while being traced.
    def refuse():
        raise AssertionError("a native kernel was asked for under torch.compile")

    for module, name in ACCESSORS:
        monkeypatch.setattr(module, name, refuse)
    norm = RMSNorm(torch.randn(32), 1e-5)
    rope = RotaryEmbedding(RopeConfig(head_dim=8, max_position_embeddings=16), torch.device("cpu"))

    def layer(x, positions):
        q, k = rope(positions, x[:, :16].view(-1, 2, 8), x[:, 16:].view(-1, 2, 8))
        h, residual = norm(torch.cat([q.flatten(1), k.flatten(1)], 1), x)
        return silu_and_mul(h[:, :16], h[:, 16:]) + norm(residual)[:, :16]

    x, positions = torch.randn(3, 32), torch.tensor([0, 4, 9])
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="eager", fullgraph=True)(x, positions)
    for module, name in ACCESSORS:
        monkeypatch.setattr(module, name, lambda: None)
    assert torch.equal(compiled, layer(x, positions))  # the same torch ops, run eagerly
