"""CUDA graphs of the decode step's forward pass, one per batch-size bucket (`--cuda-graphs`).

Why: a decode step of a small model is hundreds of short kernels, and on a GPU launching them from
Python costs more than running them (a 1B model at batch 1 is launch-bound). A graph captured
once replays them all with one launch. TGI, vLLM and SGLang do the same.

How:
- Warmup captures the forward pass of a pure decode step for each bucket (1, 2, 4, ... by
  default), largest first, all in one memory pool, on static input buffers sized for the largest
  bucket and a block table as wide as the longest request (`--max-total-tokens`).
- A decode step of B rows replays the smallest bucket >= B: its inputs are copied into the
  buffers, the rows past B are padding (token 0 at position 0, writing its K/V into block 0,
  which the router never hands out, and attending over that one slot), and the first B rows of
  the graph's output are the step's hidden states. With `heads` (shard/sampling/graph_heads.py:
  the logits and the sampling, from static buffers of each row's parameters), each bucket has
  one more graph per head, which ends with each row's token and its logprob: greedy steps,
  sampled ones (bias, penalties, grammar masks, temperature, seeds) and truncated ones
  (top-k, top-p, min-p), with their alternatives, then replay whole, and only the steps no
  head holds (typical-p, prompt logprobs) sample eagerly after the forward pass's graph.
- Steps with prompt tokens, more rows than the largest bucket or a wider block table run
  eagerly; so do steps whose tokens use adapters when the LoRA terms are the torch ones (their
  grouping is built on the host). With the Triton LoRA kernels each bucket has a second graph
  that also carries the LoRA terms: the token -> slot map is a static buffer and the slot tiles
  are computed inside the graph, so the adapter weights and scalings, written in place when an
  adapter is loaded, are read by every replay.
- Attention reads the step metadata with `captured=True`: nothing of it is read on the host.

`Replayer` is what captures and replays; on a CPU tests pass one that runs the captured function
again on the same buffers, which checks everything here except CUDA's capture itself.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from shard.attention import AttentionMetadata
from shard.cuda_graph_buckets import DEFAULT_BUCKETS, CudaGraphsError
from shard.layers.lora import LoraStep
from shard.models.linear_attention import RecurrentState

log = logging.getLogger(__name__)


def buckets_for(
    device: torch.device, asked: tuple[int, ...] | None, world_size: int = 1
) -> tuple[int, ...]:
    """The buckets this shard captures; an explicit list on a CPU is an error, not ignored.

    By default one shard on a GPU captures DEFAULT_BUCKETS and tensor-parallel shards none:
    their graphs would hold NCCL all-reduces, which torch can capture but no session has yet
    run on several GPUs. An explicit --cuda-graphs list captures them anyway."""
    if device.type == "cuda":
        if asked is not None:
            return asked
        if world_size > 1:
            log.info(
                "CUDA graphs: off by default with %d shards (untested with NCCL collectives "
                "inside); --cuda-graphs 1,2,4,... turns them on",
                world_size,
            )
            return ()
        return DEFAULT_BUCKETS
    if asked:
        raise CudaGraphsError(
            f"--cuda-graphs {','.join(map(str, asked))}: CUDA graphs need a CUDA device and "
            f"this shard runs on {device.type}; pass --cuda-graphs 0"
        )
    return ()


# What a captured function returns: the hidden states, or a head's tensors.
Output = torch.Tensor | tuple[torch.Tensor, ...]


class Graph(Protocol):
    def replay(self) -> None: ...


class Replayer(Protocol):
    """Captures `fn` (which returns the static output tensor) and replays it."""

    def capture(self, fn: Callable[[], Output]) -> tuple[Graph, Output]: ...

    def memory_bytes(self) -> int: ...


class CudaReplayer:
    """torch.cuda graphs, all in one memory pool: buckets are captured largest first, so the
    smaller ones reuse the larger ones' intermediate buffers."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], Output]) -> tuple[Graph, Output]:
        # Run once outside the graph first, on a side stream as torch's docs ask: Triton
        # compiles and cuBLAS picks its workspaces there, not during capture.
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out

    def memory_bytes(self) -> int:
        return torch.cuda.memory_reserved(self.device)


