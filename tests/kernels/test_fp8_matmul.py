"""The W8A16 GEMM (w4a16.py's kernel, FP8 variant) against a float64 reference written here:
x @ (fp8 values * their block's scale)^T, from the same FP8 codes and scales.

Weights are random FP8 values over e4m3's whole range (subnormals, the largest finite 448,
zeros, both signs); scales make outputs O(1), so the tolerances read as relative ones (the
rounding of x and of the output, as test_w4a16.py states them: the product of an FP8 value and
its scale is formed in fp32 and rounded once to x's dtype, or applied to the fp32 product of a
K tile that lies in one block).
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE

from shard.layers.quant.fp8 import Fp8Weight
from shard.platforms.cuda.kernels.w4a16 import fp8_matmul
from shard.platforms.cuda.kernels.w4a16_config import W4A16Config

TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def random_fp8(n: int, k: int, block_k: int, gen: torch.Generator) -> Fp8Weight:
    # every finite e4m3 bit pattern is as likely (NaN's two patterns excluded)
    bits = torch.randint(0, 256, (n, k), generator=gen, dtype=torch.int32)
    bits = torch.where((bits & 0x7F) == 0x7F, bits - 1, bits).to(torch.uint8)
    weight = bits.view(torch.float8_e4m3fn)
    # |value| averages ~50 over the whole range: scale so that outputs have a std of ~1.
    blocks = -(-k // block_k)
    scales = (torch.rand(n, blocks, generator=gen) + 0.5) / (100.0 * k**0.5)
    return Fp8Weight(weight, scales, block_k)


def reference(x: torch.Tensor, fw: Fp8Weight) -> torch.Tensor:
    k = fw.in_features
    per_input = fw.scales.double().repeat_interleave(fw.block_k, dim=1)[:, :k]
    return (x.double() @ (fw.weight.double() * per_input).T).float()


def check(m: int, k: int, n: int, block_k: int, dtype: torch.dtype, config=None, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    fw = random_fp8(n, k, block_k, gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    out = fp8_matmul(
        x.to(DEVICE), fw.weight.to(DEVICE), fw.scales.to(DEVICE), block_k, config=config
    )
    assert out.shape == (m, n) and out.dtype == dtype
    torch.testing.assert_close(out.cpu().float(), reference(x, fw), **TOLERANCES[dtype])


@pytest.mark.parametrize(
    "m,k,n,block_k,dtype",
    [
        (1, 256, 96, 128, torch.bfloat16),  # decode, 128-wide blocks (scales after the dot)
        (5, 320, 72, 128, torch.float16),  # K ends in half a block; N not a tile multiple
        (33, 192, 64, 192, torch.float32),  # per channel: one block spans K (192 = 64 * 3)
        (17, 200, 40, 200, torch.bfloat16),  # per channel, K not a multiple of 16 (row groups)
        (3, 96, 48, 48, torch.float16),  # blocks narrower than the K tile: a scale per row
    ],
)
def test_matches_reference(m, k, n, block_k, dtype):
    check(m, k, n, block_k, dtype)


@pytest.mark.parametrize("split_k", [1, 3])
def test_explicit_tiles_and_splits(split_k):
    check(7, 512, 48, 128, torch.bfloat16, W4A16Config(16, 16, 32, 1, 1, split_k=split_k))


def test_operands_are_checked():
    x = torch.zeros(2, 64, device=DEVICE)
    weight = torch.zeros(8, 64, device=DEVICE).to(torch.float8_e4m3fn)
    scales = torch.ones(8, 1, device=DEVICE)
    assert fp8_matmul(x, weight, scales, 64).abs().sum() == 0
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_matmul(x, weight.float(), scales, 64)
    with pytest.raises(ValueError, match="one scale per 32 inputs"):
        fp8_matmul(x, weight, scales, 32)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_matmul(torch.zeros(2, 32, device=DEVICE), weight, scales, 64)
