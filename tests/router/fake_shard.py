"""A deterministic in-process shard speaking the real wire protocol, for router tests.

Next token = (last token + 1) % vocab_size, or the next id of a `script`; a constrained request
(structured output) takes the first token its step's mask allows from there on. Every RPC is checked
against the protocol rules the router must follow (block/slot consistency, no step past
max_new_tokens, batch bookkeeping); violations are recorded in `violations` for the tests to
assert on.

Speculative decoding: a decoding request's `proposals` entry is verified as the real shard does
it: the fake samples (its deterministic next token, inside the masks) at the fed token and after
each proposed one, and answers the tokens up to and including the first that differs from the
proposal; the proposed positions' K/V are written with the proposed tokens, as a forward pass
over them writes them.

The KV cache is modelled: each written slot remembers the adapter and the token ids up to its
position, which is what the real K/V depend on, and with a `rope_regime_boundary` (longrope)
whether the token was rotated with the long tables (its sequence's known length past it; a
request whose prompt is short has its whole sequence recomputed with the long tables in the step
that runs its token at the boundary, as the real shard does). A
request's cached prefix (prefix_len) must find exactly its own tokens there, a block may be held
by several requests only inside their cached prefixes (shared read-only), and nobody writes into
a block another live request holds.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

import grpc

from shard.sockets import shard_url
from switchyard_pb import generate_pb2 as pb
from switchyard_pb import generate_pb2_grpc as pb_grpc


def _first_allowed(mask: bytes, preferred: int) -> int:
    """The first token at or after `preferred` (cyclically) that the packed mask allows."""
    bits = int.from_bytes(mask, "little")
    width = len(mask) * 8
    for k in range(width):
        token = (preferred + k) % width
        if bits >> token & 1:
            return token
    return preferred  # an empty mask: the router's violation, recorded by the caller


@dataclass
class FakeRequest:
    id: int
    ids: list[int]
    max_new: int
    blocks: list[int]
    slots: list[int]
    top_n: int
    prefill_logprobs: bool = False
    adapter_id: str = ""
    constrained: bool = False
    generated: int = 0
    computed: int = 0  # prompt tokens computed so far (chunked prefill), the cached prefix too
    crossed: bool = False  # recomputed whole with the long rope tables (rope_regime_boundary)

    @property
    def prompt_left(self) -> int:
        return len(self.ids) - self.generated - self.computed


@dataclass
class FakeShard(pb_grpc.TextGenerationServiceServicer):
    rank: int
    urls: list[str]
    vocab_size: int = 512
    block_size: int = 4
    num_blocks: int = 160
    max_position_embeddings: int = 256
    eos_token_ids: tuple[int, ...] = (2,)
    # Longrope's original_max_position_embeddings (0: none): a token's K/V then also depend on
    # whether its sequence's known length exceeds it, as the real shard's rotation does.
    rope_regime_boundary: int = 0
    # Test knobs.
    fail_prefill_token: int | None = None  # Prefill fails when a prompt holds this token
    fail_next_decode: bool = False
    hang_next_decode: bool = False  # the next Decode never answers (Health still does)
    stop_next_decode: bool = False  # the next Decode answers ABORTED, as a shard that stops
    healthy: bool = True
    hang_health: bool = False  # Health never answers, as a frozen (SIGSTOPped) process
    decode_delay: float = 0.0
    script: tuple[int, ...] = ()  # the ids every request generates, in order (else last + 1)
    # The shards' LoRA slots: more distinct adapters in one step is a router violation.
    max_loras: int | None = None
    # Runtime adapters: with track_adapters, a Prefill naming an adapter not loaded through
    # LoadAdapter is a violation; refuse_load makes LoadAdapter refuse with this reason.
    track_adapters: bool = False
    refuse_load: str | None = None
    # Adapters whose files the shard cannot read again: their new requests are reported in
    # PrefillResponse.adapter_failures and not started, as shard/lora/manager.py does.
    unreadable_adapters: frozenset[str] = frozenset()
    load_delay: float = 0.0
    # Observations.
    calls: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    batches: dict[int, list[FakeRequest]] = field(default_factory=dict)
    owner: dict[int, set[int]] = field(default_factory=dict)  # block -> ids of live holders
    # slot -> what its K/V depend on: the adapter, the long rope tables, the tokens up to it
    kv: dict[int, tuple[str, bool, tuple[int, ...]]] = field(default_factory=dict)
    max_batch_size_seen: int = 0
    prefilled: list[pb.Request] = field(default_factory=list)  # every request, as received
    decode_sizes: list[int] = field(default_factory=list)  # requests in each Decode
    step_tokens: list[int] = field(default_factory=list)  # tokens computed by each Prefill/Decode
    step_generated: list[list[int]] = field(default_factory=list)  # ids given a token, per step
    prompt_chunks: list[dict[int, int]] = field(default_factory=list)  # chunks computed, per step
    step_adapters: list[frozenset[str]] = field(default_factory=list)  # non-empty ids, per step
    step_proposals: list[dict[int, list[int]]] = field(default_factory=list)  # proposed, per step
    step_decoding: list[int] = field(default_factory=list)  # rows past their prompt, per step
    loaded: dict[str, str] = field(default_factory=dict)  # runtime adapters: name -> path

    def _check(self, ok: bool, message: str) -> None:
        if not ok:
            self.violations.append(message)

    def _check_request(self, r: pb.Request, warmup: bool) -> None:
        positions = len(r.input_ids) + r.stopping_parameters.max_new_tokens
        bs = self.block_size
        self._check(len(r.slots) == positions, f"req {r.id}: {len(r.slots)} slots for {positions}")
        self._check(
            len(r.blocks) == math.ceil(positions / bs), f"req {r.id}: block count {len(r.blocks)}"
        )
        for p, slot in enumerate(r.slots):
            if p // bs >= len(r.blocks) or slot != r.blocks[p // bs] * bs + p % bs:
                self._check(False, f"req {r.id}: slot {p} = {slot} inconsistent with blocks")
                break
        self._check(len(set(r.blocks)) == len(r.blocks), f"req {r.id}: repeated block")
        low = 0 if warmup else 1  # block 0 is reserved by the router
        self._check(all(low <= b < self.num_blocks for b in r.blocks), f"req {r.id}: block range")
        self._check(r.parameters.seed != 0 or warmup, f"req {r.id}: seed not set")
        self._check(r.prefix_len < len(r.input_ids), f"req {r.id}: prefix_len {r.prefix_len}")
        self._check(r.prefix_len % bs == 0, f"req {r.id}: prefix ends inside a block")
        self._check(not (r.prefix_len and r.prefill_logprobs), f"req {r.id}: cached + logprobs")

    def _check_batch(self, batch: pb.Batch, warmup: bool = False) -> None:
        self._check(batch.size == len(batch.requests), "batch.size")
        self._check(
            batch.max_tokens
            == sum(len(r.input_ids) + r.stopping_parameters.max_new_tokens for r in batch.requests),
            "batch.max_tokens",
        )
        self._check(batch.max_blocks == max(len(r.blocks) for r in batch.requests), "max_blocks")
        for r in batch.requests:
            self._check_request(r, warmup)

    def _next(self, req: FakeRequest) -> int:
        if self.script:
            return self.script[req.generated % len(self.script)]
        return (req.ids[-1] + 1) % self.vocab_size

    def _sample(self, req: FakeRequest, mask: bytes | None) -> int:
        self._check(req.generated < req.max_new, f"req {req.id}: step past max_new_tokens")
        token = self._next(req)
        if req.constrained:
            self._check(bool(mask), f"req {req.id}: constrained without a usable token mask")
            token = _first_allowed(mask or b"", token)
        req.ids.append(token)
        req.generated += 1
        return token

    def _answer(self, req: FakeRequest, tokens: list[int]) -> pb.Generation:
        return pb.Generation(
            request_id=req.id,
            tokens=pb.Tokens(ids=tokens, logprobs=[-0.1 * (t % 10) - 0.01 for t in tokens]),
            top_tokens=[
                pb.Tokens(
                    ids=[(t + k) % self.vocab_size for k in range(req.top_n)],
                    logprobs=[-0.1 * (k + 1) for k in range(req.top_n)],
                )
                for t in tokens
            ]
            if req.top_n
            else [],
        )

    def _verify(self, req: FakeRequest, proposal: pb.Proposal, mask: bytes | None) -> pb.Generation:
        """The fed token and the proposed ones in one pass: samples at each position, up to and
        including the first that differs from the proposal."""
        draft, masks = list(proposal.ids), list(proposal.token_masks)
        p = len(req.ids) - 1  # the fed token's position
        room = req.max_new - req.generated
        self._check(len(draft) <= room, f"req {req.id}: {len(draft)} proposed, {room} slots left")
        if req.constrained:
            self._check(len(masks) == len(draft), f"req {req.id}: {len(masks)} masks")
        boundary = self.rope_regime_boundary
        crosses = 0 < boundary and len(req.ids) - req.generated <= boundary
        self._check(
            not (crosses and p <= boundary <= p + len(draft)),
            f"req {req.id}: proposal over the rope boundary at {p}..{p + len(draft)}",
        )
        known, prompt_len = list(req.ids), len(req.ids) - req.generated
        for i in range(min(len(draft), len(req.slots) - p - 1)):
            q = p + 1 + i  # holds the K/V of the proposed token draft[i]
            long = req.crossed or 0 < boundary < max(prompt_len, q + 1)
            self._write(req, [q], (req.adapter_id, long, tuple(known + draft[: i + 1])))
        tokens = []
        for i in range(len(draft) + 1):
            at = mask if i == 0 else masks[i - 1] if i <= len(masks) else None
            token = self._sample(req, at)
            tokens.append(token)
            if i == len(draft) or token != draft[i]:
                break
        return self._answer(req, tokens)

    def _generation(
        self, req: FakeRequest, prefill_logprobs: bool = False, mask: bytes | None = None
    ) -> pb.Generation:
        gen = self._answer(req, [self._sample(req, mask)])
        if prefill_logprobs:
            prompt = req.ids[:-1]
            gen.prefill_tokens.CopyFrom(
                pb.Tokens(ids=prompt, logprobs=[math.nan] + [-1.0] * (len(prompt) - 1))
            )
            if req.top_n:  # each prompt position's alternatives, the first position none
                gen.prefill_top_tokens.append(pb.Tokens())
                gen.prefill_top_tokens.extend(
                    pb.Tokens(
                        ids=[(t + k) % self.vocab_size for k in range(req.top_n)],
                        logprobs=[-1.0 - 0.1 * k for k in range(req.top_n)],
                    )
                    for t in prompt[1:]
                )
        return gen

    def _step(
        self, reqs: list[FakeRequest], chunks, masks=None, proposals=None
    ) -> list[pb.Generation]:
        """One step like the real shard's: decoding rows get a token (and verify their proposed
        tokens); rows in their prompt compute their chunk (default: the rest) and get their first
        token once it is all computed."""
        known = {r.id for r in reqs}
        proposals = proposals or {}
        self._check(set(chunks) <= known, f"chunks for unknown requests {set(chunks) - known}")
        unknown = set(proposals) - known
        self._check(not unknown, f"proposals for unknown requests {unknown}")
        self.step_proposals.append({rid: list(p.ids) for rid, p in proposals.items()})
        self.step_decoding.append(sum(1 for r in reqs if r.prompt_left == 0))
        adapters = frozenset(r.adapter_id for r in reqs if r.adapter_id)
        self.step_adapters.append(adapters)
        if self.max_loras is not None:
            self._check(len(adapters) <= self.max_loras, f"adapters {sorted(adapters)} in a step")
        gens, tokens, computed = [], 0, {}
        for req in reqs:
            if req.prompt_left > 0:
                self._check(req.id not in proposals, f"req {req.id}: proposal in its prompt")
                n = min(chunks.get(req.id, req.prompt_left), req.prompt_left)
                self._write(req, range(req.computed, req.computed + n))
                req.computed += n
                tokens += n
                computed[req.id] = n
                if req.prompt_left == 0:
                    gens.append(
                        self._generation(req, req.prefill_logprobs, (masks or {}).get(req.id))
                    )
            else:
                tokens += 1  # as the router counts it, the crossing's recompute too
                p = len(req.ids) - 1
                if 0 < self.rope_regime_boundary == p and len(req.ids) - req.generated <= p:
                    # A short prompt's sequence grows past the boundary: the real shard
                    # recomputes it whole with the long tables (shard/step_inputs.py).
                    req.crossed = True
                    self._write(req, range(p + 1))
                else:
                    self._write(req, [p])
                mask = (masks or {}).get(req.id)
                if req.id in proposals:
                    tokens += len(proposals[req.id].ids)
                    gens.append(self._verify(req, proposals[req.id], mask))
                else:
                    gens.append(self._generation(req, mask=mask))
        self.step_tokens.append(tokens)
        self.step_generated.append([g.request_id for g in gens])
        self.prompt_chunks.append(computed)
        return gens

    def _content(self, req: FakeRequest, p: int) -> tuple[str, bool, tuple[int, ...]]:
        # A prompt token's sequence is the whole prompt; a generated token's at position p is
        # p + 1 long (shard/layers/rotary.py picks the long tables past the boundary).
        known = max(len(req.ids) - req.generated, p + 1)
        long = req.crossed or 0 < self.rope_regime_boundary < known
        return req.adapter_id, long, tuple(req.ids[: p + 1])

    def _write(self, req: FakeRequest, positions, content=None) -> None:
        for p in positions:
            block = req.blocks[p // self.block_size]
            others = self.owner.get(block, set()) - {req.id}
            self._check(not others, f"req {req.id} writes block {block} shared with {others}")
            self.kv[req.slots[p]] = content or self._content(req, p)

    def _hold(self, r: pb.Request, req: FakeRequest) -> None:
        """Takes the request's blocks; only its cached prefix may be held by others too, and
        that prefix must hold exactly its own tokens' K/V."""
        for i, b in enumerate(r.blocks):
            holders = self.owner.setdefault(b, set())
            if (i + 1) * self.block_size > r.prefix_len:
                self._check(not holders, f"block {b} owned by {sorted(holders)} and {r.id}")
            holders.add(r.id)
        for p in range(r.prefix_len):
            ok = self.kv.get(req.slots[p]) == self._content(req, p)
            self._check(ok, f"req {r.id}: cached position {p} does not hold its K/V")

    def _cached(self, batch_id: int) -> pb.CachedBatch:
        reqs = self.batches[batch_id]
        return pb.CachedBatch(
            id=batch_id,
            request_ids=[r.id for r in reqs],
            size=len(reqs),
            max_tokens=sum(len(r.slots) for r in reqs),
        )

    def _release(self, reqs: list[FakeRequest]) -> None:
        for r in reqs:
            for b in r.blocks:
                holders = self.owner.get(b, set())
                holders.discard(r.id)
                if not holders:
                    self.owner.pop(b, None)

    # -- RPCs ---------------------------------------------------------------------------------

    async def Info(self, request, context):
        self.calls.append("Info")
        return pb.InfoResponse(
            model_id="fake",
            dtype="float32",
            device_type="cpu",
            block_size=self.block_size,
            world_size=len(self.urls),
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            attention_impl="fake",
            eos_token_ids=list(self.eos_token_ids),
            rope_regime_boundary=self.rope_regime_boundary,
        )

    async def ServiceDiscovery(self, request, context):
        self.calls.append("ServiceDiscovery")
        return pb.ServiceDiscoveryResponse(urls=self.urls)

    async def Health(self, request, context):
        self.calls.append("Health")
        if self.hang_health:
            await asyncio.Event().wait()
        if not self.healthy:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "unhealthy")
        return pb.HealthResponse()

    async def Warmup(self, request, context):
        self.calls.append("Warmup")
        self._check_batch(request.batch, warmup=True)
        self._check(
            sum(len(r.input_ids) for r in request.batch.requests) == request.max_prefill_tokens,
            "warmup batch does not fill max_prefill_tokens",
        )
        if request.max_batch_total_tokens:
            # Like the real shard: exactly the cache asked for, when it fits.
            wanted = math.ceil(request.max_batch_total_tokens / self.block_size)
            if wanted > self.num_blocks:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "cache too large")
            self.num_blocks = wanted
        return pb.WarmupResponse(
            max_supported_total_tokens=self.num_blocks * self.block_size,
            num_blocks=self.num_blocks,
        )

    async def Prefill(self, request, context):
        self.calls.append("Prefill")
        batch = request.batch
        self._check_batch(batch)
        self._check(batch.id not in self.batches, f"batch id {batch.id} reused")
        if self.fail_prefill_token is not None and any(
            self.fail_prefill_token in r.input_ids for r in batch.requests
        ):
            await context.abort(grpc.StatusCode.INTERNAL, "injected prefill failure")
        reqs = []
        self.prefilled.extend(batch.requests)
        if self.track_adapters:
            for r in batch.requests:
                ok = not r.adapter_id or r.adapter_id in self.loaded
                self._check(ok, f"req {r.id}: adapter {r.adapter_id!r} is not loaded")
        failures = self._adapter_failures(batch)
        failed = {rid for f in failures for rid in f.request_ids}
        for r in batch.requests:
            if r.id in failed:
                continue
            req = FakeRequest(
                r.id,
                list(r.input_ids),
                r.stopping_parameters.max_new_tokens,
                list(r.blocks),
                list(r.slots),
                r.top_n_tokens,
                r.prefill_logprobs,
                r.adapter_id,
                constrained=r.constrained,
                computed=r.prefix_len,
            )
            self._hold(r, req)
            reqs.append(req)
        merged = self._take(list(request.cached_batches)) + reqs
        if not merged:
            return pb.PrefillResponse(adapter_failures=failures)
        batch_id = request.cached_batches[0].id if request.cached_batches else batch.id
        self.batches[batch_id] = merged
        chunks = {k: v for k, v in request.prefill_chunks.items() if k not in failed}
        gens = self._step(merged, chunks, dict(request.token_masks), dict(request.proposals))
        return pb.PrefillResponse(
            generations=gens, batch=self._cached(batch_id), adapter_failures=failures
        )

    def _adapter_failures(self, batch: pb.Batch) -> list[pb.AdapterFailure]:
        names = dict.fromkeys(r.adapter_id for r in batch.requests)
        return [
            pb.AdapterFailure(
                adapter_id=name,
                reason=f"adapter {name!r}: injected read failure",
                request_ids=[r.id for r in batch.requests if r.adapter_id == name],
            )
            for name in names
            if name in self.unreadable_adapters
        ]

    def _take(self, cached: list[pb.CachedBatch]) -> list[FakeRequest]:
        for b in cached:
            self._check(b.id in self.batches, f"step of unknown batch {b.id}")
            if b.id in self.batches:
                known = [r.id for r in self.batches[b.id]]
                self._check(list(b.request_ids) == known, f"batch {b.id} ids {b.request_ids}")
        return [r for b in cached for r in self.batches.pop(b.id, [])]

    async def Decode(self, request, context):
        self.calls.append("Decode")
        if self.decode_delay:
            await asyncio.sleep(self.decode_delay)
        if self.fail_next_decode:
            self.fail_next_decode = False
            await context.abort(grpc.StatusCode.INTERNAL, "injected decode failure")
        if self.hang_next_decode:
            await asyncio.Event().wait()
        if self.stop_next_decode:
            await context.abort(grpc.StatusCode.ABORTED, "injected forward failure; stopping")
        merged = self._take(list(request.batches))
        batch_id = request.batches[0].id
        self.batches[batch_id] = merged
        self.max_batch_size_seen = max(self.max_batch_size_seen, len(merged))
        self.decode_sizes.append(len(merged))
        gens = self._step(
            merged,
            dict(request.prefill_chunks),
            dict(request.token_masks),
            dict(request.proposals),
        )
        return pb.DecodeResponse(generations=gens, batch=self._cached(batch_id))

    async def FilterBatch(self, request, context):
        self.calls.append("FilterBatch")
        reqs = self.batches.get(request.batch_id, [])
        keep = set(request.request_ids)
        self._check(keep <= {r.id for r in reqs}, "filter keeps unknown ids")
        self._check(bool(keep), "FilterBatch with no ids (ClearCache expected)")
        self._release([r for r in reqs if r.id not in keep])
        self.batches[request.batch_id] = [r for r in reqs if r.id in keep]
        return pb.FilterBatchResponse(batch=self._cached(request.batch_id))

    async def ClearCache(self, request, context):
        self.calls.append("ClearCache")
        ids = [request.id] if request.HasField("id") else list(self.batches)
        for i in ids:
            self._release(self.batches.pop(i, []))
        return pb.ClearCacheResponse()

    async def LoadAdapter(self, request, context):
        self.calls.append("LoadAdapter")
        if self.load_delay:
            await asyncio.sleep(self.load_delay)
        if request.name in self.loaded:
            self._check(False, f"LoadAdapter of {request.name!r}, already loaded")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "already loaded")
        if self.refuse_load is not None:
            reason = f"adapter {request.name!r}: {self.refuse_load}"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        self.loaded[request.name] = request.path
        return pb.LoadAdapterResponse()

    async def UnloadAdapter(self, request, context):
        self.calls.append("UnloadAdapter")
        if request.name not in self.loaded:
            self._check(False, f"UnloadAdapter of {request.name!r}, not loaded")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not loaded")
        cached = [r for reqs in self.batches.values() for r in reqs]
        users = [r.id for r in cached if r.adapter_id == request.name]
        self._check(not users, f"UnloadAdapter of {request.name!r} used by cached {users}")
        del self.loaded[request.name]
        return pb.UnloadAdapterResponse()


async def start_fake_shards(
    uds_path: str, world_size: int = 2, **kwargs
) -> tuple[list[FakeShard], list[grpc.aio.Server]]:
    urls = [shard_url(uds_path, r) for r in range(world_size)]
    shards, servers = [], []
    for rank, url in enumerate(urls):
        shard = FakeShard(rank=rank, urls=urls, **kwargs)
        server = grpc.aio.server()
        pb_grpc.add_TextGenerationServiceServicer_to_server(shard, server)
        server.add_insecure_port(url)
        await server.start()
        shards.append(shard)
        servers.append(server)
    return shards, servers
