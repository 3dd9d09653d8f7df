"""The fused MoE kernel (shard/platforms/cuda/kernels/fused_moe.py) against a float64 reference
computed here with einsums over every (token, choice) pair, and its align step checked directly.

Inputs are sized so that gate and up are ~N(0, 1) and the output O(1) (|out| up to ~3): x
~N(0, 1), w13 ~N(0, 1/H), w2 ~N(0, 1/I), top-k weights positive and summing to 1 per token.
The reference uses the very same (already rounded) inputs and rounds nothing before the end.
"Seen" is the largest |error| / (atol + rtol |ref|) over the cases below in the interpreter.

Tolerances (atol = rtol):
  fp32 1e-5: ieee dots (no TF32), fp32 activations and sums; only the summation order and
      exp/erf's last bits differ from float64 (seen: 1%).
  fp16 5e-3: gate, up, act(gate) and act(gate) * up are each rounded to fp16 (half an ulp,
      2^-11 relative, each), then I of those products are summed by the down GEMM and the
      output rounded once more: a few 2^-11 relative errors adding up, about 2e-3 at worst.
  bf16 4e-2: the same roundings with bf16's 2^-8, about eight times fp16's; in triton's
      interpreter fp32 -> bf16 conversions truncate (a whole ulp, 2^-7 relative, biased
      towards 0), which doubles that (seen: 30%).
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_cases import DEVICE

from shard.platforms.cuda.kernels.fused_moe import Tiles, fused_moe, moe_align
from shard.platforms.fp8_scales import Fp8Scales

TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=4e-2, rtol=4e-2),
}
GATES = {
    "silu": torch.nn.functional.silu,
    "gelu_pytorch_tanh": lambda g: torch.nn.functional.gelu(g, approximate="tanh"),
    "gelu": torch.nn.functional.gelu,
}


def route(tokens: int, experts: int, top_k: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """topk_ids [T, K] int32, K distinct experts per token (or -1).
    uniform: any experts; uneven: expert e drawn with weight 2^-e and the last two never
    (empty experts); one: every token on expert 1 (K = 1); parallel: drawn from 2E experts,
    those of the other rank (>= E) become -1, and token 0 has only -1."""
    if kind == "one":
        return torch.ones(tokens, 1, dtype=torch.int32)
    pool = 2 * experts if kind == "parallel" else experts
    probs = torch.ones(tokens, pool)
    if kind == "uneven":
        probs = 2.0 ** -torch.arange(pool, dtype=torch.float32).expand(tokens, pool).clone()
        probs[:, -2:] = 0
    ids = torch.multinomial(probs, top_k, generator=gen).to(torch.int32)
    if kind == "parallel":
        ids[ids >= experts] = -1
        ids[0] = -1
    return ids


def reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    act: str,
) -> torch.Tensor:
    """sum over k of weights[t, k] * w2[e] @ (act(gate) * up), [gate; up] = w13[e] @ x[t], in
    float64, each pair on its own (kept pairs only)."""
    x, w13, w2 = x.double(), w13.double(), w2.double()
    chosen = ids.long().clamp(min=0)
    product = torch.einsum("th,tkoh->tko", x, w13[chosen])  # [T, K, 2I]
    gate, up = product.chunk(2, dim=-1)
    rows = torch.einsum("tki,tkhi->tkh", GATES[act](gate) * up, w2[chosen])  # [T, K, H]
    kept = (ids >= 0).double() * weights.double()
    return torch.einsum("tk,tkh->th", kept, rows)


def make_case(
    tokens: int, hidden: int, inter: int, experts: int, top_k: int, kind: str, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """x [T, H], w13 [E, 2I, H], w2 [E, H, I] (float32, CPU), weights, ids."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / math.sqrt(hidden)
    w2 = torch.randn(experts, hidden, inter, generator=gen) / math.sqrt(inter)
    ids = route(tokens, experts, top_k, kind, gen)
    weights = torch.rand(ids.shape, generator=gen) + 0.1
    weights /= weights.sum(-1, keepdim=True)
    return x, w13, w2, weights, ids


