"""The shard's protobuf boundary, used by the servicer (shard/server.py) alone: requests in,
generations and batch summaries out. An unset proto sampling field reads 0; it becomes the
parameter's neutral value here, so nothing past this file knows proto defaults."""

from __future__ import annotations

import torch

from shard.batch import Batch
from shard.requests import Generation, NewRequest, Tokens
from shard.sampling.params import SamplingParams
from switchyard_pb import generate_pb2 as pb


def sampling_params(p: pb.NextTokenChooserParameters) -> SamplingParams:
    return SamplingParams(
        temperature=p.temperature or 1.0,
        top_k=p.top_k,
        top_p=p.top_p or 1.0,
        typical_p=p.typical_p or 1.0,
        min_p=p.min_p,
        do_sample=p.do_sample,
        seed=p.seed,
        repetition_penalty=p.repetition_penalty or 1.0,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        logit_bias=tuple(sorted(p.logit_bias.items())),
    )


def new_request(r: pb.Request) -> NewRequest:
    return NewRequest(
        id=r.id,
        input_ids=list(r.input_ids),
        blocks=list(r.blocks),
        slots=list(r.slots),
        sampling=sampling_params(r.parameters),
        prefix_len=r.prefix_len,
        prefill_logprobs=r.prefill_logprobs,
        top_n_tokens=r.top_n_tokens,
        adapter_id=r.adapter_id,
        constrained=r.constrained,
    )


def new_batch(
    batch: pb.Batch, device: torch.device, recurrent: bool = False
) -> tuple[Batch, list[NewRequest]]:
    """The state of a batch of new requests, and the requests (for warmup and benchmarks);
    `recurrent`: the model keeps states per sequence (Batch.state_slots)."""
    requests = [new_request(r) for r in batch.requests]
    return Batch.start(batch.id, requests, device, recurrent), requests


def cached_batch(batch: Batch) -> pb.CachedBatch:
    return pb.CachedBatch(
        id=batch.id,
        request_ids=[r.id for r in batch.requests],
        size=len(batch.requests),
        max_tokens=batch.max_tokens,
    )


def _tokens(t: Tokens) -> pb.Tokens:
    return pb.Tokens(ids=t.ids, logprobs=t.logprobs)


def generation(g: Generation) -> pb.Generation:
    out = pb.Generation(request_id=g.request_id, tokens=_tokens(g.token))
    if g.top_tokens is not None:
        out.top_tokens.extend(_tokens(t) for t in g.top_tokens)
    if g.prefill_tokens is not None:
        out.prefill_tokens.CopyFrom(_tokens(g.prefill_tokens))
    if g.prefill_top is not None:
        out.prefill_top_tokens.extend(_tokens(t) for t in g.prefill_top)
    if g.draft_ids:
        out.draft_ids.extend(g.draft_ids)
    return out
