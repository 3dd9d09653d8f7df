"""Top-k, top-p and typical-p for sampled rows, on each row's largest logits only.

Semantics are HF's TopK/TopP/MinP/TypicalLogitsWarper applied in that order after
temperature, each renormalizing what the previous one kept. Each warper keeps an interval of
logit values: top-k, top-p and min-p a top segment, typical-p the values nearest the row's
"typical" logit. So the work can run on each row's K largest logits (its candidates), from one
`torch.topk` instead of a sort of the whole vocabulary, as long as nothing that decides the
outcome lies past them. Every step checks that (a strict gap between what it keeps and the
largest logit left out); rows that fail are redone with GROWTH times as many candidates, up
to the whole row, where the check always holds.

That check is read on the host and picks a subset of rows: free on the CPU, but on a device it
makes the host wait, and a captured graph cannot hold it. Where the platform keeps shapes
static (`Platform.static_shapes`), rows stay whole: top-k, top-p and min-p each keep the logits
at or above a threshold, so `truncate_rows` masks each row below its `kept_floor`, which the
platform's kernel finds without sorting the row (the CUDA one: a search over the floats' bits,
shard/platforms/cuda/kernels/truncation.py), or else a sort. Typical-p keeps an interval in the
middle instead: with it, `full_width_group` starts from the whole row, sorted, and skips the
check.

Ties at a boundary are kept together, where HF's sort would split them arbitrarily.

A group's columns are in token-id order when sampled (`CandidateGroup.in_id_order`), as whole
rows are: the draw's inversion of its tail runs in column order, so the same kept set and seed
give the same token on every path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from shard.platforms import platform_of

NEG_INF = float("-inf")
POS_INF = float("inf")

# First number of candidates per row. Typical nuclei are far smaller, and topk stays cheap.
CANDIDATES = 256
GROWTH = 8


@dataclass(frozen=True)
class Warpers:
    """Per-row warper parameters ([R] each) and whole-row statistics some rows need."""

    temperature: Tensor
    top_k: Tensor  # 0 = off
    top_p: Tensor  # 1 = off
    typical_p: Tensor  # 1 = off
    min_p: Tensor  # 0 = off
    lse: Tensor | None = None  # logsumexp of each whole tempered row
    entropy: Tensor | None = None  # entropy of each whole tempered row's softmax

    def select(self, idx: Tensor) -> Warpers:
        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[idx]

        return Warpers(
            self.temperature[idx],
            self.top_k[idx],
            self.top_p[idx],
            self.typical_p[idx],
            self.min_p[idx],
            pick(self.lse),
            pick(self.entropy),
        )


@dataclass(frozen=True)
class CandidateGroup:
    """Rows whose kept tokens are all among their `width` largest logits."""

    rows: Tensor  # [r] positions in the rows given to candidate_groups
    logits: Tensor  # [r, width] tempered logits, descending, -inf where a warper removed them
    ids: Tensor  # [r, width] token ids

    def in_id_order(self) -> CandidateGroup:
        """The same candidates with each row's columns in token-id order."""
        ids, order = self.ids.sort(dim=1)
        return CandidateGroup(self.rows, self.logits.gather(1, order), ids)


def candidate_groups(
    raw: Tensor,
    warpers: Warpers,
    *,
    top_k: bool,
    top_p: bool,
    typical: bool,
    min_p: bool = False,
    min_width: int = 0,
) -> Iterator[CandidateGroup]:
    """Truncate every row of raw [R, V] (logits before temperature; not modified).

    top_k/top_p/typical/min_p say whether any row uses that warper (host flags, to skip work).
    Groups together cover every row once; every group is at least min(min_width, V) wide.
    """
    rows_total, vocab = raw.shape
    k_on = warpers.top_k > 0
    p_on = warpers.top_p < 1
    t_on = warpers.typical_p < 1
    # A row without top-k starts from the whole vocabulary, whose normalizer (and, for
    # typical-p alone, entropy) no candidate set can give.
    need_lse, need_entropy = torch.stack(
        [(~k_on & (p_on | t_on)).any(), (~k_on & ~p_on & t_on).any()]
    ).tolist()
    if need_lse or need_entropy:
        tempered = raw / warpers.temperature[:, None]
        warpers = replace(
            warpers,
            lse=tempered.logsumexp(dim=1) if need_lse else None,
            entropy=_entropy(tempered) if need_entropy else None,
        )
        del tempered

    pending = torch.arange(rows_total, device=raw.device)
    width = min(vocab, max(CANDIDATES, min_width))
    used = _Used(top_k, top_p, typical, min_p)
    while True:
        raw_vals, ids = raw.topk(width, dim=1)
        whole_row = width == vocab
        vals, cut = _warp(raw_vals, warpers, whole_row, used)

        # A row no warper cut (not expected from callers) is only exact as the whole row.
        ok = cut.ok & cut.contained
        if whole_row or bool(ok.all()):
            yield CandidateGroup(pending, vals, ids)
            return
        done = ok.nonzero().squeeze(1)
        if done.shape[0] > 0:
            yield CandidateGroup(pending[done], vals[done], ids[done])
        retry = (~ok).nonzero().squeeze(1)
        pending, raw, warpers = pending[retry], raw[retry], warpers.select(retry)
        width = min(vocab, width * GROWTH)


