"""transformers on the same weights, in float32: the reference every result is compared with."""

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch


@dataclass(frozen=True)
class ReferenceGeneration:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # log-softmax of the raw logits at each chosen token
    prompt_logprobs: list[float]  # logprob of prompt token j+1 given 0..j


@lru_cache(maxsize=4)
def _load(model_dir: str, tokenizer_dir: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return AutoTokenizer.from_pretrained(tokenizer_dir), model


def greedy(
    model_dir: Path, prompt: str, max_new_tokens: int, tokenizer_dir: Path | None = None
) -> ReferenceGeneration:
    """`tokenizer_dir`: where the tokenizer is when `model_dir` has only weights (the
    library-dequantized twin of a quantized checkpoint)."""
    tokenizer, model = _load(str(model_dir), str(tokenizer_dir or model_dir))
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        prompt_logits = model(ids).logits[0]
    tokens = out.sequences[0, ids.shape[1] :].tolist()
    logprobs = [
        torch.log_softmax(step_logits[0].float(), -1)[tok].item()
        for step_logits, tok in zip(out.logits, tokens, strict=True)
    ]
    prompt_lp = torch.log_softmax(prompt_logits.float(), -1)[:-1].gather(1, ids[0, 1:, None])
    return ReferenceGeneration(ids[0].tolist(), tokens, logprobs, prompt_lp[:, 0].tolist())