# (tokens, hidden, inter, experts, top_k, routing, dtype, act, tiles): odd H and I throughout
# but one case (the unmasked K loops); None tiles: default_tiles (16-row blocks for all of
# these), else several N tiles, K steps with a tail, or 64-row blocks.
CASES = [
    (1, 33, 19, 4, 1, "uniform", torch.float32, "silu", None),
    (1, 33, 19, 8, 8, "uniform", torch.bfloat16, "gelu_pytorch_tanh", None),
    (40, 33, 19, 6, 2, "uneven", torch.float32, "gelu_pytorch_tanh", Tiles(16, 16, 16)),
    (40, 33, 19, 6, 2, "uneven", torch.bfloat16, "silu", None),
    (37, 64, 32, 4, 1, "one", torch.bfloat16, "silu", Tiles(64, 32, 16)),
    (40, 33, 19, 10, 8, "parallel", torch.float32, "silu", Tiles(16, 16, 16)),
    (40, 33, 19, 10, 8, "parallel", torch.bfloat16, "gelu", None),
    (23, 33, 19, 8, 2, "uniform", torch.float16, "silu", Tiles(64, 16, 32)),
]


@pytest.mark.parametrize(("tokens", "hidden", "inter", "experts", "top_k", "kind", "dtype",
                          "act", "tiles"), CASES)  # fmt: skip
def test_matches_float64_reference(
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    kind: str,
    dtype: torch.dtype,
    act: str,
    tiles: Tiles | None,
) -> None:
    x, w13, w2, weights, ids = make_case(tokens, hidden, inter, experts, top_k, kind)
    x, w13, w2 = x.to(dtype), w13.to(dtype), w2.to(dtype)
    args = (t.to(DEVICE) for t in (x, w13, w2, weights, ids))
    out = fused_moe(*args, act, tiles=tiles)
    assert out.shape == x.shape and out.dtype == dtype
    expected = reference(x, w13, w2, weights, ids, act)
    if kind == "parallel":  # a token whose experts are all another rank's gets exactly 0
        assert not out[0].any()
    torch.testing.assert_close(out.cpu().double(), expected, **TOLERANCES[dtype])


def biased_reference(x, w13, w2, b13, b2, weights, ids, alpha, limit) -> torch.Tensor:
    """gpt-oss's experts in float64: biases after each product, the clamped SwiGLU, the down
    bias before the top-k weight (b13 or b2 None: none)."""
    x, w13, w2 = x.double(), w13.double(), w2.double()
    chosen = ids.long().clamp(min=0)
    product = torch.einsum("th,tkoh->tko", x, w13[chosen])
    if b13 is not None:
        product = product + b13.double()[chosen]
    gate, up = product.chunk(2, dim=-1)
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    hidden = (up + 1) * gate * torch.sigmoid(alpha * gate)
    rows = torch.einsum("tki,tkhi->tkh", hidden, w2[chosen])
    if b2 is not None:
        rows = rows + b2.double()[chosen]
    kept = (ids >= 0).double() * weights.double()
    return torch.einsum("tk,tkh->th", kept, rows)


def ungated_reference(x, w1, w2, weights, ids, act: str) -> torch.Tensor:
    """Ungated experts (Nemotron 3's) in float64: act(w1[e] @ x[t]) through w2[e]."""
    x, w1, w2 = x.double(), w1.double(), w2.double()
    chosen = ids.long().clamp(min=0)
    up = torch.einsum("th,tkoh->tko", x, w1[chosen])
    hidden = torch.relu(up) ** 2 if act == "relu2" else GATES[act](up)
    rows = torch.einsum("tki,tkhi->tkh", hidden, w2[chosen])
    kept = (ids >= 0).double() * weights.double()
    return torch.einsum("tk,tkh->th", kept, rows)


