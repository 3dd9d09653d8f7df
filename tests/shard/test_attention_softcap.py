"""Attention-logit soft-capping (Gemma 2) through the whole attention stack, against float64
attention written out as transformers' Gemma 2 eager attention computes it: s = (q . k) * scale,
s = softcap * tanh(s / softcap), then the causal / window mask, then the softmax.

Every path the backends take is checked: the torch backend with its native kernels, with the
SDPA-sized sequences that must take the explicit scores path instead (SDPA cannot cap), without
the kernels (as SWITCHYARD_CPU_KERNELS=0 leaves it), with native=False; the Triton backend
(interpreted on a CPU); and the --compile custom op. Prefill with a cached prefix, decode and
mixed steps; with and without a window; GQA; float32 and bfloat16.

The scores (q at 4x unit size, unit k, head dim 64, scale 1/8: a spread of ~4) run well past the
cap of 3, so a path that ignored the cap would miss by far more than the tolerance: each case
checks that too.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from paged_helpers import NATIVE_REASON, PagedLayout

from shard.attention import MixedMetadata, attend
from shard.attention.metadata import StepMetadata
from shard.platforms.cpu import attention as torch_backend
from shard.platforms.cpu.attention import TorchAttentionBackend
from tests.shard.paged_helpers import meta_on
from tests.shard.test_cpu_paged_prefill import _reference as paged_reference

BLOCK = 16
SCALE, SOFTCAP = 0.125, 3.0
HEADS, KV_HEADS, DIM = 6, 2, 64  # GQA, a group of 3
# Against float64: fp32 paths accumulate in fp32 (the Triton interpreter's exp2-based tanh adds
# an ulp of 1 times the cap); bf16 outputs are rounded once (and the Triton kernel rounds the
# probabilities to bf16 for P V).
TOL = {torch.float32: 5e-5, torch.bfloat16: 2e-2}
# Prefill sequences as (cached prefix, new tokens): fresh prompts, chunks after a prefix shorter
# and longer than the window, a single token; decode rows by their context after the step.
CHUNKS = [(0, 19), (21, 12), (40, 1), (5, 33)]
DECODES = [1, 17, 50]
WINDOW = 9


@dataclass
class Step:
    """One step's inputs, with the float64 truth per sequence."""

    cache: torch.Tensor  # the prefix K/V written, NaN everywhere else
    meta: StepMetadata
    q: torch.Tensor  # [T, H, D], the step's tokens, prefill part first
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    spans: list[tuple[int, int]]  # (cached prefix, new tokens) per sequence, in token order
    keys: list[torch.Tensor]  # float64 [prefix + new, Hkv, D] per sequence
    values: list[torch.Tensor]

    def to(self, device: torch.device) -> Step:
        meta = self.meta
        if isinstance(meta, MixedMetadata):
            meta = MixedMetadata(
                meta.slot_mapping.to(device),
                meta_on(meta.prefill, device),
                meta_on(meta.decode, device),
                meta.num_prefill_tokens,
            )
        else:
            meta = meta_on(meta, device)
        cache, q, k, v = (t.to(device) for t in (self.cache, self.q, self.k, self.v))
        return Step(cache, meta, q, k, v, self.spans, self.keys, self.values)


