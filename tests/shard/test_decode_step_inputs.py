"""shard/step_inputs.py's plan of a step where every row runs its one last known token (the
decode fast path) equals the general plan of the same step, field by field: the device inputs,
the attention metadata, the sample indices, the adapters' slots and the host's copy. Steps that
are not such a one (a row in its prompt, a one-token chunk of a prompt, proposals) take the
general plan."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from shard import step_inputs, wire
from shard.step_inputs import build_step_inputs, step_lengths
from switchyard_pb import generate_pb2 as pb
from tests.shard.servicer_helpers import BlockPool

CPU = torch.device("cpu")


def _batch(prompts: list[int], generated: list[int]):
    """Rows with these prompt lengths, each `generated` tokens past its prompt and its cache one
    short of its history (decoding), on shuffled blocks."""
    pool = BlockPool(200, seed=7)
    requests = [pool.request(i, [3 + i + j for j in range(n)], 40) for i, n in enumerate(prompts)]
    batch = wire.new_batch(pb.Batch(id=1, requests=requests), CPU)[0]
    batch.history_lens = batch.history_lens + torch.tensor(generated)
    batch.cache_lens = batch.history_lens - 1
    return batch


def _fields(inputs) -> dict:
    """Every tensor of a StepInputs, by name (the metadata's and the host's too)."""
    out = {}
    for name, value in vars(inputs).items():
        if dataclasses.is_dataclass(value):
            out.update({f"{name}.{k}": v for k, v in _fields(value).items()})
        else:
            out[name] = value
    return out


def _assert_same(got, want) -> None:
    got, want = _fields(got), _fields(want)
    assert got.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[name], value.to(got[name].dtype)), name
            assert got[name].dtype == value.dtype, name
        else:
            assert got[name] == value, name


@pytest.mark.parametrize("adapters", [False, True])
def test_a_decode_step_plans_as_the_general_plan_does(adapters, monkeypatch):
    batch = _batch([5, 17, 1, 33], [1, 4, 0, 9])
    if adapters:
        batch.lora_slots = torch.tensor([-1, 2, -1, 0], dtype=torch.int32)
    q_lens = step_lengths(batch, {})
    fast = build_step_inputs(batch, q_lens)
    general = step_inputs._step_inputs(batch, q_lens, batch.cache_lens, CPU, None)
    _assert_same(fast, general)
    # and it was the fast path that planned it
    taken = []
    monkeypatch.setattr(step_inputs, "_decode_step_inputs", lambda *a: taken.append(a) or general)
    build_step_inputs(batch, q_lens)
    assert taken


def test_other_steps_take_the_general_plan(monkeypatch):
    monkeypatch.setattr(step_inputs, "_decode_step_inputs", None)  # fails if called
    batch = _batch([5, 17, 3], [1, 4, 0])
    # a row in its prompt: whole, then a one-token chunk of it
    batch.cache_lens = torch.tensor([5, 20, 0])
    build_step_inputs(batch, step_lengths(batch, {}))
    build_step_inputs(batch, step_lengths(batch, {2: 1}))
    # proposals after every decoding row's last token
    batch.cache_lens = batch.history_lens - 1
    build_step_inputs(batch, step_lengths(batch, {}) + 1, proposed=torch.ones(3, dtype=torch.long))
