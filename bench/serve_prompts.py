"""Prompts whose tokenized length is exactly the target, checked with the model's own tokenizer.

Both servers tokenize the text themselves, so the client sends text; a prompt is only accepted
once re-encoding it gives exactly `length` tokens, so every server sees the same prompt lengths.
"""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer

# Safety bound on the adjust loop; with round-tripping pieces it settles in a round or two.
MAX_ROUNDS = 1000


class PromptFactory:
    def __init__(self, model_dir: Path, seed: int = 0) -> None:
        self.tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self.seed = seed
        special = {t.content for t in self.tokenizer.get_added_tokens_decoder().values()}
        vocab = {tok: i for tok, i in self.tokenizer.get_vocab().items() if tok not in special}
        # Space-prefixed pieces ("Ġword" in byte-level BPE) start a new pre-token, so a string of
        # them tokenizes piece by piece; keep those whose text re-encodes to exactly themselves
        # (drops partial UTF-8 bytes and pieces the pre-tokenizer would split).
        candidates = sorted(i for tok, i in vocab.items() if tok.startswith("Ġ")) or sorted(
            vocab.values()
        )
        texts = self.tokenizer.decode_batch([[i] for i in candidates])
        encoded = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        self.pieces = [i for i, e in zip(candidates, encoded, strict=True) if e.ids == [i]]
        if not self.pieces:
            raise ValueError(f"no token of {model_dir} round-trips through its own tokenizer")

    def count(self, text: str) -> int:
        # add_special_tokens=True: what both servers do with a completion prompt.
        return len(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def make(self, length: int, index: int) -> str:
        """Prompt number `index` (deterministic for a seed) of exactly `length` tokens."""
        if length < 1:
            raise ValueError(f"prompt length must be at least 1, got {length}")
        rng = random.Random(f"{self.seed}:{index}:{length}")
        ids = [rng.choice(self.pieces) for _ in range(length)]
        for _ in range(MAX_ROUNDS):
            text = self.tokenizer.decode(ids)
            got = self.count(text)  # special tokens (e.g. a BOS) included
            if got == length:
                return text
            if got > length and len(ids) > 1:
                ids.pop()
            else:
                ids.append(rng.choice(self.pieces))
        raise RuntimeError(f"no prompt of exactly {length} tokens after {MAX_ROUNDS} rounds")

    def many(self, length: int, n: int, offset: int = 0) -> list[str]:
        return [self.make(length, offset + i) for i in range(n)]
