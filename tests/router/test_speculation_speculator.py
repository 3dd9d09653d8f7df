"""The Speculator on its own: which requests take proposals and how long they may be, and how
an answer to a proposal is checked and counted."""

from __future__ import annotations

import pytest

from router.entry import Entry
from router.errors import GenerationError
from router.metrics import Metrics
from router.request import ValidRequest
from router.speculation.config import SpeculativeConfig
from router.speculation.speculator import Speculator, proposal_room
from router.stopping import StoppingCriteria
from shard.sampling.params import SamplingParams
from switchyard_pb import generate_pb2 as pb

EOS = 2


def entry(rid: int, prompt: list[int], generated: list[int], max_new: int = 20, **kw) -> Entry:
    request = ValidRequest(
        inputs="", input_ids=tuple(prompt), sampling=SamplingParams(), max_new_tokens=max_new, **kw
    )
    stopping = StoppingCriteria(max_new, [EOS], request.ignore_eos)
    e = Entry(id=rid, request=request, detokenizer=None, stopping=stopping)  # type: ignore[arg-type]
    e.prompt_done = len(prompt)
    e.generated_ids = list(generated)
    return e


def answer(rid: int, ids: list[int]) -> pb.Generation:
    return pb.Generation(request_id=rid, tokens=pb.Tokens(ids=ids, logprobs=[0.0] * len(ids)))


def speculator(**kw) -> Speculator:
    config = SpeculativeConfig(
        num_speculative_tokens=kw.pop("k", 3), prompt_lookup_min=1, prompt_lookup_max=2, **kw
    )
    return Speculator(config, Metrics())


PROMPT = [10, 11, 12, 13, 14, 10]  # after "10": "11 12 13"


def test_only_decoding_requests_take_proposals():
    s = speculator()
    decoding = entry(1, PROMPT, [11])
    first_token_pending = entry(2, PROMPT, [])
    in_prompt = entry(3, PROMPT, [])
    in_prompt.prompt_done = 3
    finished = entry(4, PROMPT, [11])
    finished.done = True
    assert s.draft([decoding, first_token_pending, in_prompt, finished]) == {1: [12, 13, 14]}
    # The proposer follows the generated tokens, also several at a time.
    decoding.generated_ids += [12, 13, 14]
    assert s.draft([decoding]) == {1: [10, 11, 12]}


def test_the_slot_limit_and_eos():
    s = speculator(k=4)
    # max_new 6 with 3 generated: one more step can make 3 tokens, so 2 proposed ones.
    assert s.draft([entry(1, PROMPT, [11, 12, 13], max_new=6)]) == {1: [14, 10]}
    assert s.draft([entry(2, PROMPT, [11, 12, 13, 14], max_new=6)]) == {2: [10]}
    assert s.draft([entry(3, PROMPT, [11, 12, 13, 14, 10], max_new=6)]) == {}
    # A proposal ends with EOS: what follows it would be discarded.
    with_eos = [10, 11, EOS, 12, 10]
    assert s.draft([entry(4, with_eos, [11])]) == {4: [EOS]}
    # ... unless the request ignores EOS.
    assert s.draft([entry(5, with_eos, [11], ignore_eos=True)]) == {5: [EOS, 12, 10, 11]}


def test_disable_by_batch_size_counts_decoding_requests():
    s = speculator(disable_by_batch_size=2)
    a, b = entry(1, PROMPT, [11]), entry(2, PROMPT, [11])
    b_in_prompt = entry(3, PROMPT, [])
    assert s.draft([a, b]) == {}
    assert s.draft([a, b_in_prompt]) == {1: [12, 13, 14]}


@pytest.mark.parametrize(
    ("prompt_len", "generated", "room"),
    [
        (13, 1, 4),  # fed position 13: proposals at 14..17, all below B = 20
        (13, 6, 1),  # fed position 18: only position 19 is below B
        (13, 7, 0),  # fed position 19: the next position is B itself
        (13, 8, 0),  # fed position 20 = B: the step recomputes the sequence with long tables
        (13, 9, 4),  # past B: no limit
        (21, 1, 4),  # a prompt longer than B never crosses
    ],
)
def test_proposals_never_reach_the_longrope_boundary(prompt_len, generated, room):
    e = entry(1, list(range(prompt_len)), list(range(generated)), max_new=40)
    assert proposal_room(e, 4, rope_regime_boundary=20) == room
    assert proposal_room(e, 4) == 4


