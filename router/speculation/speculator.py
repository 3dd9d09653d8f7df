"""The router's side of speculative decoding: what each step proposes, and what came of it.

The batcher asks `draft` for the step's proposals before a Prefill or Decode, sends them
(`proposals` in both RPCs), and hands every answer to `verify` before the tokens are applied. A
request can take a proposal only while it decodes: its prompt is computed and it has a token to
feed (the shards run that token and the proposed ones after it in one pass). Proposals come from
prompt lookup (router/speculation/ngram.py), one proposer per decoding request, fed the prompt
once and each generated token as it arrives; or, with a draft model, from the shards: a step
asks for `draft_tokens` guesses (`draft_tokens`), each answer carries its request's
(`Generation.draft_ids`), and the next step proposes them, checked here as any proposal is.

The slot limit: a request reserved KV slots for prompt + max_new_tokens, and a step that feeds
its last known token writes K/V for it and for each proposed token after it. With g tokens
generated, a step can produce at most max_new_tokens - g more, the last of them the token
sampled after the last proposal: so at most max_new_tokens - g - 1 proposed tokens are useful
(one more would fit the slots, but even if accepted the request ends before the token it
buys), and none once that is 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.entry import Entry
from router.errors import GenerationError
from router.metrics import Metrics
from router.speculation.config import SpeculativeConfig
from router.speculation.ngram import NgramProposer
from switchyard_pb import generate_pb2 as pb


def is_decoding(entry: Entry) -> bool:
    """Its prompt is computed and it has a generated token to feed next."""
    return entry.prompt_left == 0 and bool(entry.generated_ids) and not entry.done


def proposal_room(entry: Entry, k: int, rope_regime_boundary: int = 0) -> int:
    """How many tokens a proposal for this decoding request may hold this step (0: none)."""
    request = entry.request
    generated = len(entry.generated_ids)
    room = min(k, request.max_new_tokens - generated - 1)
    if 0 < rope_regime_boundary and request.input_length <= rope_regime_boundary:
        # Longrope: a short prompt's sequence is recomputed whole with the long tables in the
        # step that feeds its token at position B (docs/architecture.md, "Longrope"); proposals
        # must neither reach position B (their K would be rotated with the short tables of a
        # sequence that is already longer than B) nor ride along the recomputing step.
        fed = request.input_length + generated - 1  # position of the token fed this step
        if fed <= rope_regime_boundary:
            room = min(room, rope_regime_boundary - 1 - fed)
    return max(room, 0)


class Speculator:
    def __init__(
        self, config: SpeculativeConfig, metrics: Metrics, rope_regime_boundary: int = 0
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.rope_regime_boundary = rope_regime_boundary
        self._proposers: dict[int, NgramProposer] = {}  # by entry id, once it decodes
        self._sent: dict[int, list[int]] = {}  # the current step's proposals, by entry id
        # The shards' draft-model guesses by entry id, with the tokens generated before them.
        self._guesses: dict[int, tuple[int, list[int]]] = {}
        metrics.track_speculation(config.num_speculative_tokens)

    def draft_tokens(self, entries: Sequence[Entry]) -> int:
        """How many guesses the step asks of the shards' draft model for each request that
        decodes after it (0: none, also past disable_by_batch_size)."""
        if self.config.method != "draft_model":
            return 0
        live = sum(1 for e in entries if not e.done)
        limit = self.config.disable_by_batch_size
        if not live or (limit is not None and live >= limit):
            return 0
        return self.config.num_speculative_tokens

    def draft(self, entries: Sequence[Entry]) -> dict[int, list[int]]:
        """The proposed ids for the step's requests, by entry id: decoding requests only,
        within their slot limit, and none at all once the step's decoding requests reach
        disable_by_batch_size."""
        decoding = [e for e in entries if is_decoding(e)]
        limit = self.config.disable_by_batch_size
        if not decoding or (limit is not None and len(decoding) >= limit):
            return {}
        drafts: dict[int, list[int]] = {}
        for entry in decoding:
            room = proposal_room(
                entry, self.config.num_speculative_tokens, self.rope_regime_boundary
            )
            if room == 0:
                continue
            ids = self._proposed(entry, room)
            eos = entry.stopping.eos_token_ids  # empty when the request ignores EOS
            for i, token in enumerate(ids):
                if token in eos:  # the request ends there: nothing after it is worth verifying
                    ids = ids[: i + 1]
                    break
            if ids:
                drafts[entry.id] = ids
        return drafts

    def sent(self, proposals: Mapping[int, pb.Proposal]) -> None:
        """What this step actually proposes (after the grammar checks), for `verify`."""
        self._sent = {rid: list(p.ids) for rid, p in proposals.items()}

    def verify(self, entry: Entry, gen: pb.Generation) -> int:
        """Checks a generation against the step's proposal for its request and counts the
        acceptance; returns the proposed tokens accepted (0 without a proposal).

        The shards answer the sampled tokens up to and including the first that differs from
        the proposal. Any other answer means their K/V hold tokens the request does not have:
        the request fails (GenerationError) rather than go on from a corrupt cache."""
        proposed = self._sent.pop(entry.id, None)
        ids = list(gen.tokens.ids)
        if gen.draft_ids:  # guesses of what follows this answer, for the next step
            self._guesses[entry.id] = (len(entry.generated_ids) + len(ids), list(gen.draft_ids))
        if proposed is None:
            if len(ids) > 1:
                raise GenerationError(
                    f"the shard answered {len(ids)} tokens for a step without proposed tokens"
                )
            return 0
        n = len(ids)
        accepted = n - 1
        agrees = 1 <= n <= len(proposed) + 1 and ids[:accepted] == proposed[:accepted]
        if agrees and 0 < accepted < len(proposed):
            # The first that differs ends a run. One token is any step's answer, also that of
            # a step the shard queued ahead without the proposal (an overlapping shard started
            # apart from the launcher, which never pairs the two): the cache holds it either way.
            agrees = ids[accepted] != proposed[accepted]
        if not agrees:
            raise GenerationError(
                f"the shard's answer to proposed tokens {proposed} was {ids}, not the sampled "
                "tokens up to and including the first that differs"
            )
        entry.proposed_tokens += len(proposed)
        entry.accepted_tokens += accepted
        self.metrics.speculated(len(proposed), accepted, n)
        return accepted

    def forget(self, entry_id: int) -> None:
        """The request left the batch: its lookup tables go."""
        self._proposers.pop(entry_id, None)
        self._sent.pop(entry_id, None)
        self._guesses.pop(entry_id, None)

    def clear(self) -> None:
        self._proposers.clear()
        self._sent.clear()
        self._guesses.clear()

    def _proposed(self, entry: Entry, room: int) -> list[int]:
        """Up to `room` tokens to follow the entry's last one: the draft model's guesses when
        they follow exactly the tokens it has (none after a step that asked for none), else
        prompt lookup's."""
        if self.config.method != "draft_model":
            return self._synced(entry).propose(room)
        guessed = self._guesses.pop(entry.id, None)
        if guessed is None or guessed[0] != len(entry.generated_ids):
            return []
        return guessed[1][:room]

    def _synced(self, entry: Entry) -> NgramProposer:
        """The entry's proposer, fed whatever it has not seen: the prompt the first time, then
        the tokens generated since (several after an accepted run or a skipped step)."""
        proposer = self._proposers.get(entry.id)
        if proposer is None:
            cfg = self.config
            proposer = NgramProposer(cfg.prompt_lookup_min, cfg.prompt_lookup_max)
            proposer.extend(entry.request.input_ids)
            self._proposers[entry.id] = proposer
        seen = len(proposer) - entry.request.input_length
        if seen < len(entry.generated_ids):
            proposer.extend(entry.generated_ids[seen:])
        return proposer
