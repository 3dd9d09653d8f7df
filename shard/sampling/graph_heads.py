"""The end of a decode step inside its CUDA graph: the logits, the sampling, each row's token and
its logprob (shard/platforms/cuda/graphs.py captures and replays them; shard/runner.py picks one).

Why: sampled eagerly after the graph, a step launches some 15 to 60 small kernels from Python,
which on a GPU cost more host time than the graph's one launch. A graph cannot hold shapes that
depend on the data or on the batch's mix, so a head runs every row through the same operations,
reading each row's parameters from static buffers. A row that does not use a stage holds the
value that leaves its logits bit for bit unchanged (no bias, penalties of 1 and 0, every token
allowed, temperature 1, no cut-off), so each row gets what the eager sampler
(shard/sampling/sampler.py), which skips the stages no row uses, gives it with static shapes.

The heads:
- "greedy": the argmax and its logprob, for steps whose rows all choose greedily and ask
  nothing else of the sampler (the common case; nothing to fill).
- "sample": also logit bias, repetition/frequency/presence penalties, grammar masks,
  temperature and the seeded draw (whole-vocabulary rows, the static draw).
- "truncate": also top-k, top-p and min-p on whole rows masked below each row's kept floor, as
  a GPU's eager sampler does (truncation.truncate_rows: a kernel's search, no sort); rows that
  do not truncate keep "sample"'s answer, as sample() splits them. It is a head of its own
  because it draws a second time, from the masked rows.

"sample" and "truncate" also give each row's most likely tokens (alternatives,
`top_n_tokens`) at a width fixed at capture: the most the router allows (its Warmup batch asks
for them), so every step asking for alternatives replays them, and a greedy step asking for
some takes "sample".

A step runs its graph's forward pass and samples eagerly where no head holds it: more
alternatives than the heads were captured for, typical-p (a second sort of the vocabulary, and
rare), prompt logprobs, a logit bias wider than BIAS_WIDTH, penalties over a history longer
than HISTORY_WIDTH.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
from torch import Tensor

from shard.sampling import random_hash
from shard.sampling.sampler import (
    SamplingFlags,
    SamplingTensors,
    apply_logit_bias,
    apply_penalties,
    draw,
    greedy_ids,
    sample_rows,
)
from shard.sampling.token_masks import BITS_PER_WORD, TokenMasks
from shard.sampling.truncation import truncate_rows

GREEDY, SAMPLE, TRUNCATE = "greedy", "sample", "truncate"
NAMES = (GREEDY, SAMPLE, TRUNCATE)

# A row's logit_bias entries a head holds: the OpenAI route's limit
# (router/api/openai.py: MAX_LOGIT_BIAS_TOKENS); a wider row samples eagerly.
BIAS_WIDTH = 1024
# Alternatives the sampling heads give each row when Warmup does not say (its batch empty): the
# router's default --max-top-n-tokens (router/validation.py: MAX_TOP_N_TOKENS).
DEFAULT_TOP_N = 5
# History positions the penalties see inside a graph: every sampling head runs them over
# this width each step, penalties or not, so it is bounded rather than the longest request
# (a 128k context would hold ~0.5 GB of buffers and temporaries in each bucket's graphs).
HISTORY_WIDTH = 16384

# Every stage on: the heads apply each to every row, with neutral values where a row has none.
_EVERY_STAGE = SamplingFlags(
    any_temperature=True,
    any_top_k=True,
    any_top_p=True,
    any_min_p=True,
    any_repetition=True,
    any_frequency=True,
    any_presence=True,
    any_logit_bias=True,
)

# The per-row parameters a head reads, and the value that makes each stage leave a row alone.
_NEUTRAL: dict[str, tuple[torch.dtype, float]] = {
    "temperature": (torch.float32, 1.0),
    "top_k": (torch.int64, 0),
    "top_p": (torch.float32, 1.0),
    "min_p": (torch.float32, 0.0),
    "do_sample": (torch.bool, False),
    "seed_lo": (torch.int64, 0),
    "seed_hi": (torch.int64, 0),
    "repetition_penalty": (torch.float32, 1.0),
    "frequency_penalty": (torch.float32, 0.0),
    "presence_penalty": (torch.float32, 0.0),
    "output_start": (torch.int64, 0),
}


class SamplingHeads:
    """The heads of one model's decode graphs and the static buffers they read, sized at
    `allocate` (the graphs' capture) for the largest bucket."""

    def __init__(self, model, block_size: int) -> None:
        self.model = model
        self.block_size = block_size
        self.rows = 0  # allocated for (0: not yet)
        self.top_n = 0  # alternatives the sampling heads give each row
        self._filled: SamplingTensors | None = None  # whose parameters the buffers hold
        self._masked = False  # whether some row's mask is in `words`

    @property
    def names(self) -> tuple[str, ...]:
        return NAMES

    def allocate(
        self, rows: int, block_table_width: int, device: torch.device, top_n: int = 0
    ) -> None:
        """Buffers for up to `rows` rows whose histories fit block tables this wide, and heads
        giving `top_n` alternatives (fixed until the next capture)."""
        vocab = self.model.vocab_size
        self.top_n = min(top_n, vocab)
        self.params = {
            name: torch.full((rows,), value, dtype=dtype, device=device)
            for name, (dtype, value) in _NEUTRAL.items()
        }
        self.params["bias_ids"] = torch.zeros(rows, BIAS_WIDTH, dtype=torch.int64, device=device)
        self.params["bias_values"] = torch.zeros(rows, BIAS_WIDTH, device=device)
        width = min(block_table_width * self.block_size + 1, HISTORY_WIDTH)
        self.history = torch.zeros(rows, width, dtype=torch.int64, device=device)
        self.history_lens = torch.zeros(rows, dtype=torch.int64, device=device)
        words = -(-vocab // BITS_PER_WORD)
        self.words = torch.full((rows, words), -1, dtype=torch.int32, device=device)
        self.rows = rows
        self._filled, self._masked = None, False

    def head(self, name: str) -> Callable[[Tensor], tuple[Tensor, ...]]:
        """The captured function of one head: hidden [n, H] -> (ids [n], logprobs [n]) and,
        but for "greedy", (top ids [n, top_n], top logprobs [n, top_n])."""
        if name == GREEDY:
            return self.greedy
        return lambda hidden: self.sample(hidden, truncate=name == TRUNCATE)

    # -- which head, and its inputs --------------------------------------------------------

    def prepare(
        self,
        sampling: SamplingTensors,
        history: Tensor,
        history_lens: Tensor,
        masks: TokenMasks | None,
        top_n: int = 0,
        longest: int = 0,
    ) -> str | None:
        """The head that holds a step whose rows sample once each with `sampling`, from
        `history` [B, L] (`history_lens` [B] long each, `longest` at most: the host's count,
        needed with penalties), within `masks`, `top_n` alternatives at most; its buffers
        filled from them (device copies, nothing read back). None: no head holds it."""
        flags = sampling.flags
        if flags.any_typical or top_n > self.top_n or not 0 < len(sampling) <= self.rows:
            return None
        plain = not (sampling.draws or flags.any_penalty or flags.any_logit_bias or top_n)
        if plain and masks is None:
            return GREEDY
        host = sampling.host
        longest = min(longest, history.shape[1])
        if host.bias_ids.shape[1] > BIAS_WIDTH or longest > self.history.shape[1]:
            return None
        rows = len(sampling)
        if sampling is not self._filled:  # a new batch composition: its parameters, once
            self._fill_params(sampling)
        if flags.any_penalty:  # otherwise the penalties leave every row alone, whatever it holds
            self.history[:rows, :longest].copy_(history[:, :longest])
        self.history_lens[:rows].copy_(history_lens)
        if masks is not None or self._masked:
            self.words.fill_(-1)  # every token allowed, for the rows without a mask
            self._masked = masks is not None
        if masks is not None:
            width = self.words.shape[1]
            words = masks.words[:, :width]
            # Words the mask lacks allow nothing (TokenMasks.allowed).
            words = torch.nn.functional.pad(words, (0, width - words.shape[1]))
            self.words.index_copy_(0, masks.rows, words)
        return TRUNCATE if host.truncated_rows.shape[0] else SAMPLE

    def _fill_params(self, sampling: SamplingTensors) -> None:
        rows, width = len(sampling), sampling.bias_ids.shape[1]
        for name in _NEUTRAL:
            self.params[name][:rows].copy_(getattr(sampling, name))
        for name in ("bias_ids", "bias_values"):
            self.params[name][:rows, :width].copy_(getattr(sampling, name))
            self.params[name][:rows, width:].zero_()  # (token 0, +0.0): adds nothing
        self._filled = sampling  # held, so its id is not reused for another

    # -- the heads ------------------------------------------------------------------------

    def _logits(self, hidden: Tensor) -> Tensor:
        return self.model.compute_logits(hidden).float()

    def greedy(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """The operations `sample` runs for a greedy row that asks nothing else of it."""
        x = self._logits(hidden)
        logprobs = torch.log_softmax(x, dim=-1)
        ids = greedy_ids(x)
        return ids, logprobs.gather(1, ids[:, None]).squeeze(1)

    def sample(self, hidden: Tensor, truncate: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Every row through bias, penalties, mask, temperature and the draw (and with
        `truncate`, top-k/top-p/min-p), its buffers' parameters deciding what each does; each
        row's token, its logprob and its `top_n` alternatives."""
        n = hidden.shape[0]
        p = SimpleNamespace(
            **{name: buffer[:n] for name, buffer in self.params.items()}, flags=_EVERY_STAGE
        )
        lens = self.history_lens[:n]
        logits = self._logits(hidden)
        scores = apply_penalties(apply_logit_bias(logits, p), p, self.history[:n], lens)
        rows = torch.arange(n, device=hidden.device)
        allowed = TokenMasks(rows, self.words[:n]).allowed(scores.shape[1])
        scores = scores.masked_fill_(~allowed, float("-inf"))  # a new tensor: the bias's
        keys = random_hash.stream_keys(p.seed_lo, p.seed_hi, lens)

        # As sample()'s dense rows: greedy ones divide by 1.0, bit for bit unchanged.
        x = scores / torch.where(p.do_sample, p.temperature, 1.0)[:, None]
        logprobs = torch.log_softmax(x, dim=-1)
        best = greedy_ids(x)[:, None]
        lse = (x.gather(1, best) - logprobs.gather(1, best)).squeeze(1)
        ids = torch.where(p.do_sample, draw(x, lse, keys, static=True), best.squeeze(1))
        chosen = logprobs.gather(1, ids[:, None]).squeeze(1)
        top_logprobs, top_ids = logprobs.topk(self.top_n, dim=-1)
        if not truncate:
            return ids, chosen, top_ids, top_logprobs

        # As sample()'s truncated rows on a static platform: whole rows (x holds them tempered)
        # masked below their kept floors; the others' warpers made neutral, so that nothing in
        # their (discarded) answers can fail.
        cuts = (p.top_k > 0) | (p.top_p < 1) | (p.min_p > 0)
        truncates = p.do_sample & cuts
        values = truncate_rows(
            x,
            torch.where(truncates, p.top_k, 0),
            torch.where(truncates, p.top_p, 1.0),
            torch.where(truncates, p.min_p, 0.0),
        )
        cut = sample_rows(values, keys, top_ids.shape[1], static=True)
        return (
            torch.where(truncates, cut.next_ids, ids),
            torch.where(truncates, cut.logprobs, chosen),
            torch.where(truncates[:, None], cut.top_ids, top_ids),
            torch.where(truncates[:, None], cut.top_logprobs, top_logprobs),
        )