class EagerReplayer:
    """Captures by keeping the function; a replay runs it again, into the same output (a tensor
    or a tuple of them). Where there is no CUDA (tests, the benchmark's smoke run), it checks
    the static buffers, the padding and the captured metadata: all of the above but CUDA's
    capture itself."""

    class Graph:
        def __init__(self, fn: Callable[[], Output], out: Output) -> None:
            self.fn, self.out = fn, out

        def replay(self) -> None:
            new = self.fn()
            if isinstance(self.out, torch.Tensor):
                self.out.copy_(new)  # type: ignore[arg-type]
                return
            for kept, value in zip(self.out, new, strict=True):
                kept.copy_(value)

    def capture(self, fn: Callable[[], Output]) -> tuple[Graph, Output]:
        out = fn()
        return self.Graph(fn, out), out

    def memory_bytes(self) -> int:
        return 0


class Heads(Protocol):
    """What ends some graphs of each bucket after the forward pass (SamplingHeads)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    def allocate(self, rows: int, block_table_width: int, device: torch.device, top_n: int) -> None:
        """Static inputs of the heads for up to `rows` rows, and the alternatives they give,
        before they are captured."""

    def head(self, name: str) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]: ...


class DecodeGraphs:
    """Callable as `replay(input_ids, positions, meta)` -> hidden [B, hidden] or None (the step
    is not one a graph holds: run it eagerly); with `head=name`, that head's outputs' first B
    rows instead."""

    def __init__(
        self,
        forward: Callable[..., torch.Tensor],
        buckets: Sequence[int],
        device: torch.device,
        lora: LoraStep | None = None,
        replayer: Replayer | None = None,
        heads: Heads | None = None,
    ) -> None:
        if not buckets:
            raise ValueError("DecodeGraphs needs at least one bucket")
        self.forward = forward
        self.sizes = tuple(sorted(buckets))
        self.device = device
        self.lora = lora
        self.replayer = replayer
        self.heads = heads
        # (bucket, with the LoRA terms, the head or None) -> the graph and its output
        self.graphs: dict[tuple[int, bool, str | None], tuple[Graph, Output]] = {}
        self.block_table_width = 0
        self.memory_bytes = 0  # what the last capture took

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    @property
    def captures_lora(self) -> bool:
        return self.lora is not None and self.lora.triton

    # -- capture -------------------------------------------------------------------------

    def capture(
        self, kv_caches: list[torch.Tensor], block_table_width: int, top_n: int = 0
    ) -> None:
        """Captures every bucket against `kv_caches` (replays write into them, so capture again
        whenever the cache is reallocated) for block tables up to `block_table_width` wide, the
        heads giving `top_n` alternatives."""
        self.release()
        replayer = self.replayer or CudaReplayer(self.device)
        before = replayer.memory_bytes()
        n, width, device = self.max_size, max(1, block_table_width), self.device
        self.block_table_width = width
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.zeros(n, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(n, width, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.token_slots = torch.full((n,), -1, dtype=torch.int32, device=device)
        # Linear attention's state slots; a padded row's is the pools' scratch slot, so that
        # it updates no live sequence's state (DecoderModel.allocate_kv_cache adds it).
        self.scratch_slot = scratch_state_slot(kv_caches)
        self.state_slots = torch.full((n,), self.scratch_slot, dtype=torch.long, device=device)
        heads: tuple[str | None, ...] = (None,)
        if self.heads is not None:
            self.heads.allocate(n, width, device, top_n)
            heads += self.heads.names
        try:
            for size in reversed(self.sizes):
                for with_lora in (False, True) if self.captures_lora else (False,):
                    for head in heads:
                        self.graphs[size, with_lora, head] = replayer.capture(
                            lambda s=size, w=with_lora, h=head: self._run(s, kv_caches, w, h)
                        )
        finally:
            if self.lora is not None:
                self.lora.set_tokens(None)  # capture left the graphs' buffers there
        self.memory_bytes = max(0, replayer.memory_bytes() - before)
        log.info(
            "CUDA graphs: decode captured for batch sizes %s%s (%.1f MiB)",
            ",".join(map(str, self.sizes)),
            (" with and without LoRA" if self.captures_lora else "")
            + (f", each also with heads {'/'.join(map(str, heads[1:]))}" if heads[1:] else ""),
            self.memory_bytes / 2**20,
        )

    def _run(
        self, size: int, kv_caches: list[torch.Tensor], with_lora: bool, head: str | None = None
    ) -> Output:
        lora = self.lora
        if lora is not None:
            lora.set_tokens(None)
            if with_lora:
                # Set directly, not through set_tokens, which asks the host whether any token
                # uses an adapter; the first LoRA layer then builds the tiles inside the graph.
                lora.token_slots = self.token_slots[:size]
        meta = AttentionMetadata(
            is_prefill=False,
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            context_lens=self.context_lens[:size],
            captured=True,
            state_slots=self.state_slots[:size],
        )
        hidden = self.forward(self.input_ids[:size], self.positions[:size], kv_caches, meta)
        if head is not None:
            assert self.heads is not None
            return self.heads.head(head)(hidden)
        return hidden

    def release(self) -> None:
        """Drops the graphs and their pool (before the KV cache they write into is freed)."""
        if not self.graphs:
            return
        self.graphs = {}
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- replay --------------------------------------------------------------------------

    def replay(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: object,
        head: str | None = None,
    ) -> Output | None:
        if not self.graphs or not isinstance(meta, AttentionMetadata) or meta.is_prefill:
            return None
        if head is not None and (self.heads is None or head not in self.heads.names):
            return None
        rows, width = meta.block_tables.shape
        if rows > self.max_size or width > self.block_table_width:
            return None
        token_slots = None
        if self.lora is not None and self.lora.token_slots is not None:
            if not self.captures_lora:
                return None  # the torch LoRA terms group tokens on the host: eager
            token_slots = self.lora.token_slots
        size = next(s for s in self.sizes if s >= rows)
        self._fill(rows, size, input_ids, positions, meta, token_slots)
        graph, out = self.graphs[size, token_slots is not None, head]
        graph.replay()
        if isinstance(out, torch.Tensor):
            return out[:rows]
        return tuple(t[:rows] for t in out)

    def _fill(
        self,
        rows: int,
        size: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        token_slots: torch.Tensor | None,
    ) -> None:
        """The step's inputs into the first `rows` of the buffers; rows up to `size` padding.
        Padding must be rewritten every time: a larger step left real slots there, and a
        padded row writes its K/V wherever its slot says."""
        width = meta.block_tables.shape[1]
        self.input_ids[:rows].copy_(input_ids)
        self.positions[:rows].copy_(positions)
        self.slot_mapping[:rows].copy_(meta.slot_mapping)
        self.block_tables[:rows, :width].copy_(meta.block_tables)
        self.context_lens[:rows].copy_(meta.context_lens)
        if token_slots is not None:
            self.token_slots[:rows].copy_(token_slots)
        if meta.state_slots is not None:
            self.state_slots[:rows].copy_(meta.state_slots)
        if rows < size:
            for buffer in (self.input_ids, self.positions, self.slot_mapping):
                buffer[rows:size].zero_()
            # fill_, not item assignment: a Python value there becomes a host tensor first
            self.block_tables[rows:size, 0].fill_(0)
            self.context_lens[rows:size].fill_(1)
            self.token_slots[rows:size].fill_(-1)
            self.state_slots[rows:size].fill_(self.scratch_slot)


def scratch_state_slot(kv_caches: list) -> int:
    """The recurrent state pools' last slot, which no sequence is given (0 without pools)."""
    for cache in kv_caches:
        if isinstance(cache, RecurrentState):
            return cache.conv.shape[0] - 1
    return 0


def block_table_width(max_total_tokens: int, block_size: int) -> int:
    """Block table columns the longest request can need."""
    return math.ceil(max_total_tokens / block_size)
