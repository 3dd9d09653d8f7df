"""Turns a batch into model inputs and attention metadata, runs the forward pass, samples.

This is the only place that builds per-step tensors. Decode inputs come from gathers on the
batch's padded tensors, so the per-token hot path has no Python loop over requests; the loops
that remain only copy results into protobuf messages.
"""

import logging
import math
import time
from dataclasses import dataclass

import torch

from shard.batch import Batch
from shard.distributed import Distributed
from shard.layers.attention import AttentionMetadata
from shard.layers.sampling import SampleOutput, sample
from switchyard_pb import generate_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepTimings:
    forward_ns: int
    decode_ns: int


@dataclass(frozen=True)
class PrefillInputs:
    input_ids: torch.Tensor  # [T] packed prompts
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    last_index: torch.Tensor  # [B] index of each prompt's last token in the packed dimension


class ModelRunner:
    def __init__(self, model, dist: Distributed, device: torch.device, block_size: int) -> None:
        self.model = model
        self.dist = dist
        self.device = device
        self.block_size = block_size
        self.kv_caches: list[torch.Tensor] | None = None

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = None  # free the old cache before allocating the new one
        self.kv_caches = self.model.allocate_kv_cache(num_blocks, self.block_size)

    # -- input preparation -------------------------------------------------------------

    def prepare_prefill(self, batch: Batch) -> PrefillInputs:
        lens = batch.history_lens
        width = int(lens.max())
        columns = torch.arange(width, device=self.device)
        # Row-major boolean indexing packs the prompts one after another: the varlen layout.
        mask = columns[None, :] < lens[:, None]
        cu_seqlens = torch.zeros(len(batch) + 1, dtype=torch.int32, device=self.device)
        cu_seqlens[1:] = torch.cumsum(lens, 0)
        meta = AttentionMetadata(
            is_prefill=True,
            slot_mapping=batch.slots[:, :width][mask],
            block_tables=batch.block_tables,
            context_lens=lens.to(torch.int32),
            cu_seqlens_q=cu_seqlens,
            max_seqlen_q=width,
            max_seqlen_k=width,
        )
        return PrefillInputs(
            input_ids=batch.history[:, :width][mask],
            positions=columns.expand(len(batch), width)[mask],
            meta=meta,
            last_index=cu_seqlens[1:].to(torch.int64) - 1,
        )

    def prepare_decode(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        positions = batch.history_lens - 1
        input_ids = batch.history.gather(1, positions[:, None]).squeeze(1)
        slot_mapping = batch.slots.gather(1, positions[:, None]).squeeze(1)
        meta = AttentionMetadata(
            is_prefill=False,
            slot_mapping=slot_mapping,
            block_tables=batch.block_tables,
            context_lens=batch.history_lens.to(torch.int32),
        )
        return input_ids, positions, meta

    # -- steps -------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, batch: Batch) -> tuple[list[generate_pb2.Generation], StepTimings]:
        start = time.perf_counter_ns()
        inputs = self.prepare_prefill(batch)
        hidden = self.model(inputs.input_ids, inputs.positions, self._caches(), inputs.meta)
        wants_prompt_logprobs = any(r.prefill_logprobs for r in batch.requests)
        if wants_prompt_logprobs:
            all_logits = self.model.compute_logits(hidden)
            logits = all_logits[inputs.last_index]
        else:
            logits = self.model.compute_logits(hidden[inputs.last_index])
        forward_done = time.perf_counter_ns()
        out = self._sample(logits, batch)
        prompt_logprobs = None
        if wants_prompt_logprobs:
            # logprob of token j+1 given tokens 0..j, under the raw distribution (as TGI reports).
            targets = torch.roll(inputs.input_ids, -1)
            prompt_logprobs = (
                torch.log_softmax(all_logits, -1).gather(1, targets[:, None]).squeeze(1).tolist()
            )
        batch.append_tokens(out.next_ids)
        generations = self._generations(batch, out)
        if prompt_logprobs is not None:
            self._attach_prompt_logprobs(batch, inputs, prompt_logprobs, generations)
        end = time.perf_counter_ns()
        return generations, StepTimings(forward_done - start, end - forward_done)

    @torch.inference_mode()
    def decode(self, batch: Batch) -> tuple[list[generate_pb2.Generation], StepTimings]:
        overflow = [
            r.id
            for r, n in zip(batch.requests, batch.history_lens.tolist(), strict=True)
            if n > r.capacity
        ]
        if overflow:
            raise ValueError(f"requests {overflow} have used all the KV slots the router gave them")
        start = time.perf_counter_ns()
        input_ids, positions, meta = self.prepare_decode(batch)
        hidden = self.model(input_ids, positions, self._caches(), meta)
        logits = self.model.compute_logits(hidden)
        forward_done = time.perf_counter_ns()
        out = self._sample(logits, batch)
        batch.append_tokens(out.next_ids)
        generations = self._generations(batch, out)
        end = time.perf_counter_ns()
        return generations, StepTimings(forward_done - start, end - forward_done)

    # -- helpers -----------------------------------------------------------------------

    def _caches(self) -> list[torch.Tensor]:
        if self.kv_caches is None:
            raise RuntimeError("the KV cache is not allocated yet: Warmup must run first")
        return self.kv_caches

    def _sample(self, logits: torch.Tensor, batch: Batch) -> SampleOutput:
        out = sample(logits, batch.sampling, batch.history, batch.history_lens, batch.max_top_n)
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

    def _generations(self, batch: Batch, out: SampleOutput) -> list[generate_pb2.Generation]:
        ids = out.next_ids.tolist()
        logprobs = out.logprobs.tolist()
        top_ids = out.top_ids.tolist() if out.top_ids.numel() else None
        top_lps = out.top_logprobs.tolist() if out.top_logprobs.numel() else None
        generations = []
        for i, request in enumerate(batch.requests):
            gen = generate_pb2.Generation(
                request_id=request.id,
                tokens=generate_pb2.Tokens(ids=[ids[i]], logprobs=[logprobs[i]]),
            )
            if request.top_n_tokens and top_ids is not None:
                n = request.top_n_tokens
                gen.top_tokens.append(
                    generate_pb2.Tokens(ids=top_ids[i][:n], logprobs=top_lps[i][:n])
                )
            generations.append(gen)
        return generations

    @staticmethod
    def _attach_prompt_logprobs(
        batch: Batch,
        inputs: PrefillInputs,
        prompt_logprobs: list[float],
        generations: list[generate_pb2.Generation],
    ) -> None:
        input_ids = inputs.input_ids.tolist()
        start = 0
        for request, gen in zip(batch.requests, generations, strict=True):
            end = start + request.input_len
            if request.prefill_logprobs:
                # The first prompt token has no prediction; position j predicts token j + 1.
                logprobs = [math.nan] + prompt_logprobs[start : end - 1]
                gen.prefill_tokens.CopyFrom(
                    generate_pb2.Tokens(ids=input_ids[start:end], logprobs=logprobs)
                )
            start = end