@pytest.mark.parametrize(
    ("tokens", "top_k", "kind", "dtype", "act", "tiles", "biased"),
    [(40, 2, "uneven", torch.float32, "relu2", Tiles(16, 16, 16), False),
     (40, 4, "parallel", torch.bfloat16, "relu2", None, True),
     (1, 3, "uniform", torch.float32, "silu", None, False)],
)  # fmt: skip
def test_ungated_experts_match_float64(tokens, top_k, kind, dtype, act, tiles, biased):
    """Nemotron 3's experts: the up projection alone ([E, I, H]) and act(up), relu^2 above all;
    the kernel and the grouped torch form (every platform's without it) alike."""
    from shard.platforms.grouped_moe import grouped_experts

    x, w13, w2, weights, ids = make_case(tokens, 33, 19, 6, top_k, kind, seed=3)
    w1 = w13[:, :19].contiguous()  # [E, I, H]
    b1 = torch.randn(6, 19, generator=torch.Generator().manual_seed(8)) if biased else None
    x, w1, w2 = x.to(dtype), w1.to(dtype), w2.to(dtype)
    b1 = None if b1 is None else b1.to(dtype)
    expected = ungated_reference(x, w1, w2, weights, ids, act)
    if b1 is not None:  # the bias after the product, as the grouped form adds it
        chosen = ids.long().clamp(min=0)
        up = torch.einsum("th,tkoh->tko", x.double(), w1.double()[chosen]) + b1.double()[chosen]
        hidden = torch.relu(up) ** 2
        rows = torch.einsum("tki,tkhi->tkh", hidden, w2.double()[chosen])
        expected = torch.einsum("tk,tkh->th", (ids >= 0).double() * weights.double(), rows)
    on = [t.to(DEVICE) for t in (x, w1, w2, weights, ids)]
    bias = None if b1 is None else b1.to(DEVICE)
    out = fused_moe(*on, act, gated=False, w13_bias=bias, tiles=tiles)
    torch.testing.assert_close(out.cpu().double(), expected, **TOLERANCES[dtype])
    grouped = grouped_experts(x, w1, w2, weights, ids, act, gated=False, w13_bias=b1)
    torch.testing.assert_close(grouped.double(), expected, **TOLERANCES[dtype])
    # the same weights read as gated experts are refused by shape, and relu^2 is ungated only
    with pytest.raises(ValueError, match=r"\[E, 2I, H\]"):
        fused_moe(*on, "silu")
    with pytest.raises(ValueError, match="no gated activation 'relu2'"):
        fused_moe(*on[:1], torch.cat([on[1], on[1]], 1), *on[2:], "relu2")


