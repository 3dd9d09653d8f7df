"""A validated generation request: plain data, everything resolved (defaults, seed, sampling)."""

from __future__ import annotations

from dataclasses import dataclass

from shard.sampling.params import SamplingParams  # the one declaration, shared with the shard


@dataclass(frozen=True)
class ValidRequest:
    inputs: str
    input_ids: tuple[int, ...]  # after truncation
    sampling: SamplingParams
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    details: bool = False
    decoder_input_details: bool = False
    return_full_text: bool = False
    top_n_tokens: int = 0
    best_of: int = 1
    adapter_id: str = ""

    @property
    def input_length(self) -> int:
        return len(self.input_ids)

    @property
    def total_tokens(self) -> int:
        """Cache positions the request may occupy, all reserved at admission."""
        return len(self.input_ids) + self.max_new_tokens