def full_width_group(
    raw: Tensor, warpers: Warpers, *, top_k: bool, top_p: bool, typical: bool, min_p: bool = False
) -> CandidateGroup:
    """candidate_groups' result on whole sorted rows, for a device whose shapes must not depend
    on the data: every row's candidates are all its logits, so no check can fail, and there is
    nothing to read back and no row to redo. The kept sets are the same (ties aside: a sort
    and topk may order equal logits differently); whole-row statistics come from the
    candidates then, so the cut-offs may differ from the other path's in float32 rounding."""
    raw_vals, ids = raw.sort(dim=1, descending=True)
    vals, _ = _warp(raw_vals, warpers, True, _Used(top_k, top_p, typical, min_p))
    return CandidateGroup(torch.arange(raw.shape[0], device=raw.device), vals, ids)


def truncate_rows(x: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor) -> Tensor:
    """Tempered logits x [R, V] with what top-k, top-p and min-p remove at -inf (a new tensor);
    shapes fixed by x alone. A row with every warper off comes back unchanged."""
    floor = kept_floor(x, top_k, top_p, min_p)
    return x.masked_fill(x < floor[:, None], NEG_INF)


def kept_floor(x: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor) -> Tensor:
    """Each row's smallest logit [R] that top-k, top-p and min-p (HF's order, each renormalizing
    what the previous one kept) keep of tempered logits x [R, V]: the row keeps x >= floor.
    The platform's kernel where it has one, else the warpers on whole sorted rows."""
    floor = platform_of(x).truncation_floor(x, top_k, top_p, min_p)
    if floor is not None:
        return floor
    vals = x.sort(dim=1, descending=True).values
    ones = torch.ones_like(top_p)
    warpers = Warpers(temperature=ones, top_k=top_k, top_p=top_p, typical_p=ones, min_p=min_p)
    _, cut = _warp(vals, warpers, True, _Used(top_k=True, top_p=True, typical=False, min_p=True))
    return vals.masked_fill(~cut.keep, POS_INF).amin(dim=1)


@dataclass(frozen=True)
class _Used:
    """Which warpers any row uses (host flags, to skip the others)."""

    top_k: bool
    top_p: bool
    typical: bool
    min_p: bool


def _warp(raw_vals: Tensor, warpers: Warpers, whole_row: bool, used: _Used) -> tuple[Tensor, _Cut]:
    """Tempered candidates raw_vals [R, K] (descending) with what the warpers removed at -inf,
    and the cut that says whether the candidates sufficed."""
    # Dividing by t > 0 keeps the order, and gives bit for bit the tempered logits.
    vals = raw_vals / warpers.temperature[:, None]
    cut = _Cut.start(vals, whole_row)
    if used.top_k:
        _cut_top_k(cut, warpers.top_k)
    if used.top_p:
        _cut_top_p(cut, warpers.top_p, warpers.lse)
    if used.min_p:
        _cut_min_p(cut, warpers.min_p)
    if used.typical:
        _cut_typical(cut, warpers.typical_p, warpers.lse, warpers.entropy)
    return vals.masked_fill_(~cut.keep, NEG_INF), cut


def _entropy(x: Tensor) -> Tensor:
    logq = torch.log_softmax(x, dim=1)
    return -(logq.exp() * logq).nansum(dim=1)  # nansum: 0 * -inf for -inf logits


