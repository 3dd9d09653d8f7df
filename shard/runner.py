"""Runs one step of a batch: the forward pass over what each row runs, then sampling.

Prefill, decode and chunked-prefill steps are one code path: shard/step_inputs.py decides which
tokens each row runs and packs them. The per-token hot path has no Python loop over requests;
the loop that remains hands each sampled row's results out as plain `Generation`s (the
servicer, shard/server.py, alone turns them into protobuf).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

import torch

from shard import prompt_logprobs, speculation
from shard.batch import Batch, PromptScores
from shard.distributed import Distributed
from shard.draft import DraftModel
from shard.faults import Faults
from shard.layers.lora import LoraStep
from shard.platforms.cuda.graphs import DecodeGraphs
from shard.requests import Generation, Tokens
from shard.sampling.graph_heads import DEFAULT_TOP_N
from shard.sampling.sampler import SampleOutput, SamplingTensors, sample
from shard.sampling.token_masks import TokenMasks, gather_token_masks
from shard.state_slots import DEFAULT_STATE_SLOTS
from shard.step_inputs import (
    HostStep,
    StepInputs,
    build_step_inputs,
    step_lengths,
    step_starts,
)

log = logging.getLogger(__name__)


class ForwardFailed(RuntimeError):
    """A step failed inside the model's forward pass or its logits, where the ranks run their
    collectives: with several shards, a peer may be left waiting in one (shard/server.py)."""


# A step's sampled rows' output on the device and, with several shards, this rank's own ids
# before rank 0's replaced them.
Sampled = tuple[SampleOutput, torch.Tensor | None]


@dataclass(frozen=True)
class InFlight:
    """A step queued on the device whose answers the host has not read yet."""

    sample_rows: list[int]  # batch rows it samples, ascending (once per sample)
    sampled: Sampled | None
    prompt_rows: prompt_logprobs.PromptRows | None
    prompt_scores: prompt_logprobs.PromptScoresOnDevice | None
    started: int  # perf_counter_ns when it was planned
    forward_done: int  # and when its forward pass was queued
    drafts: speculation.Drafts | None = None  # the proposals it verifies

    @property
    def every_row_once(self) -> bool:
        """Whether it samples every row of its batch once (a plain decode step)."""
        return self.drafts is None and self.sample_rows == list(range(len(self.sample_rows)))

    def keep(self, rows: torch.Tensor) -> InFlight:
        """The step of a filtered batch (FilterBatch), for a step that sampled every row:
        the kept rows' answers, in the new row order (rows: host indices into the old)."""
        assert self.prompt_rows is None and self.sampled is not None
        assert self.every_row_once, "every row samples once"
        out, local_ids = self.sampled
        on_device = rows.to(out.next_ids.device)
        kept = SampleOutput(*(getattr(out, f.name)[on_device] for f in fields(out)))
        return replace(
            self,
            sample_rows=list(range(len(rows))),
            sampled=(kept, None if local_ids is None else local_ids[on_device]),
        )


@dataclass(frozen=True)
class StepTimings:
    forward_ns: int
    decode_ns: int

    def __add__(self, other: StepTimings) -> StepTimings:
        """Two steps answered by one RPC (a step queued ahead and one run now)."""
        return StepTimings(self.forward_ns + other.forward_ns, self.decode_ns + other.decode_ns)