def test_verify_counts_and_refuses_answers_that_break_the_contract():
    metrics = Metrics()
    s = Speculator(SpeculativeConfig(num_speculative_tokens=3), metrics)
    e = entry(1, PROMPT, [11])
    s.sent({1: pb.Proposal(ids=[12, 13, 14])})
    assert s.verify(e, answer(1, [12, 13, 99])) == 2
    s.sent({1: pb.Proposal(ids=[12, 13, 14])})
    assert s.verify(e, answer(1, [12, 13, 14, 15])) == 3
    s.sent({1: pb.Proposal(ids=[12, 13, 14])})
    assert s.verify(e, answer(1, [99])) == 0
    assert (e.proposed_tokens, e.accepted_tokens) == (9, 5)
    assert metrics.spec_emitted_tokens._value.get() == 8
    assert metrics.spec_accepted_per_pos.labels(position="2")._value.get() == 1
    assert s.verify(e, answer(1, [5])) == 0  # no proposal this step
    # One token answers any step, also one a shard queued ahead without the proposal.
    s.sent({1: pb.Proposal(ids=[12, 13])})
    assert s.verify(e, answer(1, [12])) == 0
    bad = [
        (None, [5, 6]),  # several tokens without a proposal
        ([12, 13], [12, 13, 14, 15]),  # more than proposal + 1
        ([12, 13], [12, 99, 5]),  # goes on after a token that differs
        ([12, 13, 14], [12, 13]),  # stops at a token that agrees
        ([12, 13], []),
    ]
    for proposed, ids in bad:
        s.sent({} if proposed is None else {1: pb.Proposal(ids=proposed)})
        with pytest.raises(GenerationError):
            s.verify(e, answer(1, ids))


def draft_speculator(k: int = 3, limit: int | None = 4) -> Speculator:
    config = SpeculativeConfig(
        num_speculative_tokens=k, method="draft_model", model="/d", disable_by_batch_size=limit
    )
    return Speculator(config, Metrics())


def test_a_draft_model_is_asked_for_guesses_below_disable_by_batch_size():
    s = draft_speculator(k=3, limit=4)
    entries = [entry(i, PROMPT, [11]) for i in range(3)]
    assert s.draft_tokens(entries) == 3
    assert s.draft_tokens([*entries, entry(9, PROMPT, [])]) == 0  # four, prompts count too
    entries[0].done = True
    assert s.draft_tokens([*entries, entry(9, PROMPT, [])]) == 3
    assert s.draft_tokens([]) == 0
    assert speculator().draft_tokens(entries) == 0  # n-gram proposals ask the shards nothing
    assert draft_speculator(limit=None).draft_tokens([entry(i, PROMPT, [11]) for i in range(50)])


def test_draft_model_guesses_are_proposed_once_while_they_follow_the_tokens():
    s = draft_speculator(k=3)
    e = entry(1, PROMPT, [11], max_new=6)
    assert s.draft([e]) == {}  # no guesses yet (and prompt lookup is not used)
    guessed = answer(1, [12])
    guessed.draft_ids.extend([13, EOS, 15])
    s.verify(e, guessed)
    e.generated_ids.append(12)
    # Cut at EOS, within the slot limit (6 - 2 - 1 = 3), taken once.
    assert s.draft([e]) == {1: [13, EOS]}
    assert s.draft([e]) == {}
    # Guesses that followed other tokens than the request has are not proposed.
    s.sent({})
    late = answer(1, [13])
    late.draft_ids.extend([14])
    s.verify(e, late)
    e.generated_ids += [13, 14]  # two tokens, where the guesses followed one
    assert s.draft([e]) == {}
    # The slot limit cuts them: max_new 6, 4 generated after this answer, so 1.
    e.generated_ids = [11, 12, 13]
    again = answer(1, [15])
    again.draft_ids.extend([16, 17, 18])
    s.verify(e, again)
    e.generated_ids.append(15)
    assert s.draft([e]) == {1: [16]}
    s.forget(1)
    assert s.draft([e]) == {}
