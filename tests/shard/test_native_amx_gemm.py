"""The AMX tile kernel for bf16 linears (shard/platforms/cpu/native/amx_gemm.cpp,
shard/platforms/cpu/matmul_amx.py): its layout, its sums against float64, and which weights the
shard hands it."""

import pytest
import torch
import torch.nn.functional as F

from shard.platforms.cpu import matmul, matmul_amx
from shard.platforms.cpu.native.build import AMX_ENV, amx_linear_kernel
from tests.shard.rounding import assert_rounded_once

needs_amx = pytest.mark.skipif(
    amx_linear_kernel() is None,
    reason="the tile kernel runs only on a CPU with AMX-BF16 whose OS lends the tiles",
)


def test_the_layout_is_the_tile_units_b_operand():
    # Layout alone (no kernel): block (b, t) row r holds, for output j, inputs 2r and 2r + 1.
    w = torch.arange(48 * 96, dtype=torch.float32).reshape(48, 96).bfloat16()
    packed = matmul_amx.pack(w)
    assert packed.shape == (3, 3, 16, 16, 2) and packed.is_contiguous()
    for b, t, r, j, p in [(0, 0, 0, 0, 0), (2, 1, 5, 7, 1), (1, 2, 15, 15, 0), (2, 2, 15, 15, 1)]:
        assert packed[b, t, r, j, p] == w[16 * b + j, 32 * t + 2 * r + p]
    assert matmul_amx.is_packed(packed) and not matmul_amx.is_packed(w)
    assert torch.equal(matmul_amx.unpack(packed), w)


