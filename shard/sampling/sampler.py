"""Next-token selection for a batch: penalties, warpers, seeded sampling and logprobs.

Every request in a batch may have different parameters; one call handles them all with
batched tensor ops (no loop over requests). Order and semantics follow HF/TGI and vLLM: the
logit bias (OpenAI's), repetition penalty (over prompt and generated ids), then frequency and
presence penalties (over the generated ids, as OpenAI defines them), on every row; the token
masks of structured output (shard/sampling/token_masks.py) on constrained rows; then
temperature, top-k, top-p and typical-p (do_sample rows only), then the choice. Logprobs are
log_softmax of the logits that were sampled from: biased, penalized and masked, and for sampled
rows also warped.

On CPU at B=64, V=150k a full sort or a random number per vocabulary entry costs far more
than everything else, so neither is on the common path:
- rows that truncate (top-k/top-p/typical-p) work on their K largest logits only
  (`torch.topk`); K grows only for rows whose kept set may reach past them
  (`shard.sampling.truncation`);
- Gumbel noise is drawn for each row's HEAD_SIZE most likely tokens only; the rest are
  drawn from by inverting their cumulative distribution, and only when a per-row draw lands
  in their probability mass (`_draw`).

Both shortcuts choose rows by the data, which the host must read: free where the host is the
device, but on a GPU each read makes the host wait for everything queued, and a step captured
as a CUDA graph cannot hold one. Where the platform says shapes are static
(`Platform.static_shapes`), sample() reads nothing back and every shape follows from the
batch alone: truncated rows stay whole, masked below the smallest logit their warpers keep (a
platform kernel finds it without a sort; typical-p still sorts), and every sampled row's tail
is inverted, the draw then selecting between head and tail. The random numbers are the same,
and the tail is inverted in token-id order on every path, so are the ids (up to float32
rounding at a cut-off or in a normalizer) and the distribution.
Which rows are dense or truncated is the host's to know (shard/sampling/tensors.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from shard.platforms import platform_of
from shard.sampling import random_hash
from shard.sampling.tensors import SamplingFlags, SamplingTensors
from shard.sampling.token_masks import TokenMasks, apply_token_masks
from shard.sampling.truncation import (
    CandidateGroup,
    Warpers,
    candidate_groups,
    full_width_group,
    truncate_rows,
)

# SamplingTensors and SamplingFlags live in tensors.py; callers import them from here too.
__all__ = ["SampleOutput", "SamplingFlags", "SamplingTensors", "greedy_ids", "sample"]

NEG_INF = float("-inf")
# Where a repetition penalty's result saturates: no model's logit comes near it, and divided
# by the smallest temperature the router sends (1e-5) it is still a finite float32.
PENALIZED_LOGIT_LIMIT = 1e30

# Tokens that get their own Gumbel draw every step; other tokens are drawn from only with the
# probability mass outside them (usually a few percent).
HEAD_SIZE = 128
# Columns per block of the tail's two-level inversion (`_invert_tail`).
TAIL_BLOCK = 256


@dataclass(frozen=True)
class SampleOutput:
    next_ids: Tensor  # [B] int64
    logprobs: Tensor  # [B] float32, log-prob of next_ids under the processed distribution
    top_ids: Tensor  # [B, n] int64, n = min(max_top_n, V), by logprob descending
    top_logprobs: Tensor  # [B, n] float32 (-inf for tokens the warpers removed)

    @classmethod
    def empty(cls, batch: int, top_n: int, device: torch.device) -> SampleOutput:
        return cls(
            next_ids=torch.empty(batch, dtype=torch.int64, device=device),
            logprobs=torch.empty(batch, dtype=torch.float32, device=device),
            top_ids=torch.empty((batch, top_n), dtype=torch.int64, device=device),
            top_logprobs=torch.empty((batch, top_n), dtype=torch.float32, device=device),
        )

    @classmethod
    def chosen_only(cls, next_ids: Tensor, logprobs: Tensor) -> SampleOutput:
        """The output of rows that asked for no alternatives: empty [B, 0] columns, no kernel."""
        rows = logprobs.shape[0]
        return cls(
            next_ids,
            logprobs,
            logprobs.new_empty((rows, 0), dtype=torch.int64),
            logprobs.new_empty((rows, 0)),
        )

    def write(self, rows: Tensor, part: SampleOutput) -> None:
        """Store part's rows at the given row indices."""
        for f in fields(self):
            getattr(self, f.name).index_copy_(0, rows, getattr(part, f.name))


