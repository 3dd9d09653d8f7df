"""The soak's request mix (issue 47, 5): what each request asks and what its answer must be.

Every request draws its features independently from one seeded generator, so a run is
reproducible and every stretch of it (the first 1,000 requests, the last 1,000) has the same
mix: one of six routes (TGI /generate and /generate_stream, OpenAI completions and chat, each
streaming or not), greedy or seeded sampling, and now and then stop sequences, a grammar (TGI
`parameters.grammar` json/regex, OpenAI `response_format` / vLLM `structured_outputs`), `n` > 1
choices (OpenAI) and the LoRA adapter (`adapter_id` / `model`). A share of the streams is
dropped by the client after a random number of events.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about trains.",
    "Explain paged attention in one sentence.",
    "List three colours.",
    "Hello! How are you today?",
    "What is 12 times 7?",
    "Give me a short tip for learning Python.",
    "Translate 'good morning' into Spanish.",
    "Describe the sea in five words.",
    "Why is the sky blue?",
    "Name a famous scientist and one discovery.",
    "Write one sentence about a cat that likes rain.",
    "Ünïcödé test: café, naïve, 日本語, 🚀 — repeat it back.",
    "Count from one to five.",
]
STOPS = [["."], ["\n", "!"], [" the", " a"], [","]]
# Grammars whose shortest answers fit the token budget given to grammar requests, so many end
# by the grammar (EOS) and their text can be checked; the rest end by length, unchecked.
REGEX = r"[0-9]{1,3}( apples)?"
JSON_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
GRAMMAR_TOKENS = 16
ROUTES = {  # name -> (path, api, stream)
    "generate": ("/generate", "tgi", False),
    "generate_stream": ("/generate_stream", "tgi", True),
    "completions": ("/v1/completions", "openai", False),
    "completions_stream": ("/v1/completions", "openai", True),
    "chat": ("/v1/chat/completions", "openai", False),
    "chat_stream": ("/v1/chat/completions", "openai", True),
}
# Finish reasons that mean the model itself ended (EOS or a stop sequence), not the budget.
NATURAL_END = {"eos_token", "stop_sequence", "stop"}


@dataclass(frozen=True)
class Mix:
    """How often each feature is drawn (probabilities per request)."""

    adapter: float = 0.2
    stop: float = 0.25
    grammar: float = 0.15
    n: float = 0.2  # OpenAI routes only
    sample: float = 0.5  # seeded sampling instead of greedy
    drop: float = 0.3  # streams only: the client goes away mid-stream
    min_tokens: int = 4
    max_tokens: int = 10
    max_n: int = 3


@dataclass(frozen=True)
class SoakRequest:
    index: int
    kind: str  # a key of ROUTES
    path: str
    api: str  # "tgi" | "openai"
    stream: bool
    body: dict[str, Any]
    n: int = 1
    grammar: str = ""  # "", "json", "regex"
    stops: tuple[str, ...] = ()
    drop_after: int | None = None  # events read before the client drops the stream
    features: tuple[str, ...] = field(default=())  # for the report: what this request used


def make_requests(
    count: int, seed: int, mix: Mix, model: str, adapter: str | None, start: int = 0
) -> list[SoakRequest]:
    """Requests start..start+count-1; request i is the same whatever `count` is."""
    return [
        make_request(random.Random(f"{seed}:{i}"), i, mix, model, adapter)
        for i in range(start, start + count)
    ]


def replay_window(reqs: list[SoakRequest], first: range, last: range) -> list[SoakRequest]:
    """The requests with the `last` window a replay of the `first` (same bodies, same seeds,
    same drops): the p99 criterion then compares the server with itself on the same work, not
    two random draws of the mix."""
    out = list(reqs)
    for source, target in zip(first, last, strict=True):
        out[target] = dataclasses.replace(reqs[source], index=target)
    return out


def make_request(
    rng: random.Random, index: int, mix: Mix, model: str, adapter: str | None
) -> SoakRequest:
    kind = rng.choice(list(ROUTES))
    path, api, stream = ROUTES[kind]
    features: list[str] = [kind]
    prompt = rng.choice(PROMPTS)
    tokens = rng.randint(mix.min_tokens, mix.max_tokens)
    sampling: dict[str, Any] = {}
    if rng.random() < mix.sample:
        sampling = {"temperature": 0.8, "top_p": 0.95, "seed": rng.randrange(2**31)}
        features.append("sampled")
    use_adapter = adapter is not None and rng.random() < mix.adapter
    grammar = rng.choice(["json", "regex"]) if rng.random() < mix.grammar else ""
    # A stop sequence would cut a grammar's text short of its end: one or the other.
    stops = tuple(rng.choice(STOPS)) if not grammar and rng.random() < mix.stop else ()
    n = rng.randint(2, mix.max_n) if api == "openai" and rng.random() < mix.n else 1
    if grammar:
        tokens = GRAMMAR_TOKENS
        features.append(f"grammar:{grammar}")
    if use_adapter:
        features.append("adapter")
    if stops:
        features.append("stop")
    if n > 1:
        sampling = sampling or {"temperature": 0.8, "seed": rng.randrange(2**31)}
        features.append("n")
    drop_after = None
    if stream and rng.random() < mix.drop:
        drop_after = rng.randint(0, tokens - 1)  # 0: right after the headers
        features.append("dropped")

    if api == "tgi":
        params: dict[str, Any] = {"max_new_tokens": tokens, "details": True}
        if sampling:
            params |= {"do_sample": True, **sampling}
        if stops:
            params["stop"] = list(stops)
        if grammar == "json":
            params["grammar"] = {"type": "json", "value": JSON_SCHEMA}
        elif grammar == "regex":
            params["grammar"] = {"type": "regex", "value": REGEX}
        if use_adapter:
            params["adapter_id"] = adapter
        body: dict[str, Any] = {"inputs": prompt, "parameters": params}
    else:
        body = {"model": adapter if use_adapter else model, "max_tokens": tokens, **sampling}
        if kind.startswith("chat"):
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if stream:
            body["stream"] = True
        if n > 1:
            body["n"] = n
        if stops:
            body["stop"] = list(stops)
        if grammar == "json":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "ok", "schema": JSON_SCHEMA},
            }
        elif grammar == "regex":
            body["structured_outputs"] = {"regex": REGEX}
    return SoakRequest(
        index, kind, path, api, stream, body, n, grammar, stops, drop_after, tuple(features)
    )


def output_problem(
    req: SoakRequest, texts: list[str], finishes: list[str], last_piece: str = ""
) -> str:
    """What is wrong with a complete answer's choices ("" when nothing): one text and finish
    reason per choice, a grammar's text in its language once the model ended it, and stop
    sequences honoured (router/stopping.py). OpenAI's text ends before the first stop sequence,
    so it holds none. TGI's keeps the whole token that completed one, so the first match must
    end inside that last token (`last_piece`, its text): with finish reason stop_sequence, or
    length when the stop came on the last allowed token; never with eos_token."""
    if len(texts) != req.n or len(finishes) != req.n:
        return f"{len(texts)} texts and {len(finishes)} finish reasons for n={req.n}"
    for text, finish in zip(texts, finishes, strict=True):
        if not finish:
            return "a choice without a finish reason"
        if req.grammar and finish in NATURAL_END and not _in_grammar(req.grammar, text):
            return f"{req.grammar} grammar ended ({finish}) outside its language: {text!r}"
        ends = [text.find(s) + len(s) for s in req.stops if s in text]
        if req.api == "openai" or finish == "eos_token":
            if ends:
                return f"a stop sequence of {req.stops} inside the text ({finish}): {text!r}"
        elif finish == "stop_sequence" and not ends:
            return f"stop_sequence but none of {req.stops} in the text: {text!r}"
        elif ends and min(ends) <= len(text) - len(last_piece):
            return f"a stop sequence of {req.stops} before the last token ({finish}): {text!r}"
    return ""


def _in_grammar(grammar: str, text: str) -> bool:
    if grammar == "regex":
        return re.fullmatch(REGEX, text) is not None
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and set(value) == {"ok"} and isinstance(value["ok"], bool)
