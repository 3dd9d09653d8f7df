"""Mamba 1 models (pure, FalconMamba's normed dt/B/C, Jamba's beside attention and experts) over
prompts split into chunks: every chunk's logits, at every position, are transformers' over the
whole prompt, so each chunk's conv and selective scan start from the states the last one left
(greedy ids alone can hide a lost state: these checkpoints' logits move by 0.1-0.4 without it,
rarely their argmax)."""

from __future__ import annotations

import pytest
import torch
from paged_helpers import PagedLayout

from shard.distributed import Distributed
from shard.models import load_model
from tests.shard.test_models_vs_transformers import ATOL, prompts, ref_logits, reference

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "name", ["mamba1_biased", "falcon_mamba_bcdt_norms", "jamba_mamba1_attention_experts"]
)
def test_prompt_chunks_continue_from_their_states(tiny_model, name):
    path = tiny_model(name)
    ours = load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())
    ref = reference(path)
    a, b, c = prompts(ours.vocab_size, lens=(75, 21, 5), seed=3)
    layout = PagedLayout(16, num_blocks=12, seed=5)
    seq_a, seq_b, seq_c = layout.add(75), layout.add(21), layout.add(5)
    caches = ours.allocate_kv_cache(12, 16, state_slots=3)
    # a: 11 tokens, then 40 (across the scan's 32-token blocks) beside b's second chunk and all
    # of c, then the last 24; b: 13, then 8
    steps = [
        ([seq_a, seq_b], [0, 0], [11, 13]),
        ([seq_a, seq_b, seq_c], [11, 13, 0], [51, 21, 5]),
        ([seq_a], [51], [75]),
    ]
    tokens = {seq_a: a, seq_b: b, seq_c: c}
    got: dict[int, list[torch.Tensor]] = {s: [] for s in tokens}
    with torch.inference_mode():
        for seqs, starts, stops in steps:
            positions, meta = layout.prefill(seqs, starts, stops)
            ids = torch.cat([tokens[s][x:y] for s, x, y in zip(seqs, starts, stops, strict=True)])
            logits = ours.compute_logits(ours(ids, positions, caches, meta))
            lens = [y - x for x, y in zip(starts, stops, strict=True)]
            for rows, s in zip(logits.split(lens), seqs, strict=True):
                got[s].append(rows)
    for s, prompt in tokens.items():
        expected = ref_logits(ref, prompt.tolist())
        torch.testing.assert_close(torch.cat(got[s]), expected, atol=ATOL, rtol=0, msg=str(s))
