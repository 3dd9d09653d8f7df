"""The GPU's fused RMSNorm (+ residual), SwiGLU and rotary kernels against the torch paths they
replace (shard/layers/norm.py, activation.py, rotary.py), rounding for rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_cases import DEVICE

from shard.layers.rotary import _rotate
from shard.platforms.cuda.kernels import interpreting
from shard.platforms.cuda.kernels.elementwise import rms_norm, rotary_, silu_mul

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def rounded_alike(dtype: torch.dtype, want: torch.Tensor, steps: int = 0) -> dict[str, float]:
    """Tolerances for a result whose roundings are torch's: exact, or within `steps` rounding
    steps where a sum is taken in another order. Under triton's interpreter, bf16 is the
    exception: its fp32 -> bf16 cast does not round to nearest even, and the result is only
    checked to a few rounding steps at the operands' scale, which still catches any wrong
    element or half. Compiled for a GPU, a kernel's a * b + c becomes one fused multiply-add
    (Triton's default, as nvcc's): a product is not rounded on its own, so an element may differ
    from torch's by a rounding step at the operands' scale (seen on the H200 in every dtype,
    the rotary's casts between its products notwithstanding; exp and division also differ in
    their last bits there)."""
    eps = torch.finfo(dtype).eps
    scale = float(want.abs().max())
    if dtype == torch.bfloat16 and interpreting():
        return dict(atol=4 * eps * scale, rtol=0)
    if not interpreting():
        return dict(atol=2 * eps * scale, rtol=steps * eps)
    return dict(atol=0, rtol=steps * eps)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [64, 576, 1000])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_is_the_torch_norm(dtype, n, with_residual):
    gen = torch.Generator().manual_seed(n)
    # A view with a row stride past its width, as the qkv-less hidden states may be.
    wide = torch.randn(5, n + 8, generator=gen).to(dtype)
    x = wide[:, :n]
    residual = torch.randn(5, n, generator=gen).to(dtype) if with_residual else None
    weight = (1 + 0.1 * torch.randn(n, generator=gen)).to(dtype)
    on = DEVICE  # inputs made on the CPU, the references computed there
    r_on = residual.to(on) if residual is not None else None
    out, summed = rms_norm(wide.to(on)[:, :n], weight.to(on), 1e-5, r_on)
    out, summed = out.cpu(), summed.cpu() if summed is not None else None
    want_sum = x + residual if residual is not None else x
    want = weight * F.rms_norm(want_sum, (n,), eps=1e-5)
    if residual is None:
        assert summed is None
    else:
        torch.testing.assert_close(summed, want_sum, **rounded_alike(dtype, want_sum))
    assert out.dtype == want.dtype
    # The sum of squares is summed in another order: the norm may round the other way.
    torch.testing.assert_close(out, want, **rounded_alike(dtype, want, steps=4))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [48, 1536, 1100])  # 1536, 1100: more than one 1024-wide block
def test_silu_mul_is_torch_silu_times_up(dtype, n):
    gen = torch.Generator().manual_seed(n)
    product = (3 * torch.randn(3, 2 * n + 4, generator=gen)).to(dtype)[:, : 2 * n]
    gate, up = product.chunk(2, dim=-1)
    want = F.silu(gate) * up
    # exp and the division may differ from torch's in their last bits.
    got = silu_mul(product.to(DEVICE)).cpu()
    torch.testing.assert_close(got, want, **rounded_alike(dtype, want, steps=4))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,head_dim", [(12, 64), (40, 80), (3, 128)])
def test_rotary_is_the_torch_rotation_in_place(dtype, heads, head_dim):
    gen = torch.Generator().manual_seed(heads)
    max_pos = 300
    angles = torch.rand(max_pos, head_dim // 2, generator=gen) * 50
    cos = torch.cat((angles.cos(), angles.cos()), -1)
    sin = torch.cat((-angles.sin(), angles.sin()), -1)
    positions = torch.tensor([0, 7, 299, 31, 150])
    # q and k heads of a fused qkv row: the v heads after them must stay as they are.
    qkv = torch.randn(len(positions), heads + 4, head_dim, generator=gen).to(dtype)
    joint, v_before = qkv[:, :heads], qkv[:, heads:].clone()
    want = _rotate(
        joint, cos[positions].to(dtype).unsqueeze(1), sin[positions].to(dtype).unsqueeze(1)
    )
    scale = joint.abs().max()
    qkv = qkv.to(DEVICE)
    joint = qkv[:, :heads]
    assert rotary_(joint, cos.to(DEVICE), sin.to(DEVICE), positions.to(DEVICE)) is joint
    torch.testing.assert_close(joint.cpu(), want, **rounded_alike(dtype, scale))
    assert torch.equal(qkv[:, heads:].cpu(), v_before)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,head_dim,rotary_dim", [(12, 64, 32), (6, 96, 72), (3, 128, 96)])
def test_rotary_of_partial_tables_leaves_the_other_dims(dtype, heads, head_dim, rotary_dim):
    # Partial rotary (Phi-3 small, Phi-4-mini): the tables are rotary_dim wide, and only that
    # many leading dims of each head rotate; the rest are neither read nor written.
    gen = torch.Generator().manual_seed(head_dim)
    max_pos = 300
    angles = torch.rand(max_pos, rotary_dim // 2, generator=gen) * 50
    cos = torch.cat((angles.cos(), angles.cos()), -1)
    sin = torch.cat((-angles.sin(), angles.sin()), -1)
    positions = torch.tensor([0, 7, 299, 31, 150])
    qkv = torch.randn(len(positions), heads + 4, head_dim, generator=gen).to(dtype)
    joint, before = qkv[:, :heads], qkv.clone()
    want = _rotate(
        joint, cos[positions].to(dtype).unsqueeze(1), sin[positions].to(dtype).unsqueeze(1)
    )
    assert torch.equal(want[..., rotary_dim:], joint[..., rotary_dim:])
    scale = joint.abs().max()
    qkv = qkv.to(DEVICE)
    joint = qkv[:, :heads]
    assert rotary_(joint, cos.to(DEVICE), sin.to(DEVICE), positions.to(DEVICE)) is joint
    torch.testing.assert_close(joint.cpu(), want, **rounded_alike(dtype, scale))
    assert torch.equal(qkv[:, :heads, rotary_dim:].cpu(), before[:, :heads, rotary_dim:])
    assert torch.equal(qkv[:, heads:].cpu(), before[:, heads:])


def test_rotary_refuses_tables_wider_than_the_heads():
    x = torch.zeros(2, 3, 8, device=DEVICE)
    table = torch.zeros(4, 10, device=DEVICE)
    with pytest.raises(ValueError, match="at most the head's"):
        rotary_(x, table, table, torch.tensor([0, 1], device=DEVICE))