def sample(
    logits: Tensor,
    tensors: SamplingTensors,
    history: Tensor,
    history_lens: Tensor,
    max_top_n: int = 0,
    masks: TokenMasks | None = None,
) -> SampleOutput:
    """Choose the next token of every row; logits [B, V] float32 is left unmodified.

    history [B, L] int64 holds prompt + generated ids (anything past history_lens is
    ignored); history_lens [B] also numbers the step for the random draws. `masks` confine
    the rows of constrained requests (structured output) to the tokens their grammar allows.
    """
    logits = logits.float()  # no copy when it already is
    batch, vocab = logits.shape
    top_n = max(0, min(max_top_n, vocab))
    history_lens = history_lens.to(device=logits.device, dtype=torch.int64)
    scores = apply_penalties(apply_logit_bias(logits, tensors), tensors, history, history_lens)
    scores = apply_token_masks(scores, masks, owned=scores is not logits)
    owned = scores is not logits
    # The rows' random streams, for the rows that draw (greedy batches skip some 35 small ops,
    # each a kernel launch on a GPU).
    keys = None
    if tensors.draws:
        keys = random_hash.stream_keys(tensors.seed_lo, tensors.seed_hi, history_lens)

    dense_rows, truncated_rows = tensors.dense_rows, tensors.truncated_rows
    if dense_rows.shape[0] == batch:
        return _sample_dense(scores, owned, tensors, keys, top_n)
    out = SampleOutput.empty(batch, top_n, logits.device)
    if dense_rows.shape[0] > 0:
        out.write(dense_rows, _sample_dense(scores, owned, tensors, keys, top_n))
    for rows, part in _sample_truncated(scores, tensors, keys, top_n):
        out.write(truncated_rows[rows], part)
    return out


def _sample_dense(
    scores: Tensor, owned: bool, tensors: SamplingTensors, keys: Tensor | None, top_n: int
) -> SampleOutput:
    """Greedy rows, and sampled rows without truncation (their distribution spans the whole
    vocabulary, so they need the full log_softmax anyway)."""
    rows, sampled = tensors.dense_rows, tensors.dense_sampled
    x = scores
    if rows.shape[0] < scores.shape[0]:
        x, owned = scores.index_select(0, rows), True
    if tensors.flags.any_temperature and sampled.shape[0] > 0:
        # Greedy rows divide by 1.0, which leaves them bit for bit unchanged.
        temperature = torch.where(tensors.do_sample, tensors.temperature, 1.0)[rows, None]
        x = x.div_(temperature) if owned else x / temperature

    logprobs = torch.log_softmax(x, dim=-1)
    next_ids = greedy_ids(x)
    if sampled.shape[0] > 0:
        assert keys is not None, "sampled rows have their random streams"
        # log_softmax's normalizer, recovered exactly where x is largest (x - max == 0 there).
        lse = x.gather(1, next_ids[:, None]) - logprobs.gather(1, next_ids[:, None])
        values = x if sampled.shape[0] == rows.shape[0] else x.index_select(0, sampled)
        picked = draw(values, lse.squeeze(1)[sampled], keys[rows][sampled])
        next_ids.index_copy_(0, sampled, picked)

    chosen = logprobs.gather(1, next_ids[:, None]).squeeze(1)
    if not top_n:  # no kernel for nothing
        return SampleOutput.chosen_only(next_ids, chosen)
    top_logprobs, top_ids = logprobs.topk(top_n, dim=-1)
    return SampleOutput(next_ids, chosen, top_ids, top_logprobs)


def greedy_ids(x: Tensor) -> Tensor:
    """x.argmax(dim=-1) of float32 scores [B, V]: the platform's kernel where it has one (on the
    CPU the native one: the same choice, the first maximum, NaN above all, several times faster
    than torch's over a vocabulary)."""
    out = platform_of(x).argmax(x)
    return x.argmax(dim=-1) if out is None else out


