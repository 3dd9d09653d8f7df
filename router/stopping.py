"""When a request is finished: the router decides, the shards only compute.

The reason follows TGI's order: the length limit first, then the EOS token, then stop
sequences. A stop sequence matches anywhere in the generated text, also across token
boundaries; like TGI, the generated text keeps the stop sequence. `stopped` also records an EOS
or stop sequence on the last allowed token, which TGI reports as "length": OpenAI's routes say
"stop" then, as vLLM does, since the text ends where the model or the stop sequence ended it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence


class FinishReason(str, enum.Enum):
    LENGTH = "length"
    EOS_TOKEN = "eos_token"
    STOP_SEQUENCE = "stop_sequence"


class StoppingCriteria:
    def __init__(
        self,
        max_new_tokens: int,
        eos_token_ids: Iterable[int] = (),
        ignore_eos: bool = False,
        stop_sequences: Sequence[str] = (),
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = frozenset(() if ignore_eos else eos_token_ids)
        self.stop_sequences = tuple(s for s in stop_sequences if s)
        # Only this much text before the newest chunk can be part of a new match.
        self._keep = max((len(s) for s in self.stop_sequences), default=1) - 1
        self._tail = ""
        self.generated = 0
        self.stopped = False  # the EOS token or a stop sequence ended the text

    def step(self, token_id: int, text: str, grammar_ended: bool = False) -> FinishReason | None:
        """Records one generated token and the text it emitted; returns why to stop, if so.

        `grammar_ended`: structured output's grammar took its EOS token and allows nothing
        more, which ends the request like EOS even when it ignores EOS."""
        self.generated += 1
        eos = token_id in self.eos_token_ids or grammar_ended
        matched = self._matches(text)
        self.stopped = eos or matched
        if self.generated >= self.max_new_tokens:
            return FinishReason.LENGTH
        if eos:
            return FinishReason.EOS_TOKEN
        if matched:
            return FinishReason.STOP_SEQUENCE
        return None

    def _matches(self, text: str) -> bool:
        if not self.stop_sequences or not text:
            return False
        window = self._tail + text
        if any(stop in window for stop in self.stop_sequences):
            return True
        self._tail = window[-self._keep :] if self._keep else ""
        return False
