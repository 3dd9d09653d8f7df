"""Incremental detokenization (TGI's prefix_offset / read_offset method).

Decoding one token at a time is wrong for most tokenizers: byte-level BPE tokens can hold part
of a UTF-8 character, and SentencePiece pieces change their leading space with context. So each
step decodes a small window twice, `ids[prefix:read]` (text already emitted) and `ids[prefix:]`,
and emits the difference, but only when it grew and does not end in U+FFFD (the replacement
character a decoder writes for an incomplete UTF-8 sequence). Held-back bytes come out with the
token that completes the character, or at the end in `flush`.

Special tokens are skipped in decoding, as in the final text (decoded at once, skipping them):
a special token emits nothing, and bytes held back before it still join the bytes after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as context: enough for SentencePiece's leading space and for a character
# whose first bytes sit at the end of the prompt.
PROMPT_CONTEXT = 5
# The window is trimmed once this many ids lie before prefix_offset, so steps stay O(1).
TRIM_AT = 64


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, decoder: Decoder, prompt_ids: Sequence[int] = ()) -> None:
        self._decoder = decoder
        self._ids: list[int] = list(prompt_ids[-PROMPT_CONTEXT:])
        self._prefix = 0
        self._read = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Adds one generated token; returns the text it completes (possibly empty, always for
        a special token)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
            self._advance()
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end), once, at the end."""
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._advance()
        return new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""

    def _advance(self) -> None:
        self._prefix, self._read = self._read, len(self._ids)
        if self._prefix >= TRIM_AT:
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
