"""Builds attention metadata for sequences laid out in a paged KV cache, as the router would:
each sequence gets blocks drawn from a shuffled pool, so block tables are non-contiguous."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
import torch

from shard.attention import AttentionMetadata
from shard.platforms.cpu.native.build import unavailable_reason

# The native paged attention kernels' tests: their tolerance against float64, by dtype (fp32's
# accumulation error, else the output's rounding), and their skip where they cannot be built.
NATIVE_TOL = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
NATIVE_REASON = unavailable_reason()
needs_native_kernel = pytest.mark.skipif(
    NATIVE_REASON is not None, reason=f"the kernel cannot be built here: {NATIVE_REASON}"
)


@dataclass
class PagedLayout:
    block_size: int
    num_blocks: int
    seed: int = 0
    tables: list[list[int]] = field(default_factory=list)
    _free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        self._free = torch.randperm(self.num_blocks, generator=gen).tolist()

    def add(self, capacity: int) -> int:
        """Reserves blocks for `capacity` tokens; returns the sequence index."""
        n = -(-capacity // self.block_size)
        self.tables.append([self._free.pop() for _ in range(n)])
        return len(self.tables) - 1

    def slot(self, seq: int, pos: int) -> int:
        return self.tables[seq][pos // self.block_size] * self.block_size + pos % self.block_size

    def block_tables(self, seqs: list[int]) -> torch.Tensor:
        width = max(len(self.tables[s]) for s in seqs)
        rows = [self.tables[s] + [0] * (width - len(self.tables[s])) for s in seqs]
        return torch.tensor(rows, dtype=torch.int32)

    def prefill(
        self, seqs: list[int], starts: list[int], stops: list[int]
    ) -> tuple[torch.Tensor, AttentionMetadata]:
        """Positions [start, stop) of each sequence, packed as one step (start > 0: cached)."""
        positions = torch.cat([torch.arange(a, b) for a, b in zip(starts, stops, strict=True)])
        slots = [
            self.slot(s, p)
            for s, a, b in zip(seqs, starts, stops, strict=True)
            for p in range(a, b)
        ]
        q_lens = [b - a for a, b in zip(starts, stops, strict=True)]
        cu = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
        return positions, AttentionMetadata(
            is_prefill=True,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=self.block_tables(seqs),
            context_lens=torch.tensor(stops, dtype=torch.int32),
            cu_seqlens_q=cu,
            max_seqlen_q=max(q_lens),
            max_seqlen_k=max(stops),
            # linear attention's state slot per sequence: its index
            state_slots=torch.tensor(seqs, dtype=torch.int64),
            host_query_lens=tuple(q_lens),
            host_fresh=tuple(a == 0 for a in starts),
        )

    def decode(
        self, seqs: list[int], positions: list[int]
    ) -> tuple[torch.Tensor, AttentionMetadata]:
        """One new token per sequence at `positions`."""
        return torch.tensor(positions, dtype=torch.int64), AttentionMetadata(
            is_prefill=False,
            slot_mapping=torch.tensor(
                [self.slot(s, p) for s, p in zip(seqs, positions, strict=True)]
            ),
            block_tables=self.block_tables(seqs),
            context_lens=torch.tensor([p + 1 for p in positions], dtype=torch.int32),
            state_slots=torch.tensor(seqs, dtype=torch.int64),
        )


def meta_on(meta: AttentionMetadata, device: torch.device) -> AttentionMetadata:
    """Metadata built on the host, its tensors where the model runs (as the runner uploads
    them: a GPU's kernels take no host tensors), with nothing derived yet."""
    moved = {
        f.name: value.to(device)
        for f in dataclasses.fields(meta)
        if isinstance(value := getattr(meta, f.name), torch.Tensor)
    }
    return dataclasses.replace(meta, **moved, derived={})


def on_device(
    device: torch.device, positions: torch.Tensor, meta: AttentionMetadata
) -> tuple[torch.Tensor, AttentionMetadata]:
    """A step's positions and metadata where the model runs."""
    return positions.to(device), meta_on(meta, device)


def run_paged(
    model,
    prompts: list[torch.Tensor],
    steps: int,
    *,
    block_size: int = 16,
    seed: int = 0,
    decode_forward=None,
) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Packed prefill of `prompts` into a shuffled paged cache, then `steps` greedy decode steps
    (through `decode_forward`, called as the model is, when given).

    Returns the logits of every step (prefill: all prompt positions, packed; decode: [B, V]) and
    each sequence's tokens (prompt + generated, including the token chosen after the last step).
    """
    lens = [len(p) for p in prompts]
    num_blocks = sum(-(-(n + steps + 1) // block_size) for n in lens) + 3
    layout = PagedLayout(block_size, num_blocks, seed=seed)
    seqs = [layout.add(n + steps + 1) for n in lens]
    caches = model.allocate_kv_cache(num_blocks, block_size, len(prompts))
    device = prompts[0].device
    positions, meta = on_device(device, *layout.prefill(seqs, [0] * len(lens), lens))
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.cat(prompts), positions, caches, meta))
        all_logits = [logits]
        last = meta.cu_seqlens_q[1:].long() - 1
        next_ids = logits[last].argmax(-1)
        tokens = [p.tolist() for p in prompts]
        for _ in range(steps):
            for t, nid in zip(tokens, next_ids.tolist(), strict=True):
                t.append(nid)
            positions, meta = on_device(device, *layout.decode(seqs, [len(t) - 1 for t in tokens]))
            hidden = (decode_forward or model)(next_ids, positions, caches, meta)
            logits = model.compute_logits(hidden)
            all_logits.append(logits)
            next_ids = logits.argmax(-1)
    for t, nid in zip(tokens, next_ids.tolist(), strict=True):
        t.append(nid)
    return all_logits, tokens


@torch.inference_mode()
def assert_equals_reference(
    ref, batch: list[torch.Tensor], logits: list[torch.Tensor], tokens: list[list[int]], atol: float
) -> None:
    """`run_paged`'s prefill logits (every prompt position) and greedy ids against a
    transformers model `ref` run on each prompt alone."""
    start = 0
    for prompt in batch:
        want = ref(prompt[None]).logits[0].float()
        torch.testing.assert_close(logits[0][start : start + len(prompt)], want, atol=atol, rtol=0)
        start += len(prompt)
    for prompt, seq in zip(batch, tokens, strict=True):
        out = ref.generate(
            prompt[None],
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=len(logits),  # the prefill's token, then one per decode step
            do_sample=False,
            pad_token_id=0,
        )
        assert seq[len(prompt) :] == out[0, len(prompt) :].tolist()


def assert_every_step_equals_reference(
    ref, batch: list[torch.Tensor], logits: list[torch.Tensor], tokens: list[list[int]],
    atol: float,
) -> None:  # fmt: skip
    """`run_paged`'s logits at every prompt position and every decode step, and its greedy ids,
    against a transformers model `ref` run on each sequence alone."""
    steps = len(logits) - 1
    start = 0
    for row, prompt in enumerate(batch):
        with torch.inference_mode():
            expected = ref(torch.tensor([tokens[row]])).logits[0]
        got = logits[0][start : start + len(prompt)].cpu()
        torch.testing.assert_close(got, expected[: len(prompt)], atol=atol, rtol=0)
        for step in range(1, steps + 1):
            want = expected[len(prompt) + step - 1]
            torch.testing.assert_close(logits[step][row].cpu(), want, atol=atol, rtol=0)
        start += len(prompt)
        with torch.inference_mode():
            out = ref.generate(prompt[None].cpu(), max_new_tokens=steps + 1, do_sample=False,
                               attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               pad_token_id=0)  # fmt: skip
        assert tokens[row][len(prompt) :] == out[0, len(prompt) :].tolist()


def assert_serves_as_reference(path, reference_dir, steps: int = 3, atol: float = 1e-4) -> None:  # type: ignore[no-untyped-def]
    """The checkpoint at `path` (another layout of the same weights: renamed, nested, with extra
    tensors) loaded by the server computes what transformers computes on `reference_dir`: two
    prompts (21 and 37 tokens), every prompt position and decode step, float32."""
    from transformers import AutoModelForCausalLM

    from shard.distributed import Distributed
    from shard.models import load_model

    ours = load_model(path, dtype=torch.float32, device=torch.device("cpu"), dist=Distributed())
    ref = AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(2)
    batch = [torch.randint(3, ours.vocab_size, (n,), generator=gen) for n in (21, 37)]
    logits, tokens = run_paged(ours, batch, steps, seed=4)
    assert_every_step_equals_reference(ref, batch, logits, tokens, atol=atol)


def reference(path, dtype: torch.dtype = torch.float32):  # type: ignore[no-untyped-def]
    """transformers' own model of the checkpoint at `path`, in `dtype`: by the auto class that maps
    it (a vision-language wrapper AutoModelForCausalLM does not map, Mistral 3's, by
    AutoModelForImageTextToText; an audio one neither auto class does, Voxtral's: its own)."""
    import json

    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        try:
            return auto.from_pretrained(path, dtype=dtype).eval()
        except ValueError:
            pass
    (architecture,) = json.loads((path / "config.json").read_text())["architectures"]
    return getattr(transformers, architecture).from_pretrained(path, dtype=dtype).eval()