class ModelRunner:
    def __init__(
        self,
        model,
        dist: Distributed,
        device: torch.device,
        block_size: int,
        lora: LoraStep | None = None,
        forward=None,  # the model's forward pass another way (--compile); default the model
        decode_path=None,  # the decode steps' forward pass where it applies (cpu_decode.py)
        graphs: DecodeGraphs | None = None,  # CUDA graphs of decode steps (--cuda-graphs)
        draft: DraftModel | None = None,  # speculative decoding's draft model (--draft-model)
    ) -> None:
        self.model = model
        self.forward = forward or model
        self.decode_path = decode_path
        self.dist = dist
        self.device = device
        self.block_size = block_size
        self.kv_caches: list[torch.Tensor] | None = None
        self.num_blocks = 0  # of the KV cache allocated (0: none yet)
        self.state_slots = 0  # sequences the recurrent state pools hold (linear attention)
        self.lora = lora  # the per-step LoRA context every LoRA term reads, when adapters exist
        self.graphs = graphs
        self.draft = draft
        # Longrope's original_max_position_embeddings (0: none): a row whose sequence grows past
        # it is recomputed whole in that step (shard/step_inputs.py: step_starts).
        self.rope_regime_boundary: int = model.config.rope_regime_boundary
        # Faults injected on purpose (shard/faults.py); the servicer arms them after Warmup.
        self.faults: Faults | None = None

    @property
    def compiled(self) -> bool:
        """Whether the forward pass is another than the model's own (--compile)."""
        return self.forward is not self.model

    def free_kv_cache(self) -> None:
        if self.graphs is not None:
            self.graphs.release()  # they write into the cache
        self.kv_caches = None
        if self.draft is not None:
            self.draft.free_kv_cache()
        self.num_blocks = 0

    def tabulate_positions(self, positions: int) -> None:
        """The model's rotary tables (and the draft model's) for positions below `positions`."""
        self.model.tabulate_positions(positions)
        if self.draft is not None:
            self.draft.model.tabulate_positions(positions)

    def allocate_kv_cache(self, num_blocks: int, state_slots: int = DEFAULT_STATE_SLOTS) -> None:
        """The paged cache of `num_blocks`, and for a model with linear attention state pools
        of `state_slots` sequences (Batch.state_slots index them)."""
        self.free_kv_cache()  # the old cache goes before the new one is allocated
        self.state_slots = state_slots if self.model.recurrent else 0
        self.kv_caches = self.model.allocate_kv_cache(num_blocks, self.block_size, self.state_slots)
        if self.draft is not None:  # the same blocks, addressed by the same tables
            self.draft.allocate_kv_cache(num_blocks)
        self.num_blocks = num_blocks

    def kv_cache_bytes_per_token(self) -> int:
        """One token's K/V on this rank: the model's, and the draft model's beside it."""
        draft = self.draft.kv_cache_bytes_per_token() if self.draft is not None else 0
        return self.model.kv_cache_bytes_per_token() + draft

    @torch.inference_mode()
    def capture_graphs(self, block_table_width: int, top_n: int = DEFAULT_TOP_N) -> int:
        """Captures the decode graphs against the current KV cache, for requests whose block
        tables are at most `block_table_width` wide and that ask for `top_n` alternatives at
        most (more sample eagerly); returns the memory they took (0: none)."""
        if self.graphs is None:
            return 0
        self.graphs.capture(self._caches(), block_table_width, top_n)
        draft = self.draft.capture_graphs(block_table_width) if self.draft is not None else 0
        return self.graphs.memory_bytes + draft

    # -- the step ----------------------------------------------------------------------

    @torch.inference_mode()
    def step(
        self,
        batch: Batch,
        chunks: Mapping[int, int] | None = None,
        token_masks: Mapping[int, bytes] | None = None,
        proposals: Mapping[int, Sequence[int]] | None = None,
        proposal_masks: Mapping[int, Sequence[bytes]] | None = None,
        draft_tokens: int = 0,
    ) -> tuple[list[Generation], StepTimings]:
        """Runs one step: a token for every decoding row, the next prompt chunk (`chunks`, by
        request id; default the whole rest) for rows in their prompt; samples the rows whose
        known tokens are then all in the cache, constrained ones within their `token_masks`
        (by request id). Decoding rows with `proposals` (by request id) verify them
        (shard/speculation.py), constrained ones with `proposal_masks`, the mask after each.
        With a draft model, each row that then decodes gets up to `draft_tokens` guesses of
        what follows (shard/draft.py)."""
        generations, timings = self.finish(
            batch, self.launch(batch, chunks, token_masks, proposals, proposal_masks)
        )
        if self.draft is None:  # the servicer refuses draft_tokens before the step then
            return generations, timings
        return self._guess(batch, draft_tokens, generations, timings)

    def _guess(
        self, batch: Batch, k: int, generations: list[Generation], timings: StepTimings
    ) -> tuple[list[Generation], StepTimings]:
        """The draft model's phase after a step: the guesses go with the generations."""
        assert self.draft is not None
        start = time.perf_counter_ns()
        rows = {r.id: row for row, r in enumerate(batch.requests)}
        emitted = {rows[g.request_id]: g.token.ids for g in generations}
        try:
            guesses = self.draft.propose(batch, k, emitted)
        except Exception as err:  # its forward pass runs collectives too
            raise ForwardFailed(f"draft model: {type(err).__name__}: {err}") from err
        if guesses:
            by_id = {batch.requests[row].id: ids for row, ids in guesses.items()}
            generations = [replace(g, draft_ids=by_id.get(g.request_id)) for g in generations]
        took = time.perf_counter_ns() - start
        return generations, timings + StepTimings(took, 0)

    @torch.inference_mode()
    def launch(
        self,
        batch: Batch,
        chunks: Mapping[int, int] | None = None,
        token_masks: Mapping[int, bytes] | None = None,
        proposals: Mapping[int, Sequence[int]] | None = None,
        proposal_masks: Mapping[int, Sequence[bytes]] | None = None,
    ) -> InFlight | None:
        """The first half of `step`: plans the step on the host (shard/step_inputs.py), queues
        it whole on the device and advances the batch's host state as the step will (None: the
        step runs no token). On a GPU this returns while the device is still computing. Rows
        verifying proposals advance in `finish`, once the host knows how many were right."""
        starts = step_starts(batch, self.rope_regime_boundary)
        q_lens = step_lengths(batch, chunks or {}, starts)
        drafts = speculation.plan(
            batch,
            proposals or {},
            proposal_masks or {},
            starts,
            self.model.vocab_size,
            self.rope_regime_boundary,
        )
        proposed = None
        if drafts is not None:
            proposed = drafts.counts
            q_lens = q_lens + proposed
            speculation.write(batch, drafts, self.device)
        ends = starts + q_lens
        self._check_capacity(batch, ends)
        if int(q_lens.sum()) == 0:
            return None
        start = time.perf_counter_ns()
        inputs = build_step_inputs(batch, q_lens, starts, self.device, proposed)
        sample_rows = inputs.host.sample_rows.tolist()
        masks = self._token_masks(batch, inputs.host, token_masks or {}, drafts)
        prompt_rows = prompt_logprobs.plan(batch, inputs.host, self.device)
        # The sampled rows' parameters, chosen on the host (every row's in a decode step).
        sampling = batch.sampling
        if drafts is not None or len(sample_rows) < len(batch):
            sampling = batch.sampling.index(inputs.host.sample_rows)
        # The longest history a sample sees (the penalties' reach): the one after the step's
        # last position; read here, on the host's plan, for the graphs' sampling heads.
        longest = 0
        if self.graphs is not None and sampling.flags.any_penalty:
            longest = int(inputs.host.positions.max()) + 1
        sampled, scores, forward_done = self._launch(
            batch, inputs, masks, prompt_rows, sampling, drafts is not None, longest
        )
        in_flight = InFlight(sample_rows, sampled, prompt_rows, scores, start, forward_done, drafts)
        # cache_lens + q_lens but for a row recomputed from 0, whose cache now ends where its
        # known tokens do, as any decoding row's; one more known token for each sampled row
        # (rows verifying proposals: set in `finish`).
        batch.cache_lens = ends
        batch.history_lens[inputs.host.sample_rows] += 1
        return in_flight

    @torch.inference_mode()
    def finish(
        self, batch: Batch, in_flight: InFlight | None
    ) -> tuple[list[Generation], StepTimings]:
        """The second half of `step`: the step's answers, in one copy from the device (the one
        wait of a decode step)."""
        if in_flight is None:
            return [], StepTimings(0, 0)
        generations: list[Generation] = []
        answers = self._fetch(*in_flight.sampled) if in_flight.sampled is not None else []
        if in_flight.prompt_rows is not None and in_flight.prompt_scores is not None:
            prompt_logprobs.record(batch, in_flight.prompt_rows, in_flight.prompt_scores)
        if in_flight.sampled is not None:
            runs = self._runs(batch, answers, in_flight.sample_rows, in_flight.drafts)
            generations = self._generations(batch, runs)
        end = time.perf_counter_ns()
        forward_ns = in_flight.forward_done - in_flight.started
        return generations, StepTimings(forward_ns, end - in_flight.forward_done)

    def _launch(
        self,
        batch: Batch,
        inputs: StepInputs,
        masks: TokenMasks | None,
        prompt_rows: prompt_logprobs.PromptRows | None,
        sampling: SamplingTensors,
        verifies: bool = False,
        longest: int = 0,
    ) -> tuple[Sampled | None, prompt_logprobs.PromptScoresOnDevice | None, int]:
        """Queues the step on the device: the forward pass, the logits, the prompt tokens'
        scores, the sampling and each sampled token written into the device history. Nothing
        here reads the device on the host (tests/shard/test_step_host_syncs.py holds it to
        that), so on a GPU the host runs ahead and the device never waits for it."""
        if self.lora is not None:
            self.lora.set_tokens(inputs.token_lora_slots)
        try:
            if self.faults is not None:
                self.faults.before_forward()
            scores = logits = None
            from_graph = self._sampled_from_graph(
                batch, inputs, masks, prompt_rows, sampling, verifies, longest
            )
            if from_graph is None:
                hidden = self._forward(inputs)
                if prompt_rows is not None:
                    scores = prompt_logprobs.score(self.model, hidden, batch, prompt_rows)
                logits = self.model.compute_logits(hidden[inputs.sample_index])
        except Exception as err:
            raise ForwardFailed(f"{type(err).__name__}: {err}") from err
        forward_done = time.perf_counter_ns()
        sampled = None
        if from_graph is not None:
            sampled = (from_graph, self._agree(from_graph))
        elif logits is not None and len(inputs.host.sample_rows):
            out = self._sample(logits, batch, inputs, masks, sampling, verifies)
            sampled = (out, self._agree(out))
        if sampled is not None:
            # A row verifying proposals writes each sample after the history it saw: past the
            # accepted ones, over tokens nobody reads (shard/speculation.py).
            batch.history[inputs.sample_rows, inputs.sample_lens] = sampled[0].next_ids
        return sampled, scores, forward_done

    def _sampled_from_graph(
        self,
        batch: Batch,
        inputs: StepInputs,
        masks: TokenMasks | None,
        prompt_rows: prompt_logprobs.PromptRows | None,
        sampling: SamplingTensors,
        verifies: bool,
        longest: int,
    ) -> SampleOutput | None:
        """The step's tokens from a decode graph that ends with the logits and the sampling
        (shard/sampling/graph_heads.py), for a step every token of which samples with what a
        head holds; None where the step is not such a one."""
        graphs = self.graphs
        if graphs is None or graphs.heads is None or prompt_rows is not None:
            return None
        # Every token samples (a decode step; verifying rows too, one sample per token), so
        # the graph's per-token answers are the samples, in order.
        if len(inputs.host.sample_rows) != len(inputs.host.token_rows):
            return None
        history = batch.history  # read by the heads for the penalties alone
        if sampling.flags.any_penalty:
            history = self._sample_history(batch, inputs, verifies)
        top_n = batch.max_top_n
        head = graphs.heads.prepare(sampling, history, inputs.sample_lens, masks, top_n, longest)
        if head is None:
            return None
        got = graphs.replay(inputs.input_ids, inputs.positions, inputs.meta, head=head)
        if got is None:
            return None
        # The graph's outputs are its static buffers, which its next replay rewrites, and a step
        # queued ahead (shard/steps_ahead.py) is answered after other batches' steps may have
        # replayed the same graph: the answers are copied out (on the device, nothing waits).
        if len(got) == 2 or not top_n:  # no alternatives asked: no columns to copy back
            return SampleOutput.chosen_only(got[0].clone(), got[1].clone())
        ids, chosen, top_ids, top_logprobs = got
        return SampleOutput(
            ids.clone(),
            chosen.clone(),
            top_ids[:, :top_n].clone(),
            top_logprobs[:, :top_n].clone(),
        )

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        """The step's final hidden states: from a CUDA graph where one holds the step, the CPU
        decode path where it applies, else the forward pass."""
        if self.graphs is not None:
            hidden = self.graphs.replay(inputs.input_ids, inputs.positions, inputs.meta)
            if hidden is not None:
                assert isinstance(hidden, torch.Tensor)
                return hidden
        forward = self.forward
        if self.decode_path is not None and self.decode_path.applies(inputs.meta):
            forward = self.decode_path
        return forward(inputs.input_ids, inputs.positions, self._caches(), inputs.meta)

    @staticmethod
    def _check_capacity(batch: Batch, ends: torch.Tensor) -> None:
        """ends: [B] each row's cached positions after the step."""
        overflow = [
            r.id for r, n in zip(batch.requests, ends.tolist(), strict=True) if n > r.capacity
        ]
        if overflow:
            raise ValueError(f"requests {overflow} have used all the KV slots the router gave them")

    # -- helpers -----------------------------------------------------------------------

    def _caches(self) -> list[torch.Tensor]:
        if self.kv_caches is None:
            raise RuntimeError("the KV cache is not allocated yet: Warmup must run first")
        return self.kv_caches

    def _token_masks(
        self,
        batch: Batch,
        step: HostStep,
        masks: Mapping[int, bytes],
        drafts: speculation.Drafts | None,
    ) -> TokenMasks | None:
        """The masks of the step's constrained samples: the step's own for a row's first, the
        mask after each proposal for the samples after it."""
        if not masks and not any(r.constrained for r in batch.requests):
            return None  # the common case: nobody asked for structured output
        rows = step.sample_rows.tolist()
        requests = [batch.requests[row] for row in rows]
        after = None
        if drafts is not None and step.sample_offsets is not None:
            # The j-th sample of a row (j from 0) follows j proposals.
            after = [drafts.masks.get(row, ()) for row in rows], step.sample_offsets.tolist()
        return gather_token_masks(
            [r.id for r in requests], [r.constrained for r in requests], masks, self.device, after
        )

    def _sample(
        self,
        logits: torch.Tensor,
        batch: Batch,
        inputs: StepInputs,
        masks: TokenMasks | None,
        sampling: SamplingTensors,
        verifies: bool = False,
    ) -> SampleOutput:
        """Samples one token for each of the step's samples (`sampling`: their parameters), on
        the device."""
        history = self._sample_history(batch, inputs, verifies)
        return sample(logits, sampling, history, inputs.sample_lens, batch.max_top_n, masks)

    @staticmethod
    def _sample_history(batch: Batch, inputs: StepInputs, verifies: bool) -> torch.Tensor:
        """The history each sample follows: its row's (a row verifying proposals has several)."""
        if verifies or len(inputs.host.sample_rows) < len(batch):
            return batch.history[inputs.sample_rows]
        return batch.history

    def _agree(self, out: SampleOutput) -> torch.Tensor | None:
        """With several shards, rank 0's ids replace this rank's in `out`; returns this rank's
        own (None with one shard). Logits are all-gathered and sampling is deterministic, so
        ranks agree already; the broadcast makes agreement a guarantee rather than a
        consequence (and `_fetch` checks it)."""
        if self.dist.world_size == 1:
            return None
        local = out.next_ids.clone()
        self.dist.broadcast(out.next_ids, src=0)
        return local

    def _fetch(self, out: SampleOutput, local_ids: torch.Tensor | None) -> list[list[float]]:
        """Each sampled row's [id, logprob, top ids..., top logprobs...] on the host: every
        result in one copy (float64 holds token ids exactly)."""
        columns = [out.next_ids[:, None], out.logprobs[:, None], out.top_ids, out.top_logprobs]
        if local_ids is not None:
            columns.append(local_ids[:, None])
        rows = torch.cat([c.double() for c in columns], dim=1).cpu().tolist()
        if local_ids is not None:
            ours = [row.pop() for row in rows]
            theirs = [row[0] for row in rows]
            if ours != theirs:
                # Rank 0's tokens win and serving goes on, but ranks saw different logits:
                # a non-deterministic collective or kernel that deserves a look.
                log.warning(
                    "rank %d sampled %s where rank 0 sampled %s; using rank 0's",
                    self.dist.rank,
                    [int(i) for i in ours],
                    [int(i) for i in theirs],
                )
        return rows

    @staticmethod
    def _runs(
        batch: Batch,
        answers: list[list[float]],
        rows: list[int],
        drafts: speculation.Drafts | None,
    ) -> list[tuple[int, list[list[float]]]]:
        """Each sampled row and the answers it emits (`_fetch`'s, one per sample of `rows`):
        one, or for a row verifying proposals those up to the first that differs from them
        (its host lengths are settled here)."""
        if drafts is None:
            return [(row, [answer]) for row, answer in zip(rows, answers, strict=True)]
        runs: list[tuple[int, list[list[float]]]] = []
        i = 0
        while i < len(rows):
            row = rows[i]
            k = int(drafts.counts[row])
            if k == 0:
                runs.append((row, [answers[i]]))
                i += 1
                continue
            samples = answers[i : i + k + 1]
            n = speculation.accepted(drafts, row, [int(a[0]) for a in samples])
            speculation.settle(batch, drafts, row, n)
            runs.append((row, samples[: n + 1]))
            i += k + 1
        return runs

    def _generations(
        self, batch: Batch, runs: list[tuple[int, list[list[float]]]]
    ) -> list[Generation]:
        """runs: each sampled row and its answers (`_runs`)."""
        width = (len(runs[0][1][0]) - 2) // 2 if runs else 0
        generations = []
        for row, answers in runs:
            request = batch.requests[row]
            top = prefill = prefill_top = None
            if request.top_n_tokens:
                n = request.top_n_tokens
                top = [
                    Tokens(
                        ids=[int(i) for i in answer[2 : 2 + n]],
                        logprobs=answer[2 + width : 2 + width + n],
                    )
                    for answer in answers
                ]
            if request.prefill_logprobs and int(batch.history_lens[row]) == request.input_len + 1:
                # The request's first token: its prompt's logprobs go with it. The first prompt
                # token has no prediction.
                scores = batch.prompt_logprobs.pop(request.id, PromptScores())
                prefill = Tokens(
                    ids=batch.history[row, : request.input_len].tolist(),
                    logprobs=[math.nan, *scores.logprobs],
                )
                if request.top_n_tokens:
                    prefill_top = [Tokens([], []), *scores.top]
            token = Tokens([int(a[0]) for a in answers], [a[1] for a in answers])
            generations.append(Generation(request.id, token, top, prefill, prefill_top))
        return generations
