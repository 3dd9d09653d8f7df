"""A validated generation request: plain data, everything resolved (defaults, seed, sampling)."""

from __future__ import annotations

from dataclasses import dataclass

from switchyard_pb import generate_pb2 as pb


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    # Already true when any warper is set (TGI samples whenever temperature != 1, top_k, top_p
    # or typical_p is given), so the shard only ever reads this flag.
    do_sample: bool = False
    seed: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0

    def to_proto(self) -> pb.NextTokenChooserParameters:
        return pb.NextTokenChooserParameters(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            typical_p=self.typical_p,
            do_sample=self.do_sample,
            seed=self.seed,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
        )


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
