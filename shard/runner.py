"""Runs one step of a batch: the forward pass over what each row runs, then sampling.

Prefill, decode and chunked-prefill steps are one code path: shard/step_inputs.py decides which
tokens each row runs and packs them. The per-token hot path has no Python loop over requests;
the loop that remains hands each sampled row's results out as plain `Generation`s (the
servicer, shard/server.py, alone turns them into protobuf).
"""

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from shard.batch import Batch, PromptScores
from shard.distributed import Distributed
from shard.faults import Faults
from shard.layers.lora import LoraStep
from shard.platforms.cuda.graphs import DecodeGraphs
from shard.requests import Generation, Tokens
from shard.sampling.sampler import SampleOutput, sample
from shard.sampling.token_masks import TokenMasks, gather_token_masks
from shard.step_inputs import StepInputs, build_step_inputs, step_lengths, step_starts

log = logging.getLogger(__name__)


class ForwardFailed(RuntimeError):
    """A step failed inside the model's forward pass or its logits, where the ranks run their
    collectives: with several shards, a peer may be left waiting in one (shard/server.py)."""


@dataclass(frozen=True)
class StepTimings:
    forward_ns: int
    decode_ns: int


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
    ) -> None:
        self.model = model
        self.forward = forward or model
        self.decode_path = decode_path
        self.dist = dist
        self.device = device
        self.block_size = block_size
        self.kv_caches: list[torch.Tensor] | None = None
        self.num_blocks = 0  # of the KV cache allocated (0: none yet)
        self.lora = lora  # the per-step LoRA context every LoRA term reads, when adapters exist
        self.graphs = graphs
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
        self.num_blocks = 0

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.free_kv_cache()  # the old cache goes before the new one is allocated
        self.kv_caches = self.model.allocate_kv_cache(num_blocks, self.block_size)
        self.num_blocks = num_blocks

    @torch.inference_mode()
    def capture_graphs(self, block_table_width: int) -> int:
        """Captures the decode graphs against the current KV cache, for requests whose block
        tables are at most `block_table_width` wide; returns the memory they took (0: none)."""
        if self.graphs is None:
            return 0
        self.graphs.capture(self._caches(), block_table_width)
        return self.graphs.memory_bytes

    # -- the step ----------------------------------------------------------------------

    @torch.inference_mode()
    def step(
        self,
        batch: Batch,
        chunks: Mapping[int, int] | None = None,
        token_masks: Mapping[int, bytes] | None = None,
    ) -> tuple[list[Generation], StepTimings]:
        """Runs one step: a token for every decoding row, the next prompt chunk (`chunks`, by
        request id; default the whole rest) for rows in their prompt; samples the rows whose
        known tokens are then all in the cache, constrained ones within their `token_masks`
        (by request id)."""
        starts = step_starts(batch, self.rope_regime_boundary)
        q_lens = step_lengths(batch, chunks or {}, starts)
        ends = starts + q_lens
        self._check_capacity(batch, ends)
        if int(q_lens.sum()) == 0:
            return [], StepTimings(0, 0)
        start = time.perf_counter_ns()
        inputs = build_step_inputs(batch, q_lens, starts)
        if self.lora is not None:
            self.lora.set_tokens(batch.lora_slots[inputs.token_rows])
        try:
            if self.faults is not None:
                self.faults.before_forward()
            hidden = self._forward(inputs)
            self._gather_prompt_logprobs(batch, inputs, hidden)
            logits = self.model.compute_logits(hidden[inputs.sample_index])
        except Exception as err:
            raise ForwardFailed(f"{type(err).__name__}: {err}") from err
        # cache_lens + q_lens but for a row recomputed from 0, whose cache now ends where its
        # known tokens do, as any decoding row's.
        batch.cache_lens = ends
        forward_done = time.perf_counter_ns()
        generations: list[Generation] = []
        if len(inputs.sample_rows):
            everyone = len(inputs.sample_rows) == len(batch)
            rows = None if everyone else inputs.sample_rows
            sample_rows = inputs.sample_rows.tolist()
            masks = self._token_masks(batch, sample_rows, token_masks or {}, logits.device)
            out = self._sample(logits, batch, rows, masks)
            batch.append_tokens(out.next_ids, rows)
            generations = self._generations(batch, out, sample_rows)
        end = time.perf_counter_ns()
        return generations, StepTimings(forward_done - start, end - forward_done)

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        """The step's final hidden states: from a CUDA graph where one holds the step, the CPU
        decode path where it applies, else the forward pass."""
        if self.graphs is not None:
            hidden = self.graphs.replay(inputs.input_ids, inputs.positions, inputs.meta)
            if hidden is not None:
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

    def _gather_prompt_logprobs(
        self, batch: Batch, inputs: StepInputs, hidden: torch.Tensor
    ) -> None:
        """Keeps the logprob of every prompt token this step predicts, for requests that asked:
        position p predicts token p + 1 under the raw distribution (as TGI reports it)."""
        if not any(r.prefill_logprobs for r in batch.requests):
            return
        device = inputs.positions.device
        wants = torch.tensor([r.prefill_logprobs for r in batch.requests], device=device)
        # Only rows still in their prompt: a longrope row recomputed past its boundary
        # (step_starts) runs its prompt again, whose logprobs went out with its first token.
        wants &= batch.history_lens == batch.input_lens
        rows, pos = inputs.token_rows, inputs.positions
        index = (wants[rows] & (pos + 1 < batch.input_lens[rows])).nonzero().squeeze(1)
        if not len(index):
            return
        rows, pos = rows[index], pos[index]
        logits = self.model.compute_logits(hidden[index])
        targets = batch.history[rows, pos + 1]
        all_logprobs = torch.log_softmax(logits, -1)
        logprobs = all_logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
        rows_list = rows.tolist()
        top_n = [batch.requests[row].top_n_tokens for row in rows_list]
        top_ids = top_lps = None
        if max(top_n):  # the alternatives too (OpenAI's echo with logprobs)
            top = all_logprobs.topk(min(max(top_n), all_logprobs.shape[-1]), dim=-1)
            top_ids, top_lps = top.indices.tolist(), top.values.tolist()
        # Tokens are packed row by row in position order, so appending keeps each list in order.
        for i, (row, logprob) in enumerate(zip(rows_list, logprobs, strict=True)):
            scores = batch.prompt_logprobs.setdefault(batch.requests[row].id, PromptScores())
            scores.logprobs.append(logprob)
            n = top_n[i]
            if n and top_ids is not None and top_lps is not None:
                scores.top.append(Tokens(ids=top_ids[i][:n], logprobs=top_lps[i][:n]))

    # -- helpers -----------------------------------------------------------------------

    def _caches(self) -> list[torch.Tensor]:
        if self.kv_caches is None:
            raise RuntimeError("the KV cache is not allocated yet: Warmup must run first")
        return self.kv_caches

    @staticmethod
    def _token_masks(
        batch: Batch, rows: list[int], masks: Mapping[int, bytes], device: torch.device
    ) -> TokenMasks | None:
        if not masks and not any(r.constrained for r in batch.requests):
            return None  # the common case: nobody asked for structured output
        requests = [batch.requests[row] for row in rows]
        return gather_token_masks(
            [r.id for r in requests], [r.constrained for r in requests], masks, device
        )

    def _sample(
        self,
        logits: torch.Tensor,
        batch: Batch,
        rows: torch.Tensor | None,
        masks: TokenMasks | None = None,
    ) -> SampleOutput:
        """Samples one token for each of `rows` (None: every row of the batch)."""
        if rows is None:
            sampling, history, lens = batch.sampling, batch.history, batch.history_lens
        else:
            sampling, history, lens = (
                batch.sampling.index(rows), batch.history[rows], batch.history_lens[rows]
            )  # fmt: skip
        out = sample(logits, sampling, history, lens, batch.max_top_n, masks)
        if self.dist.world_size > 1:
            # Logits are all-gathered and sampling is deterministic, so ranks agree already;
            # the broadcast makes agreement a guarantee rather than a consequence.
            local = out.next_ids.clone()
            self.dist.broadcast(out.next_ids, src=0)
            if not torch.equal(local, out.next_ids):
                # Rank 0's tokens win and serving goes on, but ranks saw different logits:
                # a non-deterministic collective or kernel that deserves a look.
                log.warning(
                    "rank %d sampled %s where rank 0 sampled %s; using rank 0's",
                    self.dist.rank,
                    local.tolist(),
                    out.next_ids.tolist(),
                )
        return out

    def _generations(self, batch: Batch, out: SampleOutput, rows: list[int]) -> list[Generation]:
        ids = out.next_ids.tolist()
        logprobs = out.logprobs.tolist()
        top_ids = out.top_ids.tolist() if out.top_ids.numel() else None
        top_lps = out.top_logprobs.tolist() if out.top_logprobs.numel() else None
        generations = []
        for i, row in enumerate(rows):
            request = batch.requests[row]
            top = prefill = prefill_top = None
            if request.top_n_tokens and top_ids is not None:
                n = request.top_n_tokens
                top = Tokens(ids=top_ids[i][:n], logprobs=top_lps[i][:n])
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
            generations.append(
                Generation(request.id, Tokens([ids[i]], [logprobs[i]]), top, prefill, prefill_top)
            )
        return generations