@dataclass
class _Cut:
    """Truncation state of some rows on their candidates."""

    vals: Tensor  # [R, K] candidate logits, descending
    keep: Tensor  # [R, K] candidates kept so far
    contained: Tensor  # [R] every token kept so far is a candidate
    ok: Tensor  # [R] nothing decided so far depends on what lies past the candidates
    whole_row: bool  # the candidates are the whole row

    @classmethod
    def start(cls, vals: Tensor, whole_row: bool) -> _Cut:
        rows = vals.shape[0]
        return cls(
            vals=vals,
            keep=torch.ones_like(vals, dtype=torch.bool),
            contained=torch.full((rows,), whole_row, dtype=torch.bool, device=vals.device),
            ok=torch.ones(rows, dtype=torch.bool, device=vals.device),
            whole_row=whole_row,
        )

    def above_edge(self, threshold: Tensor) -> Tensor:
        """Whether every logit >= threshold is a candidate: the ones left out are <= the
        smallest candidate, so a strictly larger threshold proves it."""
        return (self.vals[:, -1] < threshold) | self.whole_row

    def update(self, on: Tensor, keep: Tensor, contained: Tensor) -> None:
        """Apply one warper's result to the rows where it is on."""
        self.keep = torch.where(on[:, None], keep, self.keep)
        self.contained = torch.where(on, contained, self.contained)
        self.ok &= ~on | contained

    def kept_lse(self, row_lse: Tensor | None) -> Tensor:
        """logsumexp over the tokens kept so far: each warper renormalizes."""
        lse = self.vals.masked_fill(~self.keep, NEG_INF).logsumexp(dim=1)
        return lse if row_lse is None else torch.where(self.contained, lse, row_lse)


def _cut_top_k(cut: _Cut, top_k: Tensor) -> None:
    """HF TopK: keep the logits >= the k-th largest."""
    k = top_k.clamp(1, cut.vals.shape[1])  # the width exceeds every top_k below V
    tau = cut.vals.gather(1, (k - 1)[:, None]).squeeze(1)
    cut.update(top_k > 0, cut.vals >= tau[:, None], cut.above_edge(tau))


def _cut_top_p(cut: _Cut, top_p: Tensor, row_lse: Tensor | None) -> None:
    """HF TopP: keep the most likely tokens while the mass before them is < top_p, that is
    the smallest set whose mass reaches top_p; at least one."""
    probs = (cut.vals - cut.kept_lse(row_lse)[:, None]).exp().masked_fill_(~cut.keep, 0)
    before = F.pad(probs.cumsum(dim=1)[:, :-1], (1, 0))
    count = ((before < top_p[:, None]) & cut.keep).sum(dim=1).clamp_(min=1)
    tau = cut.vals.gather(1, (count - 1)[:, None]).squeeze(1)
    # A row whose candidates all stay kept may continue past them: above_edge fails then.
    cut.update(top_p < 1, cut.keep & (cut.vals >= tau[:, None]), cut.above_edge(tau))


def _cut_min_p(cut: _Cut, min_p: Tensor) -> None:
    """HF MinP: keep the tokens whose probability is at least min_p times the largest one's;
    a ratio of probabilities, so the same whatever the previous warpers renormalized. The
    largest logit is always a candidate (the first), and always kept."""
    ratio = (cut.vals - cut.vals[:, :1]).exp()
    keep = cut.keep & (ratio >= min_p[:, None])
    # Tokens left out are <= the smallest candidate: contained once it falls below the bar.
    tau = cut.vals[:, :1].squeeze(1) + torch.log(min_p.clamp(min=1e-38))
    cut.update(min_p > 0, keep, cut.above_edge(tau))


def _cut_typical(
    cut: _Cut, typical_p: Tensor, row_lse: Tensor | None, row_entropy: Tensor | None
) -> None:
    """HF Typical: rank tokens by |-log p - H| and keep the best ranked while their mass is
    < typical_p, plus the one that reaches it.

    |-log p - H| = |c - x| for a per-row logit c, so the kept tokens are the logits nearest
    c, and ranking candidates only is exact as long as the cut-off distance stays below
    the distance of everything left out.
    """
    logp = cut.vals - cut.kept_lse(row_lse)[:, None]
    probs = logp.exp().masked_fill_(~cut.keep, 0)
    entropy = -(probs * logp.masked_fill(~cut.keep, 0)).nansum(dim=1)
    if row_entropy is not None:
        entropy = torch.where(cut.contained, entropy, row_entropy)
    shift = -logp - entropy[:, None]  # > 0 below c, < 0 above it
    dist = shift.abs().masked_fill_(~cut.keep, POS_INF)
    sorted_dist, order = dist.sort(dim=1)
    mass = probs.gather(1, order).cumsum(dim=1)
    last = (mass < typical_p[:, None]).sum(dim=1).clamp_(max=cut.vals.shape[1] - 1)
    limit = sorted_dist.gather(1, last[:, None])
    # Tokens left out have logits <= the smallest candidate; when that one lies below c, they
    # are all at least its distance away.
    edge_shift = shift[:, -1]
    contained = cut.contained | ((edge_shift > 0) & (limit.squeeze(1) < edge_shift))
    cut.update(typical_p < 1, cut.keep & (dist <= limit), contained)
