"""Turns the shards' Generation messages into tokens, text and events for one request.

This is where the router's own decisions about a request's output are made: incremental text
(never half a UTF-8 character), stopping (length, EOS, stop sequences), the grammar of
structured output (router/structured.py) and the final text.
"""

from __future__ import annotations

import math
import time

from router.detokenizer import REPLACEMENT_CHAR
from router.entry import Entry, Finished, Token, TokenEvent
from router.metrics import Metrics
from router.tokenizer import Tokenizer
from switchyard_pb import generate_pb2 as pb


class Results:
    def __init__(self, tokenizer: Tokenizer, metrics: Metrics) -> None:
        self.tokenizer = tokenizer
        self.metrics = metrics

    def apply(self, entry: Entry, gen: pb.Generation) -> bool:
        """Records one step's output for the entry; True when it finished with this step."""
        if gen.HasField("prefill_tokens") and entry.request.decoder_input_details:
            entry.prefill = self.tokens(gen.prefill_tokens)
            entry.prefill_top = [tuple(self.tokens(t)) for t in gen.prefill_top_tokens]
        ids, logprobs, tops = gen.tokens.ids, gen.tokens.logprobs, gen.top_tokens
        for i, token_id in enumerate(ids):
            logprob = logprobs[i] if i < len(logprobs) else math.nan
            if self._emit(entry, token_id, logprob, tops[i] if i < len(tops) else None):
                return True
        return False

    def _emit(self, entry: Entry, token_id: int, logprob: float, top: pb.Tokens | None) -> bool:
        grammar_ended = False
        if entry.constraint is not None:
            entry.constraint.accept(token_id)  # a refused token fails the request
            grammar_ended = entry.constraint.ended
        special = self.tokenizer.is_special(token_id)
        content = entry.detokenizer.push(token_id)
        text = self.tokenizer.piece(token_id) if special else content
        reason = entry.stopping.step(token_id, text, grammar_ended)
        if reason is not None:
            tail = entry.detokenizer.flush()  # the stream must add up to the whole text
            content += tail
            text = tail + text if special else content
        token = Token(token_id, text, logprob, special, content)
        top_tokens = tuple(self.tokens(top)) if top is not None else ()
        now = time.monotonic()
        first = not entry.tokens
        # TTFT counts from the HTTP request's arrival, as a client experiences it.
        previous = entry.received_at if first else (entry.last_token_at or now)
        self.metrics.token(now - previous, first, entry.request.adapter_id)
        entry.last_token_at = now
        entry.generated_ids.append(token_id)
        entry.tokens.append(token)
        entry.top_tokens.append(top_tokens)
        finished = None
        if reason is not None:
            sampling = entry.request.sampling
            finished = Finished(
                generated_text=self.final_text(entry),
                finish_reason=reason,
                stopped=entry.stopping.stopped,
                generated_tokens=len(entry.generated_ids),
                seed=sampling.seed if sampling.do_sample else None,
            )
            entry.done = True
            self._record_finished(entry, now)
        entry.events.put_nowait(TokenEvent(token, top_tokens, finished))
        return finished is not None

    def _record_finished(self, entry: Entry, now: float) -> None:
        started = entry.started_at if entry.started_at is not None else now
        self.metrics.finished(
            total_s=now - entry.received_at,
            validation_s=entry.queued_at - entry.received_at,
            inference_s=now - started,
            input_tokens=entry.request.input_length,
            generated_tokens=len(entry.generated_ids),
            max_new_tokens=entry.request.max_new_tokens,
        )

    def tokens(self, tokens: pb.Tokens) -> list[Token]:
        """Prompt or top-n tokens: each decoded on its own, NaN logprobs as unknown."""
        tok = self.tokenizer
        return [
            Token(tid, tok.piece(tid), None if math.isnan(lp) else lp, tok.is_special(tid))
            for tid, lp in zip(tokens.ids, tokens.logprobs, strict=False)
        ]

    def final_text(self, entry: Entry) -> str:
        """TGI's generated_text: all new tokens decoded at once, special tokens skipped, with
        one prompt token as context so a leading space is decoded as in the full text."""
        tok = self.tokenizer
        context = list(entry.request.input_ids[-1:])
        context_text = tok.decode(context, skip_special_tokens=True)
        if context_text.endswith(REPLACEMENT_CHAR):
            context, context_text = [], ""
        text = tok.decode(context + entry.generated_ids, skip_special_tokens=True)
        return text[len(context_text) :]
