"""The GPU's sort-free search for each row's kept floor under top-k, top-p and min-p
(shard/platforms/cuda/kernels/truncation.py) against the warpers on whole sorted rows
(shard/sampling/truncation.py: kept_floor's reference, itself held to transformers' warpers by
tests/shard/test_sampling.py): the same floor, value for value, on rows with ties, removed
tokens, flat and peaked rows, every warper alone and together."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE

from shard.platforms.cuda.kernels.truncation import BLOCK, truncation_floor
from shard.sampling.truncation import kept_floor


def _rows(vocab: int, seed: int) -> torch.Tensor:
    """Eight kinds of rows: peaked, flat, bf16-rounded (many ties), with removed tokens (-inf,
    as a grammar or a bias leaves them), with large logits, and all alike."""
    g = torch.Generator().manual_seed(seed)
    peaked = torch.randn(vocab, generator=g) * 4
    flat = torch.randn(vocab, generator=g) * 0.2
    tied = (torch.randn(vocab, generator=g) * 3).bfloat16().float()
    removed = torch.randn(vocab, generator=g) * 2
    removed[torch.rand(vocab, generator=g) < 0.6] = float("-inf")
    large = torch.randn(vocab, generator=g) * 3 + 80
    negative = -torch.rand(vocab, generator=g) * 1e-3  # keys of negative floats and -0.0
    negative[::7] = -0.0
    alike = torch.zeros(vocab)
    few = torch.full((vocab,), float("-inf"))
    few[torch.randperm(vocab, generator=g)[:3]] = torch.tensor([1.0, 0.5, 0.5])
    return torch.stack([peaked, flat, tied, removed, large, negative, alike, few])


def _away_from_boundaries(x: torch.Tensor, top_k: int, fraction: float) -> float:
    """A top_p for row x halfway between two cumulative masses of its (top-k kept) sorted
    distribution that a token of probability >= 1e-4 separates (`fraction` of the way through
    those), so no float32 summation order decides where it cuts."""
    vals = x.double().sort(descending=True).values
    if 0 < top_k < vals.numel():
        vals = vals[vals >= vals[top_k - 1]]
    probs = (vals - vals.logsumexp(0)).exp()
    cum = probs.cumsum(0)
    gaps = (probs[1:] >= 1e-4).nonzero().squeeze(1)
    if gaps.numel() == 0:  # a flat row: every cut-off falls inside a tie, which stays whole
        return 0.5
    at = int(gaps[min(int(fraction * gaps.numel()), gaps.numel() - 1)])
    return float((cum[at] + cum[at + 1]) / 2)


# (top_k, top_p as a fraction of the kept tokens or a fixed value, min_p); top_p None: off.
SETTINGS = [
    (0, None, 0.0),  # nothing on: the row's minimum
    (1, None, 0.0),
    (7, None, 0.0),
    (64, None, 0.0),
    ("vocab", None, 0.0),  # top_k = V keeps everything
    ("beyond", None, 0.0),  # top_k > V likewise
    (0, 0.02, 0.0),
    (0, 0.5, 0.0),
    (0, 0.95, 0.0),
    (0, 1e-7, 0.0),  # fixed: only the largest tokens reach it
    (0, None, 0.05),
    (0, None, 0.9),
    (40, 0.3, 0.0),
    (40, 0.6, 0.02),
    (0, 0.8, 0.3),
]


@pytest.mark.parametrize("vocab", [300, BLOCK, 2 * BLOCK + 37])
@pytest.mark.parametrize("setting", range(len(SETTINGS)))
def test_the_floor_is_the_sorted_warpers_floor(vocab, setting):
    top_k, top_p, min_p = SETTINGS[setting]
    x = _rows(vocab, seed=vocab + setting)
    k = {"vocab": vocab, "beyond": vocab + 10}.get(top_k, top_k)
    rows = x.shape[0]
    if top_p is None:
        ps = [1.0] * rows
    elif top_p == 1e-7:
        ps = [top_p] * rows
    else:
        ps = [_away_from_boundaries(row, k, top_p) for row in x]
    top_k_t = torch.full((rows,), k, dtype=torch.int64)
    top_p_t = torch.tensor(ps, dtype=torch.float32)
    min_p_t = torch.full((rows,), min_p, dtype=torch.float32)
    want = kept_floor(x, top_k_t, top_p_t, min_p_t)
    got = truncation_floor(*(t.to(DEVICE) for t in (x, top_k_t, top_p_t, min_p_t))).cpu()
    assert torch.equal(got, want), (got, want)
    if k == 0 and top_p is None and min_p == 0:
        assert torch.equal(got, x.amin(dim=1))


def test_rows_of_a_wider_tensor_and_mixed_settings():
    """Each row its own warpers, rows read at a stride past their width (the head's logits
    are whole rows, but a caller may pass a view)."""
    vocab = 700
    x = _rows(vocab, seed=1)
    wide = torch.full((x.shape[0], vocab + 9), 123.0)
    wide[:, :vocab] = x
    top_k = torch.tensor([0, 3, 0, 50, 0, 2, 0, 1])
    top_p = torch.tensor(
        [_away_from_boundaries(x[0], 0, 0.1), 1.0, _away_from_boundaries(x[2], 0, 0.4), 1.0,
         _away_from_boundaries(x[4], 0, 0.05), 1.0, 1.0, 1.0]
    )  # fmt: skip
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.5, 0.0])
    want = kept_floor(x, top_k, top_p, min_p)
    view = wide.to(DEVICE)[:, :vocab]
    got = truncation_floor(view, top_k.to(DEVICE), top_p.to(DEVICE), min_p.to(DEVICE)).cpu()
    assert torch.equal(got, want), (got, want)
    # and every warper that is on cut something in these rows
    kept = (x >= got[:, None]).sum(dim=1)
    assert (kept[[0, 1, 2, 3, 4, 5]] < vocab).all()


def test_no_rows():
    x = torch.zeros(0, 50, device=DEVICE)
    none = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    assert truncation_floor(x, none, none.float(), none.float()).shape == (0,)


def test_the_static_sampler_with_the_kernel_samples_as_the_cpu_path(monkeypatch):
    """The sampler on a static platform whose kept floors come from the kernel (the CUDA
    platform's; on a CPU the interpreted kernel stands in for the CPU platform's sort) gives
    every kind of row the ids and logprobs of the CPU's candidate path."""
    from shard.platforms import platform_of
    from shard.sampling.sampler import sample
    from shard.sampling.token_masks import TokenMasks
    from tests.shard.test_sampling_static import KINDS, TOP_N, _inputs, _masks, _rows

    kinds = [k for k in KINDS if not k.startswith("typical") and k != "all_warpers"]
    params = _rows(kinds)
    logits, tensors, history, lens = _inputs(params, vocab=1000)
    masks = _masks(len(params), 1000)
    want = sample(logits, tensors, history, lens, TOP_N, masks)
    cpu = platform_of(torch.device("cpu"))
    calls = []

    def kernel(*args):
        calls.append(1)
        return truncation_floor(*args)

    if DEVICE.type == "cpu":
        monkeypatch.setattr(cpu, "static_shapes", True)
        monkeypatch.setattr(cpu, "truncation_floor", kernel)
    else:
        monkeypatch.setattr(platform_of(DEVICE), "truncation_floor", kernel)
    on = TokenMasks(masks.rows.to(DEVICE), masks.words.to(DEVICE))
    got = sample(logits.to(DEVICE), tensors.to(DEVICE), history.to(DEVICE), lens.to(DEVICE),
                 TOP_N, on)  # fmt: skip
    assert calls, "the kernel gave the floors"
    assert torch.equal(got.next_ids.cpu(), want.next_ids)
    torch.testing.assert_close(got.logprobs.cpu(), want.logprobs, atol=1e-5, rtol=0)