def _sample_truncated(
    scores: Tensor, tensors: SamplingTensors, keys: Tensor | None, top_n: int
) -> Iterator[tuple[Tensor, SampleOutput]]:
    """Sampled rows with top-k/top-p/min-p/typical-p: on candidate logits only, or where shapes
    must not depend on the data, on whole rows (masked below each row's kept floor; with
    typical-p, sorted).

    Yields (positions in tensors.truncated_rows, their outputs), one group per candidate
    width that was needed (one group on whole rows).
    """
    rows = tensors.truncated_rows
    if rows.shape[0] == 0:
        return
    assert keys is not None, "sampled rows have their random streams"
    raw = scores if rows.shape[0] == scores.shape[0] else scores.index_select(0, rows)
    warpers = Warpers(
        temperature=tensors.temperature[rows],
        top_k=tensors.top_k[rows],
        top_p=tensors.top_p[rows],
        typical_p=tensors.typical_p[rows],
        min_p=tensors.min_p[rows],
    )
    flags = tensors.flags
    used = {
        "top_k": flags.any_top_k,
        "top_p": flags.any_top_p,
        "typical": flags.any_typical,
        "min_p": flags.any_min_p,
    }
    keys = keys[rows]
    if platform_of(scores).static_shapes:
        if not flags.any_typical:  # whole rows, each masked below its threshold: no sort
            tempered = raw / warpers.temperature[:, None]
            values = truncate_rows(tempered, warpers.top_k, warpers.top_p, warpers.min_p)
            everyone = torch.arange(rows.shape[0], device=rows.device)
            yield everyone, sample_rows(values, keys, top_n, static=True)
            return
        groups = [full_width_group(raw, warpers, **used)]
    else:
        groups = candidate_groups(raw, warpers, **used, min_width=max(top_n, flags.max_top_k + 1))
    for group in groups:
        yield group.rows, sample_group(group.in_id_order(), keys[group.rows], top_n)


def sample_group(
    group: CandidateGroup, keys: Tensor, top_n: int, static: bool | None = None
) -> SampleOutput:
    """A draw from each row of a truncated group (keys: its rows' random streams); every group
    is at least top_n wide, so its top_n columns are distinct real tokens."""
    return sample_rows(group.logits, keys, top_n, group.ids, static)


def sample_rows(
    values: Tensor,
    keys: Tensor,
    top_n: int,
    ids: Tensor | None = None,
    static: bool | None = None,
) -> SampleOutput:
    """A draw from each row of truncated logits values [R, W], -inf where removed (they drop
    out of the normalizer and the draw); ids [R, W] each column's token (None: the column is
    the token). Its logprobs are the truncated distribution's.

    The normalizer is summed in float64 and rounded once: the same kept set then gives the
    same float32 normalizer (so the same logprobs and draw) whatever the columns' layout,
    candidates or whole rows, where a float32 sum rounds by its order."""
    lse = values.double().logsumexp(dim=1).float()
    logprobs = values - lse[:, None]
    column = draw(values, lse, keys, ids, static)
    chosen = logprobs.gather(1, column[:, None]).squeeze(1)
    next_ids = column if ids is None else ids.gather(1, column[:, None]).squeeze(1)
    if not top_n:
        return SampleOutput.chosen_only(next_ids, chosen)
    top_logprobs, top_columns = logprobs.topk(top_n, dim=1)
    top_ids = top_columns if ids is None else ids.gather(1, top_columns)
    return SampleOutput(next_ids, chosen, top_ids, top_logprobs)


# --- logit bias and penalties ---------------------------------------------------------------


def apply_logit_bias(logits: Tensor, tensors: SamplingTensors) -> Tensor:
    """logits plus each row's bias on its tokens: logits itself when no row has one, else a
    new tensor. A row's ids are distinct and its padding adds 0.0, so the unordered
    scatter_add gives every rank the same sums."""
    if not tensors.flags.any_logit_bias:
        return logits
    return logits.scatter_add(1, tensors.bias_ids, tensors.bias_values)


