"""What the LoRA end-to-end tests compare the server with: greedy generation by transformers in
float32, through PEFT's PeftModel when an adapter is given, each adapter alone."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch


@cache
def peft_greedy(
    base: Path, adapter: Path | None, prompt: str, new_tokens: int
) -> tuple[list[int], list[float]]:
    """The greedy ids and their logprobs (no EOS stop, as with `ignore_eos`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.shard.lora_fixtures import peft_reference

    tokenizer = AutoTokenizer.from_pretrained(base)
    if adapter is None:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    else:
        model = peft_reference(base, adapter)
    ids = tokenizer(prompt).input_ids
    out, logprobs = [], []
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            out.append(token)
    return out, logprobs
