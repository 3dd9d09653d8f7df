"""Structured output end to end: the real router over a real shard, in one batch with
unconstrained requests, against transformers' greedy generate with a logits processor that
masks with llguidance's own matcher (the grammar library, not our code), token for token."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import llguidance
import llguidance.hf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor

from launcher.tiny_models import build_model
from tests.router.harness import real_router_env
from tests.shard.servicer_helpers import start_service

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 2},
    },
    "required": ["name", "age", "ok", "tags"],
    "additionalProperties": False,
}
SMALL = {  # given as JSON text
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"],
    "additionalProperties": False,
}
REGEX = r"(ab|cd)[0-9]{2,3}-[a-z]{1,4}"
MAX_NEW = 96


class LlguidanceMask(LogitsProcessor):
    """transformers-side reference: the tokens llguidance's matcher allows, unpacked with
    numpy, every other logit at -inf."""

    def __init__(self, tokenizer, eos: list[int], grammar: str, prompt_len: int) -> None:
        self.matcher = llguidance.LLMatcher(
            llguidance.hf.from_tokenizer(tokenizer, eos_token=eos), grammar
        )
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[0, self.prompt_len :].tolist()
        if generated:
            assert self.matcher.consume_token(generated[-1]), self.matcher.get_error()
        words = np.frombuffer(self.matcher.compute_bitmask(), dtype="<u4")
        bits = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
        allowed = torch.zeros(scores.shape[1], dtype=torch.bool)
        n = min(len(bits), scores.shape[1])
        allowed[:n] = torch.from_numpy(bits[:n])
        return scores.masked_fill(~allowed, float("-inf"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("structured") / "llama", num_key_value_heads=2)


@pytest.fixture(scope="module")
def reference(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = [model.generation_config.eos_token_id]

    def generate(prompt_ids: list[int], grammar: str | None) -> tuple[list[int], list[float]]:
        processors = [LlguidanceMask(tokenizer, eos, grammar, len(prompt_ids))] if grammar else []
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt_ids]),
                max_new_tokens=MAX_NEW,
                do_sample=False,
                logits_processor=processors,
                eos_token_id=eos,
                pad_token_id=0,
                output_scores=True,
                return_dict_in_generate=True,
            )
        ids = out.sequences[0, len(prompt_ids) :].tolist()
        logprobs = [
            torch.log_softmax(s[0], -1)[t].item() for s, t in zip(out.scores, ids, strict=True)
        ]
        return ids, logprobs

    return tokenizer, generate


PROMPTS = ["The weather today", "def forward(self, x):", "Once upon a time there", "1 2 3 4"]


def _grammar_text(kind: str, value: str | dict) -> str:
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(value)
    # As TGI (outlines) and the server: at most one space between JSON tokens.
    return llguidance.LLMatcher.grammar_from_json_schema(
        value, defaults={"whitespace_pattern": "[ ]?"}
    )


CASES = [
    # (prompt, TGI grammar or None, the reference grammar)
    (PROMPTS[0], {"type": "json", "value": SCHEMA}, ("json", SCHEMA)),
    (PROMPTS[1], {"type": "regex", "value": REGEX}, ("regex", REGEX)),
    (PROMPTS[2], None, None),
    (
        PROMPTS[3],
        {"type": "json", "value": json.dumps(SMALL)},
        ("json", SMALL),
    ),
    (
        PROMPTS[1],
        {"type": "json_schema", "value": {"name": "p", "schema": SCHEMA}},
        ("json", SCHEMA),
    ),
    (PROMPTS[2], {"type": "regex", "value": r"(yes|no|maybe)"}, ("regex", r"(yes|no|maybe)")),
]


def _check_output(text: str, spec: tuple[str, object] | None, finished: bool) -> None:
    """What the grammar promises of a finished (EOS-ended) text."""
    if spec is None or not finished:
        return
    kind, value = spec
    if kind == "regex":
        assert re.fullmatch(value, text), text
    else:
        jsonschema.validate(json.loads(text), value)


@pytest.fixture(scope="module")
def service(model_dir):
    return start_service(model_dir)


def test_constrained_requests_in_one_batch_equal_transformers_with_llguidance(
    model_dir, reference, service
):
    tokenizer, generate = reference

    async def run() -> list[dict]:
        async with real_router_env(service, model_dir, max_batch_prefill_tokens=256) as env:

            async def one(prompt: str, grammar: dict | None) -> dict:
                parameters = {"max_new_tokens": MAX_NEW, "details": True}
                if grammar is not None:
                    parameters["grammar"] = grammar
                r = await env.client.post(
                    "/generate", json={"inputs": prompt, "parameters": parameters}
                )
                assert r.status == 200, await r.text()
                return await r.json()

            return await asyncio.gather(*(one(p, g) for p, g, _ in CASES))

    answers = asyncio.run(run())
    finished_by_grammar = 0
    for (prompt, _, spec), answer in zip(CASES, answers, strict=True):
        prompt_ids = tokenizer(prompt)["input_ids"]
        grammar = _grammar_text(*spec) if spec else None
        ref_ids, ref_logprobs = generate(prompt_ids, grammar)
        details = answer["details"]
        ids = [t["id"] for t in details["tokens"]]
        assert ids == ref_ids, (prompt, spec, answer["generated_text"])
        logprobs = [t["logprob"] for t in details["tokens"]]
        assert logprobs == pytest.approx(ref_logprobs, abs=1e-4)
        finished = details["finish_reason"] == "eos_token"
        _check_output(answer["generated_text"], spec, finished)
        finished_by_grammar += finished and spec is not None
    # The grammar's end, not the length limit, ended every constrained request: the semantic
    # checks above ran on all of them.
    assert finished_by_grammar == sum(spec is not None for _, _, spec in CASES)


def test_openai_response_format_equals_the_reference_and_ends_with_the_grammar(
    model_dir, reference, service
):
    """Chat json_schema (whole and streamed, with logprobs) and completions with `ignore_eos`,
    which must still end where the grammar ends; json_object gives a JSON object."""
    tokenizer, generate = reference
    messages = [{"role": "user", "content": "Describe a person."}]
    json_schema = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    base = {"model": str(model_dir), "temperature": 0, "max_tokens": MAX_NEW}
    chat = {**base, "messages": messages, "response_format": json_schema, "logprobs": True}
    small = {"type": "json_schema", "json_schema": {"name": "s", "schema": SMALL, "strict": True}}
    completion = {**base, "prompt": PROMPTS[0], "response_format": small, "ignore_eos": True}

    async def run():
        async with real_router_env(service, model_dir) as env:
            post = env.client.post
            whole = await post("/v1/chat/completions", json=chat)
            streamed = await post("/v1/chat/completions", json={**chat, "stream": True})
            done = await post("/v1/completions", json=completion)
            obj = await post(
                "/v1/completions",
                json={**base, "prompt": PROMPTS[3], "response_format": {"type": "json_object"}},
            )
            for r in (whole, streamed, done, obj):
                assert r.status == 200, await r.text()
            return await whole.json(), await streamed.text(), await done.json(), await obj.json()

    whole, streamed, done, obj = asyncio.run(run())

    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ref_ids, ref_logprobs = generate(
        tokenizer(text, add_special_tokens=False)["input_ids"], _grammar_text("json", SCHEMA)
    )
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == tokenizer.decode(ref_ids, skip_special_tokens=True)
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
    assert logprobs == pytest.approx(ref_logprobs, abs=1e-4)

    events = [json.loads(line[5:]) for line in streamed.splitlines() if line[5:].strip()[:1] == "{"]
    deltas = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert deltas == choice["message"]["content"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"

    # ignore_eos: nothing may follow the grammar's EOS, so the request ends there anyway.
    ref_ids, _ = generate(tokenizer(PROMPTS[0])["input_ids"], _grammar_text("json", SMALL))
    assert done["choices"][0]["finish_reason"] == "stop"
    assert done["usage"]["completion_tokens"] == len(ref_ids) < MAX_NEW
    assert done["choices"][0]["text"] == tokenizer.decode(ref_ids, skip_special_tokens=True)

    if obj["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(obj["choices"][0]["text"]), dict)
    else:  # cut by max_tokens: still the start of an object
        assert obj["choices"][0]["text"].startswith("{")


SAMPLING = [
    {"do_sample": True, "seed": 1},
    {"temperature": 1.5, "seed": 2},
    {"top_k": 5, "seed": 3},
    {"top_p": 0.8, "seed": 4},
    {"typical_p": 0.5, "seed": 5},
    {"do_sample": True, "seed": 6, "repetition_penalty": 2.0},
]


def test_sampled_rows_and_best_of_candidates_stay_in_the_grammar(model_dir, service):
    async def run():
        async with real_router_env(service, model_dir) as env:

            async def one(parameters: dict) -> dict:
                body = {
                    "inputs": PROMPTS[1],
                    "parameters": {
                        "max_new_tokens": MAX_NEW,
                        "grammar": {"type": "regex", "value": REGEX},
                        "details": True,
                        **parameters,
                    },
                }
                r = await env.client.post("/generate", json=body)
                assert r.status == 200, await r.text()
                return await r.json()

            return await asyncio.gather(
                *(one(p) for p in SAMPLING), one({"best_of": 2, "do_sample": True})
            )

    answers = asyncio.run(run())
    texts = [a["generated_text"] for a in answers]
    texts += [s["generated_text"] for s in answers[-1]["details"]["best_of_sequences"]]
    for text in texts:
        assert re.fullmatch(REGEX, text), texts
    assert len(set(texts)) > 1  # sampling did sample


VLLM_CHOICES = ["yes", 'say "no"', "日本語", "(a|b)*"]  # quotes, non-ASCII, regex syntax: literal


@pytest.mark.parametrize(
    "constraint, reference_grammar",
    [
        ({"structured_outputs": {"choice": VLLM_CHOICES}}, ("lark", VLLM_CHOICES)),
        ({"guided_choice": VLLM_CHOICES}, ("lark", VLLM_CHOICES)),
        ({"structured_outputs": {"regex": REGEX}}, ("regex", REGEX)),
        ({"guided_json": SMALL}, ("json", SMALL)),
        ({"structured_outputs": {"json": json.dumps(SMALL)}}, ("json", SMALL)),
    ],
)
def test_vllm_structured_outputs_equal_the_reference(
    model_dir, reference, service, constraint, reference_grammar
):
    tokenizer, generate = reference
    body = {"model": str(model_dir), "prompt": PROMPTS[2], "temperature": 0, "max_tokens": MAX_NEW}

    async def run():
        async with real_router_env(service, model_dir) as env:
            r = await env.client.post("/v1/completions", json={**body, **constraint})
            assert r.status == 200, await r.text()
            return await r.json()

    choice = asyncio.run(run())["choices"][0]
    kind, value = reference_grammar
    if kind == "lark":  # vLLM's choice, written out as the grammar it means
        grammar = llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
        )
        assert choice["text"] in value
    else:
        grammar = _grammar_text(kind, value)
    ref_ids, _ = generate(tokenizer(PROMPTS[2])["input_ids"], grammar)
    assert choice["text"] == tokenizer.decode(ref_ids, skip_special_tokens=True)
    assert choice["finish_reason"] == "stop"