@pytest.mark.parametrize("biases", ["both", "gate_up", "down"])
@pytest.mark.parametrize(
    ("tokens", "top_k", "kind", "dtype", "tiles"),
    [(40, 2, "uneven", torch.float32, Tiles(16, 16, 16)), (40, 4, "parallel", torch.bfloat16, None),
     (1, 1, "uniform", torch.float32, None)],
)  # fmt: skip
def test_biases_and_the_clamped_swiglu_match_float64(biases, tokens, top_k, kind, dtype, tiles):
    """gpt-oss's experts: a bias on either product, the clamped SwiGLU with both clamps binding
    (the weights scaled so gate and up run past the limit), uneven loads, empty experts, ids of
    another rank, odd sizes."""
    x, w13, w2, weights, ids = make_case(tokens, 33, 19, 6, top_k, kind, seed=2)
    w13 = w13 * 3  # gate and up values of about +-3: past the limit of 1.5 on both sides
    gen = torch.Generator().manual_seed(7)
    b13 = torch.randn(6, 38, generator=gen) if biases in ("both", "gate_up") else None
    b2 = torch.randn(6, 33, generator=gen) if biases in ("both", "down") else None
    alpha, limit = 1.702, 1.5
    product = torch.einsum("th,eoh->teo", x, w13)
    assert (product[..., :19] > limit).any() and (product[..., 19:] < -limit).any()
    cast = [None if t is None else t.to(dtype) for t in (x, w13, w2, b13, b2)]
    x, w13, w2, b13, b2 = cast
    out = fused_moe(
        *(t.to(DEVICE) for t in (x, w13, w2, weights, ids)), "clamped_swiglu",
        w13_bias=None if b13 is None else b13.to(DEVICE),
        w2_bias=None if b2 is None else b2.to(DEVICE),
        swiglu_alpha=alpha, swiglu_limit=limit, tiles=tiles,
    )  # fmt: skip
    expected = biased_reference(x, w13, w2, b13, b2, weights, ids, alpha, limit)
    torch.testing.assert_close(out.cpu().double(), expected, **TOLERANCES[dtype])
    unclamped = biased_reference(x, w13, w2, b13, b2, weights, ids, alpha, 1e9)
    assert (expected - unclamped).abs().max() > 0.1
    with pytest.raises(ValueError, match="w2_bias"):
        fused_moe(*(t.to(DEVICE) for t in (x, w13, w2, weights, ids)), "silu",
                  w2_bias=torch.zeros(6, 32, dtype=dtype, device=DEVICE))  # fmt: skip


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "kind", "block_m"),
    [(1, 8, 8, "uniform", 16), (40, 6, 2, "uneven", 16), (40, 10, 8, "parallel", 16),
     (37, 4, 1, "one", 64), (400, 10, 3, "parallel", 64)],
)  # fmt: skip
def test_align_sorts_and_pads_every_kept_pair_once(
    tokens: int, experts: int, top_k: int, kind: str, block_m: int
) -> None:
    ids = route(tokens, experts, top_k, kind, torch.Generator().manual_seed(1))
    plan = moe_align(ids.to(DEVICE), experts, block_m)
    sorted_ids, expert_ids = plan.sorted_ids.cpu().tolist(), plan.expert_ids.cpu().tolist()
    total = int(plan.total.item())
    flat = ids.reshape(-1).tolist()
    pairs = len(flat)
    assert plan.num_pairs == pairs and plan.block_m == block_m
    assert len(sorted_ids) == plan.max_blocks * block_m
    # Each expert's pairs in pair order, padded with the sentinel to whole blocks.
    expected: list[int] = []
    expected_blocks: list[int] = []
    for e in range(experts):
        run = [p for p in range(pairs) if flat[p] == e]
        padded = -(-len(run) // block_m) * block_m
        expected += run + [pairs] * (padded - len(run))
        expected_blocks += [e] * (padded // block_m)
    assert total == len(expected)
    assert sorted_ids[:total] == expected
    assert expert_ids[: total // block_m] == expected_blocks
    assert all(e == experts for e in expert_ids[total // block_m :])  # never computed
    # Dropped pairs right after the total (in blocks nobody computes), then only sentinel.
    dropped = [p for p in range(pairs) if flat[p] < 0]
    rest = sorted_ids[total:]
    assert rest[: len(dropped)] == dropped
    assert all(p == pairs for p in rest[len(dropped) :])


def fp8_experts(w: torch.Tensor, block_k: int) -> tuple[torch.Tensor, Fp8Scales]:
    """[E, rows, K] float -> FP8 values and per-(row, K block) scales (block_k = K: per
    channel), each block's scale its largest magnitude over 448."""
    e, rows, k = w.shape
    blocks = -(-k // block_k)
    padded = torch.nn.functional.pad(w, (0, blocks * block_k - k))
    largest = padded.reshape(e, rows, blocks, block_k).abs().amax(-1)
    scales = largest / torch.finfo(torch.float8_e4m3fn).max
    per_input = scales.repeat_interleave(block_k, dim=-1)[..., :k]
    return (w / per_input).to(torch.float8_e4m3fn), Fp8Scales(scales.contiguous(), block_k)


def dequantized(w: torch.Tensor, fp8: Fp8Scales) -> torch.Tensor:
    k = w.shape[-1]
    return w.double() * fp8.scales.double().repeat_interleave(fp8.block_k, dim=-1)[..., :k]


# (tokens, hidden, inter, experts, top_k, routing, dtype, block_k of w13, of w2, tiles): blocks
# narrower than the default K tile (the tile shrinks to lie in one), ragged last blocks (I = 80
# is 2.5 blocks of 32), one block per row (per channel), decode-sized and uneven batches.
FP8_CASES = [
    (40, 96, 80, 6, 2, "uneven", torch.bfloat16, 32, 32, None),
    (3, 96, 80, 4, 2, "uniform", torch.float32, 96, 80, None),
    (23, 128, 64, 8, 3, "parallel", torch.float16, 64, 16, Tiles(16, 32, 64)),
]


@pytest.mark.parametrize(("tokens", "hidden", "inter", "experts", "top_k", "kind", "dtype",
                          "block13", "block2", "tiles"), FP8_CASES)  # fmt: skip
def test_fp8_experts_match_float64_on_their_dequantized_weights(
    tokens, hidden, inter, experts, top_k, kind, dtype, block13, block2, tiles
) -> None:
    x, w13, w2, weights, ids = make_case(tokens, hidden, inter, experts, top_k, kind)
    q13, s13 = fp8_experts(w13, block13)
    q2, s2 = fp8_experts(w2, block2)
    x = x.to(dtype)
    want = reference(x, dequantized(q13, s13), dequantized(q2, s2), weights, ids, "silu")
    on = lambda s: Fp8Scales(s.scales.to(DEVICE), s.block_k)  # noqa: E731
    args = (t.to(DEVICE) for t in (x, q13, q2, weights, ids))
    out = fused_moe(*args, "silu", w13_scales=on(s13), w2_scales=on(s2), tiles=tiles)
    assert out.dtype == dtype
    torch.testing.assert_close(out.cpu().double(), want, **TOLERANCES[dtype], check_dtype=False)


def test_fp8_experts_without_scales_or_with_wrong_ones_are_refused() -> None:
    x, w13, w2, weights, ids = (t.to(DEVICE) for t in make_case(2, 32, 16, 2, 1, "uniform"))
    q13, s13 = fp8_experts(w13.cpu(), 32)
    with pytest.raises(ValueError, match="FP8 weights come with their scales"):
        fused_moe(x, q13.to(DEVICE), w2, weights, ids, "silu")
    wrong = Fp8Scales(s13.scales.to(DEVICE), 16)
    with pytest.raises(ValueError, match="not one per 16 inputs"):
        fused_moe(x, q13.to(DEVICE), w2, weights, ids, "silu", w13_scales=wrong)


def test_other_activation_names_and_mismatched_operands_are_refused() -> None:
    x, w13, w2, weights, ids = (t.to(DEVICE) for t in make_case(2, 16, 8, 2, 1, "uniform"))
    with pytest.raises(ValueError, match="activation"):
        fused_moe(x, w13, w2, weights, ids, "relu")
    with pytest.raises(ValueError, match="dtype"):
        fused_moe(x.half(), w13, w2, weights, ids, "silu")
    with pytest.raises(ValueError, match=r"\[E, H, I\]"):
        fused_moe(x, w13, w2.transpose(1, 2), weights, ids, "silu")


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs need a GPU")
def test_captures_in_a_cuda_graph() -> None:
    """Nothing is read on the host: the call captures, and replays with new routing."""
    case = make_case(8, 64, 32, 16, 4, "parallel")
    x, w13, w2, weights, ids = (t.to(DEVICE) for t in case)
    x, w13, w2 = x.bfloat16(), w13.bfloat16(), w2.bfloat16()
    fused_moe(x, w13, w2, weights, ids, "silu")  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, ids, "silu")
    new_ids = route(8, 16, 4, "uneven", torch.Generator().manual_seed(5))
    ids.copy_(new_ids)
    graph.replay()
    eager = fused_moe(x, w13, w2, weights, ids, "silu")
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