def apply_penalties(
    logits: Tensor, tensors: SamplingTensors, history: Tensor, history_lens: Tensor
) -> Tensor:
    """Repetition, then frequency and presence penalties on every row: logits itself when no
    row has one, else a new tensor.

    Repetition (HF): a token present in the history (prompt and generated ids) has its logit
    divided by the penalty when positive, multiplied when negative. Frequency and presence
    (OpenAI, as vLLM applies them): subtract frequency * count + presence * (count > 0), the
    count over the generated ids only. Works on the [B, L] gathered history entries rather
    than on [B, V].
    """
    flags = tensors.flags
    if not flags.any_penalty or history.shape[1] == 0:
        return logits
    history = history.to(device=logits.device, dtype=torch.int64)
    vocab = logits.shape[1]
    positions = torch.arange(history.shape[1], device=logits.device)
    # Ids the logits have no entry for (a tokenizer larger than the LM head) cannot be
    # generated, so like HF they are left out rather than failing the batch.
    valid = (positions[None, :] < history_lens[:, None]) & (history >= 0) & (history < vocab)
    nonempty = valid.any(dim=1)
    # Padding points at the row's first valid token: it then writes back exactly the value
    # of that token's real occurrence, so the scatter below leaves it as intended.
    first = history.gather(1, valid.to(torch.uint8).argmax(dim=1, keepdim=True))
    ids = torch.where(valid, history, torch.where(nonempty[:, None], first, 0))

    scores = logits.clone()
    picked = scores.gather(1, ids)
    if flags.any_repetition:
        penalty = torch.where(nonempty, tensors.repetition_penalty, 1.0)[:, None]
        # An extreme penalty (the router allows any positive float32) must not turn a logit
        # into inf, or 0 / 0 into NaN: the penalty stays a normal float and the result
        # saturates where the temperature cannot overflow it again (>= 1e-5, the router's).
        penalty = penalty.clamp(min=torch.finfo(torch.float32).tiny)
        picked = torch.where(picked < 0, picked * penalty, picked / penalty)
        picked = picked.clamp(-PENALIZED_LOGIT_LIMIT, PENALIZED_LOGIT_LIMIT)
    if flags.any_frequency or flags.any_presence:
        generated = valid & (positions[None, :] >= tensors.output_start[:, None])
        # Sums of ones are exact in any order (scatter_add is unordered on GPU), so every
        # rank gets the same counts. A prompt-only token counts 0 and keeps its value.
        counts = torch.zeros_like(scores).scatter_add_(1, ids, generated.to(scores.dtype))
        count = counts.gather(1, ids)
        picked = picked - tensors.frequency_penalty[:, None] * count
        picked = picked - tensors.presence_penalty[:, None] * (count > 0).to(scores.dtype)
    # Duplicate ids carry identical values, so the unordered scatter is deterministic.
    return scores.scatter_(1, ids, picked)


# --- the draw --------------------------------------------------------------------------------


