"""W4A16 GEMM kernel against the torch reference: x.float() @ QuantizedWeight(...).dequantize().

Weights are random 4-bit codes packed with `pack_rows`, asymmetric zero points (any of 0..15)
and positive scales sized so that outputs are O(1) (|out| up to ~5), so the tolerances below
read as relative ones.

Tolerances (atol = rtol), against the fp32 reference computed on CPU from the same (already
rounded) inputs:
  fp32  1e-5: (code - zero) * scale is formed exactly as the reference forms it and the tile
        matmuls are ieee fp32 (no TF32); only the summation order differs (seen: < 2e-6).
  fp16  2e-3: the output is rounded once (half an ulp is 2^-11 relative) and, on the prefill
        path, each dequantized weight too; fp32 accumulation (seen: 1.4e-3 at |out| ~ 5).
  bf16  2e-2: the same with bf16's 2^-8; in triton's interpreter fp32 -> bf16 conversions
        truncate instead of rounding (a whole ulp, 2^-7 relative, and biased), which the bound
        still covers (seen: 4.2e-2 at |out| ~ 5, under 0.02 + 0.02 |out|).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from kernel_cases import DEVICE

from shard.layers.quant.int4 import QuantizedWeight, pack_rows, unpack_rows
from shard.platforms.cuda.kernels import w4a16 as w4a16_module
from shard.platforms.cuda.kernels.int4_dequant import EXPONENT_2P23, codes_minus_zeros
from shard.platforms.cuda.kernels.w4a16 import w4a16_matmul
from shard.platforms.cuda.kernels.w4a16_config import (
    MAX_SPLIT_K,
    WAVES,
    W4A16Config,
    check_tile,
    choose_split_k,
    default_config,
)

TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def act_order_g_idx(k: int, group_size: int, gen: torch.Generator) -> torch.Tensor:
    """GPTQ's act-order: rows are quantized in a permuted order (by decreasing Hessian
    diagonal), groups formed along that order, so row k's group is its rank // group_size."""
    perm = torch.randperm(k, generator=gen)
    return (torch.argsort(perm) // group_size).to(torch.int32)


def random_weight(
    k: int,
    n: int,
    group_size: int,
    gen: torch.Generator,
    *,
    act_order: bool = False,
    scale_dtype: torch.dtype = torch.float16,
    zero_dtype: torch.dtype = torch.uint8,
) -> QuantizedWeight:
    groups = -(-k // group_size)
    codes = torch.randint(0, 16, (k, n), generator=gen)
    zeros = torch.randint(0, 16, (groups, n), generator=gen).to(zero_dtype)
    # |code - zero| has a standard deviation of ~6.5: outputs come out with a std of ~1.
    scales = ((torch.rand(groups, n, generator=gen) + 0.5) / (6.5 * k**0.5)).to(scale_dtype)
    g_idx = act_order_g_idx(k, group_size, gen) if act_order else None
    return QuantizedWeight(pack_rows(codes), zeros, scales, group_size, g_idx)


def on_device(qw: QuantizedWeight) -> QuantizedWeight:
    g_idx = qw.g_idx.to(DEVICE) if qw.g_idx is not None else None
    return QuantizedWeight(
        qw.qweight.to(DEVICE), qw.zeros.to(DEVICE), qw.scales.to(DEVICE), qw.group_size, g_idx
    )


def run(x: torch.Tensor, qw: QuantizedWeight, config: W4A16Config | None = None) -> torch.Tensor:
    """The kernel's output (on CPU) after checking its shape and dtype."""
    dev = on_device(qw)
    out = w4a16_matmul(
        x.to(DEVICE), dev.qweight, dev.scales, dev.zeros, dev.g_idx, qw.group_size, config=config
    )
    assert out.shape == (x.shape[0], qw.out_features) and out.dtype == x.dtype
    return out.cpu()


def check(
    m: int,
    k: int,
    n: int,
    group_size: int,
    dtype: torch.dtype,
    *,
    seed: int = 0,
    config: W4A16Config | None = None,
    **weight_kwargs,
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    qw = random_weight(k, n, group_size, gen, **weight_kwargs)
    x = torch.randn(m, k, generator=gen).to(dtype)
    out = run(x, qw, config)
    expected = x.float() @ qw.dequantize()
    torch.testing.assert_close(out.float(), expected, **TOLERANCES[dtype])
    return out


@triton.jit
def _dequant_tile(q_ptr, z_ptr, out_ptr, exponent, N: tl.constexpr, K: tl.constexpr):
    """W^T tile [N, K] of (code - zero) from the words of qweight [K // 8, N], zeros [N]."""
    offs_n = tl.arange(0, N)
    packed = tl.load(q_ptr + tl.arange(0, K // 8)[None, :] * N + offs_n[:, None])
    zeros = tl.load(z_ptr + offs_n)
    w = codes_minus_zeros(packed, zeros[:, None], exponent, K)
    tl.store(out_ptr + tl.arange(0, K)[None, :] * N + offs_n[:, None], w)


def test_dequantization_is_exact_for_every_code_and_zero():
    # Every code in every nibble position, against every zero point 0..15: code - zero exactly.
    # Row 8i + j holds nibble j of word i; column n is tried against zero point n.
    i, j, n = torch.meshgrid(torch.arange(16), torch.arange(8), torch.arange(16), indexing="ij")
    codes = ((i + j + n) % 16).reshape(128, 16)  # [K=128, N=16]: all 16 codes at each (j, n)
    zeros = torch.arange(16, dtype=torch.uint8)
    qweight = pack_rows(codes)
    out = torch.empty(128, 16, dtype=torch.float32, device=DEVICE)
    _dequant_tile[(1,)](qweight.to(DEVICE), zeros.to(DEVICE), out, EXPONENT_2P23, N=16, K=128)
    expected = unpack_rows(qweight).float() - zeros.float()
    assert torch.equal(out.cpu(), expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "m,k,n,group_size",
    [
        (1, 128, 48, 32),  # decode: one token
        (5, 256, 40, 64),  # odd M; N off the 16-wide tile
        (3, 136, 24, 32),  # K off the K tile (and a last group of 8 rows)
        (1, 384, 32, 128),  # group 128: several K tiles per group in the interpreter
        (37, 192, 40, 64),  # M past the decode tile: prefill path, odd M, 3 M tiles
    ],
    ids=lambda v: str(v),
)
def test_matches_reference(m, k, n, group_size, dtype):
    check(m, k, n, group_size, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,group_size", [(1, 32), (3, 128), (20, 64)])
def test_act_order_g_idx(m, group_size, dtype):
    check(m, 256, 40, group_size, dtype, act_order=True, seed=1)


@pytest.mark.parametrize(
    "config",
    [
        W4A16Config(16, 16, 32, 1, 1, split_k=3),  # 8 K tiles: splits of 3, 3, 2
        W4A16Config(16, 16, 32, 1, 1, split_k=16, scale_after_dot=True),  # more splits than tiles
        W4A16Config(16, 32, 64, 1, 1, split_k=2),  # K tile straddles two 32-row groups
        # 16-row K tiles: 64 weight rows, as a GPU needs with them (MIN_GPU_TILE_WORDS).
        W4A16Config(32, 64, 16, 4, 1, split_k=1, scale_after_dot=True),
    ],
    ids=["split3", "split16", "straddle", "k16"],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_explicit_tiles_and_splits(config, dtype):
    check(7, 264, 40, 32, dtype, config=config, seed=2)  # 264: K off every tile above


@pytest.mark.parametrize(
    "scale_dtype,zero_dtype",
    [(torch.bfloat16, torch.uint8), (torch.float32, torch.int32), (torch.float16, torch.int8)],
    ids=["bf16-scales", "fp32-scales-int32-zeros", "int8-zeros"],
)
def test_scales_and_zeros_as_stored(scale_dtype, zero_dtype):
    check(3, 128, 32, 32, torch.float16, scale_dtype=scale_dtype, zero_dtype=zero_dtype, seed=3)


def test_strided_inputs_as_tensor_parallel_slices_hand_them_over():
    # A column-parallel rank's slice of qweight/scales/zeros (non-contiguous views) and x as a
    # view into a wider activation buffer.
    gen = torch.Generator().manual_seed(4)
    full = random_weight(128, 64, 32, gen)
    cols = slice(16, 56)
    qw = QuantizedWeight(
        full.qweight[:, cols], full.zeros[:, cols], full.scales[:, cols], full.group_size
    )
    assert not qw.qweight.is_contiguous()
    x = torch.randn(5, 160, generator=gen).half()[:, 16:144]
    expected = x.float() @ qw.dequantize()
    torch.testing.assert_close(run(x, qw).float(), expected, **TOLERANCES[torch.float16])


def test_split_k_is_deterministic_and_leaves_its_counters_at_zero():
    cfg = W4A16Config(16, 16, 32, 1, 1, split_k=4)
    gen = torch.Generator().manual_seed(5)
    qw = random_weight(256, 40, 64, gen)
    x = torch.randn(3, 256, generator=gen).half()
    first, second = run(x, qw, cfg), run(x, qw, cfg)
    # The last split to arrive sums the partials in split order, whichever it is.
    assert torch.equal(first, second)
    device = torch.empty(0, device=DEVICE).device  # "cuda:0", as the counters are keyed
    counters = w4a16_module._counters[device]
    assert int(counters.count_nonzero()) == 0  # every tile's last arrival reset its counter


def test_empty_and_invalid_inputs():
    gen = torch.Generator().manual_seed(6)
    dev = on_device(random_weight(64, 16, 32, gen))
    args = (dev.qweight, dev.scales, dev.zeros, None, 32)
    empty = w4a16_matmul(torch.empty(0, 64, dtype=torch.float16, device=DEVICE), *args)
    assert empty.shape == (0, 16)
    with pytest.raises(ValueError, match="columns"):
        w4a16_matmul(torch.zeros(2, 72, dtype=torch.float16, device=DEVICE), *args)
    with pytest.raises(ValueError, match="integer zero points"):
        w4a16_matmul(
            torch.zeros(2, 64, dtype=torch.float16, device=DEVICE),
            dev.qweight, dev.scales, dev.zeros.half(), None, 32,
        )  # fmt: skip
    with pytest.raises(ValueError, match="multiple of 8"):
        w4a16_matmul(torch.zeros(2, 64, dtype=torch.float16, device=DEVICE), *args[:4], 12)
    with pytest.raises(ValueError, match="do not cover 4 groups"):  # group 16: 4 groups
        w4a16_matmul(torch.zeros(2, 64, dtype=torch.float16, device=DEVICE), *args[:4], 16)
    with pytest.raises(ValueError, match="g_idx must be int32"):
        g_idx = torch.zeros(64, dtype=torch.int64, device=DEVICE)
        w4a16_matmul(torch.zeros(2, 64, dtype=torch.float16, device=DEVICE), *args[:3], g_idx, 32)


def test_split_heuristic():
    sms = 132
    # Decode on a wide layer: enough splits for WAVES programs per SM, capped by K tiles.
    assert choose_split_k(64, 32, sms, m=1, k=4096) == 32 // 4
    assert choose_split_k(172, 32, sms, m=1, k=4096) == -(-WAVES * sms // 172)
    assert choose_split_k(8, 1024, sms, m=1, k=131072) == MAX_SPLIT_K
    # Memory-bound grids keep the partials' traffic under half the weight bytes: K / 16M.
    assert choose_split_k(32, 64, sms, m=64, k=4096) == 4096 // (16 * 64)
    # Grids that fill the GPU are not split; compute-bound ones aim for one program per SM.
    assert choose_split_k(WAVES * sms, 32, sms, m=1, k=4096) == 1
    assert choose_split_k(512, 64, sms, m=4096, k=4096) == 1
    assert choose_split_k(64, 64, sms, m=256, k=4096) == 3


def test_tiles_too_small_for_a_gpu_are_refused_there_and_never_chosen(monkeypatch):
    # 16 x 16 weight tiles gave wrong products on an H100 (MIN_GPU_TILE_WORDS): compiled, such
    # an explicit config is an error; the interpreter, which has no such bug, still runs it.
    tiny = W4A16Config(32, 16, 16, 1, 1, split_k=1)
    with pytest.raises(ValueError, match="16 x 16 weight tile"):
        check_tile(tiny, compiled=True)
    check_tile(tiny, compiled=False)
    check_tile(W4A16Config(16, 16, 32, 1, 1), compiled=True)  # 64 words: right on the H100
    # Every config default_config picks for a GPU is large enough.
    monkeypatch.setattr("shard.platforms.cuda.kernels.w4a16_config.interpreting", lambda: False)
    for dtype in DTYPES:
        for m in (1, 7, 16, 17, 64, 65, 256, 4096):
            for group_size in (16, 32, 48, 64, 128):
                for act_order in (False, True):
                    cfg = default_config(m, 4096, group_size, dtype, 132, act_order)
                    check_tile(cfg, compiled=True)