@needs_amx
@pytest.mark.parametrize("rows", [1, 7, 16, 17, 32, 33, 100])
@pytest.mark.parametrize("out_in", [(16, 32), (48, 96), (1040, 576), (576, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_sums_are_exact_products_in_fp32_rounded_once(rows, out_in, bias):
    # Odd block counts (48 = 3 blocks), a lone row, row counts around the 16-row tiles and their
    # pairs, and K from one block to 48.
    n, k = out_in
    torch.manual_seed(rows * n + k)
    x = torch.randn(rows, k).bfloat16()
    w = (torch.randn(n, k) * 0.1).bfloat16()
    b = torch.randn(n).bfloat16() if bias else None
    got = matmul_amx.linear(x, matmul_amx.pack(w), b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    assert_rounded_once(got, x, w, b)


@needs_amx
def test_leading_dims_strided_rows_and_no_rows():
    torch.manual_seed(0)
    w = torch.randn(64, 96).bfloat16()
    packed = matmul_amx.pack(w)
    x = torch.randn(2, 3, 96).bfloat16()
    got = matmul_amx.linear(x, packed, None)
    assert got.shape == (2, 3, 64)
    assert_rounded_once(got.reshape(6, 64), x.reshape(6, 96), w)
    wide = torch.randn(20, 200).bfloat16()
    x = wide[:, 40:136]  # rows 200 apart
    assert x.stride() == (200, 1)
    assert_rounded_once(matmul_amx.linear(x, packed, None), x, w)
    x = torch.randn(96, 20).bfloat16().t()  # columns strided: copied first
    assert_rounded_once(matmul_amx.linear(x, packed, None), x, w)
    assert matmul_amx.linear(torch.empty(0, 96).bfloat16(), packed, None).shape == (0, 64)


@needs_amx
def test_special_values_pass_through_as_in_a_gemm():
    w = torch.zeros(16, 32).bfloat16()
    w[3, 5] = 1.0
    x = torch.zeros(2, 32).bfloat16()
    x[0, 5] = float("inf")
    x[1, 5] = float("nan")
    got = matmul_amx.linear(x, matmul_amx.pack(w), None)
    assert got[0, 3] == float("inf") and torch.isnan(got[1, 3])
    assert torch.isnan(got[0, :3]).all()  # inf * 0 is NaN, as in F.linear
    assert torch.equal(got.isnan(), F.linear(x.float(), w.float()).isnan())


@needs_amx
def test_the_kernel_refuses_what_it_cannot_multiply():
    kernel = amx_linear_kernel()
    packed = matmul_amx.pack(torch.randn(32, 64).bfloat16())
    with pytest.raises(RuntimeError, match="x has 96 features, the weight 64"):
        kernel(torch.randn(2, 96).bfloat16(), packed, None)
    with pytest.raises(RuntimeError, match="must be bfloat16"):
        kernel(torch.randn(2, 64), packed, None)
    with pytest.raises(RuntimeError, match="bias must be \\[32\\] bfloat16"):
        kernel(torch.randn(2, 64).bfloat16(), packed, torch.randn(16).bfloat16())
    with pytest.raises(RuntimeError, match="must be packed"):
        kernel(torch.randn(2, 64).bfloat16(), torch.randn(32, 64).bfloat16(), None)


@needs_amx
def test_the_shard_packs_bf16_weights_that_tile_and_only_those():
    tiles = torch.randn(48, 64).bfloat16()
    assert matmul_amx.is_packed(matmul.prepare_weight(tiles))
    for other in (
        torch.randn(40, 64).bfloat16(),
        torch.randn(48, 48).bfloat16(),
        torch.randn(48, 64),
    ):
        prepared = matmul.prepare_weight(other)
        assert not matmul_amx.is_packed(prepared)
        assert torch.equal(matmul.dense(prepared), other)
    prepared = matmul.prepare_weight(tiles)
    assert matmul.is_packed(prepared) and torch.equal(matmul.dense(prepared), tiles)
    x = torch.randn(5, 64).bfloat16()
    assert_rounded_once(matmul.linear(x, prepared), x, tiles)


@needs_amx
def test_the_switch_keeps_onednn(monkeypatch):
    monkeypatch.setenv(AMX_ENV, "0")
    w = torch.randn(48, 64).bfloat16()
    prepared = matmul.prepare_weight(w)
    assert prepared.is_mkldnn
    # A weight packed before the switch still multiplies (through its plain form).
    monkeypatch.setenv(AMX_ENV, "1")
    packed = matmul.prepare_weight(w)
    monkeypatch.setenv(AMX_ENV, "0")
    x = torch.randn(3, 64).bfloat16()
    assert_rounded_once(matmul.linear(x, packed), x, w)


@needs_amx
def test_a_bf16_model_multiplies_on_the_tiles_and_tracks_transformers(tiny_model):
    from paged_helpers import run_paged

    from shard.distributed import Distributed
    from shard.layers.quant.unquantized import DenseWeight
    from shard.models import load_model
    from tests.shard.test_models_vs_transformers import prompts, ref_logits, reference

    path = tiny_model("qwen2_bias")  # q/k/v biases: the kernel's bias path
    ours = load_model(path, dtype=torch.bfloat16, device=torch.device("cpu"), dist=Distributed())
    dense = [m for m in ours.modules() if isinstance(m, DenseWeight)]
    assert dense and all(matmul_amx.is_packed(m.weight) for m in dense)
    assert matmul_amx.is_packed(ours.lm_head.weight)
    ref = reference(path)
    batch = prompts(ours.vocab_size)
    steps = 3
    logits, tokens = run_paged(ours, batch, steps=steps)
    start = 0
    for prompt in batch:  # bf16 activations: close to float32's logits, as in the oneDNN path
        want = ref_logits(ref, prompt.tolist())
        torch.testing.assert_close(logits[0][start : start + len(prompt)], want, atol=3e-2, rtol=0)
        start += len(prompt)
    for step in range(1, steps + 1):
        for row, (prompt, seq) in enumerate(zip(batch, tokens, strict=True)):
            want = ref_logits(ref, seq[: len(prompt) + step])[-1]
            torch.testing.assert_close(logits[step][row], want, atol=3e-2, rtol=0)


@needs_amx
def test_long_prefills_go_to_onednn_on_the_plain_weight(monkeypatch):
    # Past ONEDNN_ROWS rows the kernel is not called; the result is the same product.
    monkeypatch.setattr(matmul_amx, "ONEDNN_ROWS", 40)
    calls = []
    kernel = amx_linear_kernel()
    monkeypatch.setattr(
        matmul_amx, "amx_linear_kernel", lambda: lambda *a: calls.append(1) or kernel(*a)
    )
    torch.manual_seed(1)
    w, b = torch.randn(48, 64).bfloat16(), torch.randn(48).bfloat16()
    packed = matmul_amx.pack(w)
    x = torch.randn(39, 64).bfloat16()
    assert_rounded_once(matmul_amx.linear(x, packed, b), x, w, b)
    assert calls == [1]
    x = torch.randn(40, 64).bfloat16()
    assert_rounded_once(matmul_amx.linear(x, packed, b), x, w, b)
    assert calls == [1]