def draw(
    values: Tensor,
    lse: Tensor,
    keys: Tensor,
    ids: Tensor | None = None,
    static: bool | None = None,
) -> Tensor:
    """Column of one sample per row from softmax(values), with counter-based randomness.

    values [R, W] logits (-inf = removed), lse [R] their logsumexp, keys [R] the rows' random
    streams, ids [R, W] the token id of each column (None: the column is the token id).

    The row is split into its HEAD_SIZE largest values and the rest (the tail): a per-row
    uniform picks the tail with probability equal to the tail's mass, and the token is drawn
    within the chosen part: Gumbel-max over the head (a hash per head token), inversion of
    the tail's cumulative distribution with one more per-row uniform (a hash per tail token
    would cost ~20 integer ops per vocabulary entry: ~0.4 ms a row at V=49k on CPU, against
    ~0.05 ms for an exp and a cumulative sum). P(token) = P(part) * P(token | part), and
    every random number is a function of (seed, step, token id or row counter), so the draw
    depends on nothing but the row itself.

    `static`: whether shapes must not depend on the data (default: the platform's
    `static_shapes`; a captured graph's head asks for it wherever it runs).
    """
    width = values.shape[1]
    head = min(HEAD_SIZE, width)
    head_vals, head_cols = values.topk(head, dim=1)
    head_ids = head_cols if ids is None else ids.gather(1, head_cols)
    noise = random_hash.gumbel(keys[:, None], random_hash.token_codes(head_ids))
    picked = head_cols.gather(1, (head_vals + noise).argmax(dim=1, keepdim=True)).squeeze(1)
    if head == width:
        return picked

    # 1 - head mass instead of a logsumexp over the tail, which would cost two more passes
    # over [R, V]; the tail's probability is then off by float32 rounding (~1e-6) at most.
    head_mass = (head_vals.double() - lse.double()[:, None]).exp().sum(dim=1)
    choose_tail = _row_uniform(keys, random_hash.ROW_COUNTER) < 1 - head_mass
    if static is None:
        static = platform_of(values).static_shapes
    if static:
        # Every row's tail is inverted and the choice is a selection: the same ids, since a
        # row's uniforms depend on its key alone, and no row subset for the host to size.
        target = _row_uniform(keys, random_hash.TAIL_COUNTER)
        cols = _invert_tail(values, head_cols, lse, target)
        return torch.where(choose_tail & (cols >= 0), cols, picked)
    tail_rows = choose_tail.nonzero().squeeze(1)
    if tail_rows.shape[0] == 0:
        return picked
    target = _row_uniform(keys[tail_rows], random_hash.TAIL_COUNTER)
    cols = _invert_tail(
        values.index_select(0, tail_rows), head_cols[tail_rows], lse[tail_rows], target
    )
    # -1 where the tail held removed tokens only (rounding made its mass look positive):
    # those rows keep the head's pick.
    picked[tail_rows] = torch.where(cols >= 0, cols, picked[tail_rows])
    return picked


def _invert_tail(values: Tensor, head_cols: Tensor, lse: Tensor, u: Tensor) -> Tensor:
    """For each row of values [R, W], the column whose cumulative probability over the tail
    (every column but head_cols, in column order) first exceeds the fraction u [R] of the
    tail's mass; -1 where the tail has no mass. Two levels (blocks of TAIL_BLOCK columns, then
    within the chosen block), so no cumulative sum runs over a whole row: CPU cumsum is
    sequential."""
    n, width = values.shape
    blocks = -(-width // TAIL_BLOCK)
    tail = values.new_full((n, blocks * TAIL_BLOCK), NEG_INF)
    tail[:, :width] = values
    tail.scatter_(1, head_cols, NEG_INF)
    probs = tail.sub_(lse[:, None]).exp_().view(n, blocks, TAIL_BLOCK)  # removed, head: 0
    mass = probs.sum(dim=2).double()  # [n, blocks]
    cdf = mass.cumsum(dim=1)
    target = u * cdf[:, -1]
    block = torch.searchsorted(cdf, target[:, None], right=True).clamp_(max=blocks - 1)
    # Where in the chosen block, as a fraction of its mass (< 1 whatever the rounding).
    before = (cdf.gather(1, block) - mass.gather(1, block)).squeeze(1)
    fraction = ((target - before) / mass.gather(1, block).squeeze(1)).clamp_(0, 1 - 2**-52)
    inner = probs.gather(1, block[:, :, None].expand(-1, 1, TAIL_BLOCK)).squeeze(1)
    inner_cdf = inner.cumsum(dim=1, dtype=torch.float64)
    offset = torch.searchsorted(inner_cdf, (fraction * inner_cdf[:, -1])[:, None], right=True)
    cols = block.squeeze(1) * TAIL_BLOCK + offset.squeeze(1).clamp_(max=TAIL_BLOCK - 1)
    return torch.where(inner_cdf[:, -1] > 0, cols, -1)


def _row_uniform(keys: Tensor, counter: int) -> Tensor:
    """A float64 uniform in (0, 1) per row, from its stream and a counter no token id takes."""
    return random_hash.uniform64(keys, random_hash.token_codes(torch.full_like(keys, counter)))
