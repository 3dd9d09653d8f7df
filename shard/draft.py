"""Speculative decoding with a draft model: a second, cheaper model on the shard guesses the
tokens that follow each decoding row, for the router to propose in the next step.

After a step, for every row that then decodes, the draft runs k steps of its own greedy decoding
from the row's known tokens and the shard answers those k guesses (`Generation.draft_ids`). The
router checks them as it checks any proposal (slots, EOS, grammar) and sends them back with the
next step, where the target verifies them (shard/speculation.py): so outputs stay exactly the
target's, and the draft only decides how many tokens a step buys. As vLLM's draft_model method
does, the draft guesses greedily (its distribution q is one-hot), which is what the shard's
verification is exact for.

The draft has its own KV cache, laid out as the target's: the same number of blocks of the same
size, addressed by the same block tables and slots, so the router's allocator (and its prefix
cache) serves both. Each row keeps how many leading positions hold the draft's K/V
(`Batch.draft_lens`); a draft phase first brings every row it touches up to date in one forward
pass (prompt chunks the target computed this step, the tokens accepted since the last guesses),
then runs k - 1 one-token steps. Prompt chunks are always mirrored into the draft's cache, also
in steps that do not draft, so a prompt is never recomputed at once by the draft and blocks the
prefix cache names from prompts hold the draft's K/V too. Positions generated while a row did
not draft (the router asks for no drafts past disable_by_batch_size) are caught up the next
time it drafts; a block named from such positions and found by another request's prefix holds
stale draft K/V there, which costs that request acceptance, never correctness.

The guesses' own K/V (all but the last guess's) are written past the row's known tokens; those
of guesses the target then accepts are kept (the tokens there are the ones the draft saw), the
others are overwritten by the next draft phase.

With CUDA graphs (`--cuda-graphs`), the draft has decode graphs of its own, bucketed as the
target's and captured with them, each ending with the guess (`GuessHead`): a phase's one-token
steps, and its first pass when that is one token a row, replay them; the first pass over
several tokens a row runs eagerly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch

from shard.batch import Batch
from shard.distributed import Distributed
from shard.platforms.cuda.graphs import DecodeGraphs
from shard.sampling.sampler import greedy_ids
from shard.step_inputs import build_step_inputs, upload

GUESS = "guess"


class GuessHead:
    """The end of the draft's decode graphs (shard/platforms/cuda/graphs.py's `Heads`): each
    token's greedy guess among the target's tokens."""

    names = (GUESS,)

    def __init__(self, model: torch.nn.Module, vocab_size: int) -> None:
        self.model = model
        self.vocab_size = vocab_size

    def allocate(self, rows: int, block_table_width: int, device: torch.device, top_n: int) -> None:
        """Nothing to hold: the guess reads the hidden states alone (no alternatives)."""

    def head(self, name: str):  # type: ignore[no-untyped-def]
        return lambda hidden: (self.guess(hidden),)

    def guess(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.compute_logits(hidden)
        return greedy_ids(logits[:, : self.vocab_size].float())


class DraftModel:
    def __init__(
        self,
        model: torch.nn.Module,
        dist: Distributed,
        device: torch.device,
        block_size: int,
        model_id: str,
        vocab_size: int,  # the target's: guesses past it could not be verified
        decode_path=None,  # the draft's decode steps another way where it applies (CPU)
        graph_sizes: tuple[int, ...] = (),  # the target's decode graph buckets (none: eager)
    ) -> None:
        self.model = model
        self.dist = dist
        self.device = device
        self.block_size = block_size
        self.model_id = model_id
        self.vocab_size = vocab_size
        self.decode_path = decode_path
        self.head = GuessHead(model, vocab_size)
        self.graphs = None
        if graph_sizes:
            self.graphs = DecodeGraphs(model, graph_sizes, device, heads=self.head)
        self.kv_caches: list[torch.Tensor] | None = None

    def kv_cache_bytes_per_token(self) -> int:
        return self.model.kv_cache_bytes_per_token()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = None  # the old cache goes before the new one is allocated
        self.kv_caches = self.model.allocate_kv_cache(num_blocks, self.block_size)

    def free_kv_cache(self) -> None:
        if self.graphs is not None:
            self.graphs.release()  # they write into the cache
        self.kv_caches = None

    def capture_graphs(self, block_table_width: int) -> int:
        """The draft's decode graphs against its current cache (ModelRunner.capture_graphs);
        the memory they took."""
        if self.graphs is None:
            return 0
        self.graphs.capture(self._caches(), block_table_width)
        return self.graphs.memory_bytes

    @torch.inference_mode()
    def propose(
        self, batch: Batch, k: int, emitted: Mapping[int, Sequence[int]]
    ) -> dict[int, list[int]]:
        """Up to k guessed ids for each decoding row (by row; none for a row without a KV slot
        for their verification), after the target's step that emitted `emitted` (by row).
        With k == 0 this only mirrors prompt chunks into the draft's cache."""
        self._settle(batch, emitted)
        room = torch.clamp(
            torch.tensor([r.capacity for r in batch.requests]) - batch.history_lens, min=0
        )
        # The draft's positions stop at its own context (its rotary tables end there): the
        # guess at position p is fed at p - 1, so a row guesses up to position `limit`.
        limit = self.model.max_position_embeddings
        room = torch.minimum(room, torch.clamp(limit + 1 - batch.history_lens, min=0))
        decoding = batch.history_lens - batch.cache_lens == 1
        counts = torch.where(decoding, torch.clamp(room, max=k), 0)
        drafting = counts > 0
        # How far each row's draft K/V must reach: to its last known token for a drafting row
        # (whose logits give the first guess), to the target's cache where the prompt is not
        # yet mirrored, and nowhere for the rest (caught up when they next draft).
        mirrored = torch.minimum(batch.cache_lens, torch.full_like(batch.cache_lens, limit))
        mirroring = batch.draft_lens < torch.minimum(batch.input_lens, mirrored)
        reach = torch.where(
            drafting,
            batch.history_lens,
            torch.where(mirroring, mirrored, batch.draft_lens),
        )
        q_lens = reach - batch.draft_lens
        if int(q_lens.sum()) == 0:
            return {}
        caches = self._caches()
        view = replace(
            batch,
            cache_lens=batch.draft_lens,
            lora_slots=torch.full_like(batch.lora_slots, -1),  # the draft has no adapters
        )
        self._run(view, q_lens, caches)
        batch.draft_lens = reach
        rows = drafting.nonzero().squeeze(1)
        if not len(rows):
            return {}
        # One-token steps: the j-th feeds guess j at position h - 1 + j.
        for j in range(1, int(counts.max())):
            steps = counts > j
            view = replace(
                view,
                cache_lens=batch.history_lens - 1 + j,
                history_lens=batch.history_lens + j,
            )
            self._run(view, steps.long(), caches)
        guesses = self._read(batch, rows, int(counts.max()))
        ids = {row: guesses[i][: int(counts[row])] for i, row in enumerate(rows.tolist())}
        # The K/V of every guess but the last is written; `_settle` keeps those confirmed.
        batch.guesses = {
            batch.requests[row].id: (int(batch.history_lens[row]), row_ids)
            for row, row_ids in ids.items()
        }
        return ids

    def _settle(self, batch: Batch, emitted: Mapping[int, Sequence[int]]) -> None:
        """The last phase's guesses against what the target emitted since: the draft K/V of
        each leading guess it confirmed is kept (all but the last guess have some)."""
        guesses, batch.guesses = batch.guesses, {}
        if not guesses:
            return
        for row, request in enumerate(batch.requests):
            if request.id not in guesses:
                continue
            base, ids = guesses[request.id]
            if int(batch.draft_lens[row]) != base:
                continue
            got = emitted.get(row, ())
            kept = 0
            for guess, token in zip(ids[:-1], got, strict=False):
                if guess != token:
                    break
                kept += 1
            batch.draft_lens[row] = min(base + kept, int(batch.cache_lens[row]))

    def _run(self, view: Batch, q_lens: torch.Tensor, caches: list[torch.Tensor]) -> None:
        """One forward pass of the draft over q_lens tokens per row from the view's cache
        lengths; each row that reaches its view's history length gets its greedy next token
        written into the history there."""
        inputs = build_step_inputs(view, q_lens, view.cache_lens, self.device)
        got = None
        if self.graphs is not None:  # a guess for every token, the K/V of each written
            got = self.graphs.replay(inputs.input_ids, inputs.positions, inputs.meta, head=GUESS)
        if got is None:
            forward = self.model
            if self.decode_path is not None and self.decode_path.applies(inputs.meta):
                forward = self.decode_path
            hidden = forward(inputs.input_ids, inputs.positions, caches, inputs.meta)
        if not len(inputs.host.sample_rows):
            return
        if got is not None:
            ids = got[0][inputs.sample_index]
        else:
            ids = self.head.guess(hidden[inputs.sample_index])
        if self.dist.world_size > 1:
            self.dist.broadcast(ids, src=0)  # the ranks' guesses agree by construction
        view.history[inputs.sample_rows, inputs.sample_lens] = ids

    def _read(self, batch: Batch, rows: torch.Tensor, width: int) -> list[list[int]]:
        """The guesses written after each row's known tokens, in one copy from the device."""
        positions = batch.history_lens[rows][:, None] + torch.arange(width)[None, :]
        limit = batch.history.shape[1] - 1
        on_device = upload(
            {"rows": rows[:, None].expand(-1, width), "positions": positions.clamp(max=limit)},
            self.device,
        )
        ids = batch.history[on_device["rows"], on_device["positions"]]  # flat: upload's views
        return ids.view(len(rows), width).cpu().tolist()

    def _caches(self) -> list[torch.Tensor]:
        if self.kv_caches is None:
            raise RuntimeError("the draft's KV cache is not allocated yet: Warmup must run first")
        return self.kv_caches