def _step(
    chunks: list[tuple[int, int]], decodes: list[int], dtype: torch.dtype, seed: int = 0
) -> Step:
    """A step of prefill chunks and decode rows (either may be empty) over a NaN-poisoned paged
    cache holding each sequence's cached prefix; the step's own K/V are for attend() to store."""
    gen = torch.Generator().manual_seed(seed)
    spans = [*chunks, *((n - 1, 1) for n in decodes)]
    blocks = sum(-(-(p + n) // BLOCK) for p, n in spans) + 4
    layout = PagedLayout(BLOCK, num_blocks=blocks, seed=seed)
    seqs = [layout.add(p + n) for p, n in spans]
    cache = torch.full((2, blocks, BLOCK, KV_HEADS, DIM), float("nan"), dtype=dtype)
    keys, values, new_k, new_v = [], [], [], []
    for s, (prefix, new) in zip(seqs, spans, strict=True):
        k = torch.randn(prefix + new, KV_HEADS, DIM, generator=gen).to(dtype)
        v = torch.randn(prefix + new, KV_HEADS, DIM, generator=gen).to(dtype)
        for p in range(prefix):
            cache[0].view(-1, KV_HEADS, DIM)[layout.slot(s, p)] = k[p]
            cache[1].view(-1, KV_HEADS, DIM)[layout.slot(s, p)] = v[p]
        keys.append(k.double())
        values.append(v.double())
        new_k.append(k[prefix:])
        new_v.append(v[prefix:])
    tokens = sum(n for _, n in spans)
    q = (torch.randn(tokens, HEADS, DIM, generator=gen) * 4).to(dtype)
    n_pre = len(chunks)
    prefill = decode = None
    if chunks:
        starts = [p for p, _ in chunks]
        _, prefill = layout.prefill(seqs[:n_pre], starts, [p + n for p, n in chunks])
    if decodes:
        _, decode = layout.decode(seqs[n_pre:], [n - 1 for n in decodes])
    if prefill is not None and decode is not None:
        n = sum(n for _, n in chunks)
        slots = torch.cat([prefill.slot_mapping, decode.slot_mapping])
        meta: StepMetadata = MixedMetadata(slots, prefill, decode, n)
    else:
        meta = prefill if prefill is not None else decode
    return Step(cache, meta, q, torch.cat(new_k), torch.cat(new_v), spans, keys, values)


def _reference(step: Step, window: int | None, softcap: float | None) -> torch.Tensor:
    """float64, Gemma 2's eager order: scale, cap, mask, softmax."""
    # the truth on the host, where the float64 keys and values are, whatever ran the step
    return paged_reference(step.q.cpu(), step.spans, step.keys, step.values, SCALE, window, softcap)


STEPS = {
    "prefill": (CHUNKS, []),
    "decode": ([], DECODES),
    "mixed": (CHUNKS[:2], DECODES),
}


def _check(backend, step: Step, window: int | None, dtype: torch.dtype) -> None:
    """attend() with the cap against float64, and the cap's effect far past the tolerance."""
    out = attend(backend, step.q, step.k, step.v, step.cache, step.meta, SCALE, window, SOFTCAP)
    assert out.dtype == dtype and out.shape == step.q.shape
    want = _reference(step, window, SOFTCAP)
    tol = TOL[dtype]
    torch.testing.assert_close(out.double().cpu(), want, atol=tol, rtol=tol)
    uncapped = _reference(step, window, None)
    assert (want - uncapped).abs().max() > 20 * tol


needs_kernels = pytest.mark.skipif(
    NATIVE_REASON is not None, reason=f"the native kernels cannot be built here: {NATIVE_REASON}"
)


def _without_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend as it runs where the kernels are not built (or SWITCHYARD_CPU_KERNELS=0):
    every accessor it asks answers None."""
    for name in (
        "paged_decode_kernel", "paged_prefill_kernel", "amx_paged_prefill_kernel", "store_kv_kernel"
    ):  # fmt: skip
        monkeypatch.setattr(torch_backend, name, lambda: None)


def _sdpa_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """SDPA cannot cap: a soft-capped call that reached it would silently ignore the cap."""

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a soft-capped call reached SDPA")

    monkeypatch.setattr(torch_backend.F, "scaled_dot_product_attention", refuse)


TORCH_PATHS = [
    pytest.param("native", marks=needs_kernels),
    # The kernels on, but every prefill sequence past their line: the explicit scores path,
    # in chunks of a few queries.
    pytest.param("native+explicit", marks=needs_kernels),
    "no-kernels",
    "torch",
]


@pytest.mark.parametrize("path", TORCH_PATHS)
@pytest.mark.parametrize("kind", list(STEPS))
@pytest.mark.parametrize("window", [None, WINDOW])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_torch_backend(monkeypatch, path, kind, window, dtype):
    _sdpa_refused(monkeypatch)
    if path == "native+explicit":
        monkeypatch.setattr(torch_backend, "NATIVE_PREFILL_CELLS", 0)
        monkeypatch.setattr(torch_backend, "AMX_PREFILL_CELLS", 0)
        monkeypatch.setattr(torch_backend, "EXPLICIT_SCORES_PER_CHUNK", 5 * HEADS * 60)
    if path == "no-kernels":
        _without_kernels(monkeypatch)
    backend = TorchAttentionBackend(native=path != "torch")
    _check(backend, _step(*STEPS[kind], dtype, seed=1), window, dtype)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_kernels_and_the_explicit_path_split_one_step(monkeypatch, dtype):
    """Short sequences to the prefill kernel, long ones to the explicit path, in one step."""
    monkeypatch.setattr(torch_backend, "NATIVE_PREFILL_CELLS", 20 * 40)
    monkeypatch.setattr(torch_backend, "AMX_PREFILL_CELLS", 20 * 40)
    step = _step(CHUNKS, [], dtype, seed=2)
    plan = torch_backend._prefill_plan(step.meta, BLOCK, WINDOW)
    native, rest = torch_backend._native_prefill_split(step.meta, plan, WINDOW, 20 * 40)
    assert native and rest, "the case must exercise both paths"
    _sdpa_refused(monkeypatch)
    _check(TorchAttentionBackend(), step, WINDOW, dtype)


@pytest.mark.parametrize("native", [True, False])
def test_no_cap_is_the_uncapped_path(native):
    """softcap None and 0 both mean off: the result is the plain path's, bit for bit."""
    step = _step(CHUNKS[:2], DECODES, torch.float32, seed=3)
    backend = TorchAttentionBackend(native=native)
    args = (step.q, step.k, step.v)
    plain = attend(backend, *args, step.cache.clone(), step.meta, SCALE, WINDOW)
    for off in (None, 0.0):
        got = attend(backend, *args, step.cache.clone(), step.meta, SCALE, WINDOW, off)
        assert torch.equal(got, plain)
    torch.testing.assert_close(plain.double(), _reference(step, WINDOW, None), atol=5e-5, rtol=0)


@pytest.mark.parametrize("kind", list(STEPS))
@pytest.mark.parametrize("window", [None, WINDOW])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_backend(kind, window, dtype):
    pytest.importorskip("triton", reason="triton is not installed")
    from shard.platforms.cuda.attention import TritonAttentionBackend
    from shard.platforms.cuda.kernels import interpreting

    device = torch.device("cpu" if interpreting() else "cuda")
    step = _step(*STEPS[kind], dtype, seed=4).to(device)
    _check(TritonAttentionBackend(), step, window, dtype)


@pytest.mark.parametrize("kind", ["prefill", "mixed"])
def test_the_compiled_op_carries_the_cap(kind):
    """--compile: attend() becomes switchyard::attend, whose schema carries the cap to the
    backend (traced by dynamo, run eagerly: no inductor build needed to check the plumbing)."""
    from shard.platforms.cpu import compiled

    step = _step(*STEPS[kind], torch.float32, seed=5)
    backend = TorchAttentionBackend()

    def forward(q, k, v, cache):  # type: ignore[no-untyped-def]
        return attend(backend, q, k, v, cache, step.meta, SCALE, WINDOW, SOFTCAP)

    compiled._STEP.backend, compiled._STEP.meta = backend, step.meta
    try:
        out = torch.compile(forward, backend="eager", fullgraph=True)(
            step.q, step.k, step.v, step.cache
        )
    finally:
        compiled._STEP.backend = compiled._STEP.meta = None
    want = _reference(step, WINDOW, SOFTCAP)
    torch.testing.assert_close(out.double(), want, atol=5e-5, rtol=5e-5)
    assert (want - _reference(step, WINDOW, None)).abs().max() > 0.1
