"""Off-the-shelf clients against the real launcher: the official `openai` client and TGI's
`text-generation` client, unmodified; plus validation (JSON 422s naming the field, on
/generate and /generate_stream alike), cancellation, overload and scheduling seen from outside.
One server for the whole module (a launcher start costs ~10-20 s on 2 cores).

Greedy results must equal transformers' greedy output on the same weights (reference.py).
"""

import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests
from it_cases import PROMPTS
from reference import greedy
from server_process import LauncherProcess
from transformers import AutoTokenizer

pytestmark = pytest.mark.slow
KEY = "it-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_CONCURRENT = 6
# Long enough to still be running while the test sends more requests.
LONG = 300
LOGPROB_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def served(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    flags = [
        "--dtype", "float32",
        "--max-batch-total-tokens", "4096",
        "--max-input-tokens", "256",
        "--max-total-tokens", "512",
        "--max-concurrent-requests", str(MAX_CONCURRENT),
        "--api-key", KEY,
        "--served-model-name", "tiny-llama",
    ]  # fmt: skip
    with LauncherProcess(model_dir, *flags) as server:
        yield server, model_dir


@pytest.fixture(scope="module")
def oai(served):
    server, _ = served
    # No retries: a 429 must surface, not be retried away.
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)


def _text(model_dir, ids) -> str:
    return AutoTokenizer.from_pretrained(model_dir).decode(ids, skip_special_tokens=True)


def _chat_prompt(model_dir, messages) -> str:
    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _metrics(server) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{server.url}/metrics", timeout=10).text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


def test_openai_chat_greedy_equals_transformers(served, oai):
    _, model_dir = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[1]}]
    ref = greedy(model_dir, _chat_prompt(model_dir, messages), 16)
    out = oai.chat.completions.create(
        model="tiny-llama", messages=messages, temperature=0, max_tokens=16
    )
    assert out.model == "tiny-llama"
    assert out.choices[0].message.content == _text(model_dir, ref.token_ids)
    assert out.usage.completion_tokens == len(ref.token_ids)
    assert out.usage.prompt_tokens == len(ref.prompt_ids)

    stream = oai.chat.completions.create(
        model="tiny-llama",
        messages=messages,
        temperature=0,
        max_completion_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        top_logprobs=2,
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == out.choices[0].message.content
    logprobs = [lp.logprob for c in chunks if c.choices and c.choices[0].logprobs
                for lp in c.choices[0].logprobs.content]  # fmt: skip
    assert logprobs == pytest.approx(ref.logprobs, abs=LOGPROB_TOLERANCE)
    assert chunks[-1].usage.completion_tokens == len(ref.token_ids)


def test_openai_completions_greedy_equals_transformers(served, oai):
    _, model_dir = served
    prompt = PROMPTS[3]
    ref = greedy(model_dir, prompt, 12)
    out = oai.completions.create(
        model="tiny-llama", prompt=prompt, temperature=0, max_tokens=12, logprobs=2
    )
    choice = out.choices[0]
    assert choice.text == _text(model_dir, ref.token_ids)
    assert choice.logprobs.token_logprobs == pytest.approx(ref.logprobs, abs=LOGPROB_TOLERANCE)
    # Keyed by text: two byte pieces of one character both read "\ufffd" and share a key.
    assert all(1 <= len(top) <= 2 for top in choice.logprobs.top_logprobs)
    stream = oai.completions.create(
        model="tiny-llama", prompt=prompt, temperature=0, max_tokens=12, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == choice.text
    # ignore_eos (vLLM's extension, through extra_body) fixes the output length.
    fixed = oai.completions.create(
        model="tiny-llama", prompt="Hello", max_tokens=40, extra_body={"ignore_eos": True}
    )
    assert fixed.usage.completion_tokens == 40 and fixed.choices[0].finish_reason == "length"


def test_tgi_client_generate_and_stream(served):
    # Not in the dev extra (README): it pins huggingface-hub<1.0; installed with --no-deps.
    text_generation = pytest.importorskip(
        "text_generation", reason="make install adds it with --no-deps"
    )
    server, model_dir = served
    client = text_generation.Client(server.url, headers=AUTH, timeout=120)
    prompt = PROMPTS[2]
    ref = greedy(model_dir, prompt, 14)
    out = client.generate(prompt, max_new_tokens=14, decoder_input_details=True, top_n_tokens=2)
    assert [t.id for t in out.details.tokens] == ref.token_ids
    assert [t.id for t in out.details.prefill] == ref.prompt_ids
    assert out.details.generated_tokens == len(ref.token_ids)
    assert len(out.details.top_tokens[0]) == 2
    events = list(client.generate_stream(prompt, max_new_tokens=14, top_n_tokens=1))
    assert [e.token.id for e in events] == ref.token_ids
    assert events[-1].generated_text == out.generated_text
    assert all(len(e.top_tokens) == 1 for e in events)
    with pytest.raises(text_generation.errors.ValidationError, match="top_n_tokens"):
        client.generate(prompt, max_new_tokens=2, top_n_tokens=6)  # --max-top-n-tokens: 5


def test_validation_auth_and_payload_limit_end_to_end(served, oai):
    server, _ = served
    for body, field in [
        ({"inputs": "Hi", "parameters": {"temperature": -1}}, "temperature"),
        ({"inputs": "Hi", "parameters": {"max_new_tokens": 600}}, "max_new_tokens"),
        ({"inputs": "fox " * 300}, "256"),
        ({"inputs": "Hi", "parameters": {"stop": ["a"] * 5}}, "stop"),
    ]:
        r = requests.post(f"{server.url}/generate", json=body, headers=AUTH, timeout=30)
        assert r.status_code == 422 and r.json()["error_type"] == "validation"
        assert field in r.json()["error"]
    with pytest.raises(openai.UnprocessableEntityError) as err:
        oai.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "x"}], n=129
        )
    # TGI's error body (as TGI's own OpenAI layer sends it): the client exposes it as `body`.
    assert "`n` must be >= 1 and <= 128" in err.value.body
    wrong_key = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong_key.completions.create(model="tiny-llama", prompt="x")
    big = json.dumps({"inputs": "x" * 2_000_100}).encode()
    json_type = {**AUTH, "Content-Type": "application/json"}
    r = requests.post(f"{server.url}/generate", data=big, headers=json_type, timeout=30)
    assert r.status_code == 413 and r.json()["error_type"] == "payload_too_large"
    assert [m.id for m in oai.models.list()] == ["tiny-llama"]
    with pytest.raises(openai.NotFoundError) as err:  # a model this server does not serve
        oai.completions.create(model="gpt-4o", prompt="x")
    assert err.value.status_code == 404 and "`gpt-4o` does not exist" in err.value.body
    r = requests.post(f"{server.url}/generate", json={"inputs": "Hi"}, headers=AUTH, timeout=60)
    assert r.status_code == 200 and "x-inference-time" in r.headers


@pytest.mark.parametrize("route", ["/generate", "/generate_stream"])
@pytest.mark.parametrize(
    "parameters, field",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_new_tokens": 1000}, "max_new_tokens"),
        ({"top_k": -3}, "top_k"),
    ],
)
def test_invalid_parameter_is_a_422_naming_the_field(served, route, parameters, field):
    server, _ = served
    body = {"inputs": "Hello", "parameters": parameters}
    r = requests.post(f"{server.url}{route}", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error_type"] == "validation"
    assert field in body["error"]


def test_server_still_answers_after_errors(served):
    server, _ = served
    requests.post(
        f"{server.url}/generate",
        data=b"{not json",
        headers={**AUTH, "content-type": "application/json"},
        timeout=30,
    )
    r = requests.post(
        f"{server.url}/generate",
        json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}},
        headers=AUTH,
        timeout=60,
    )
    assert r.status_code == 200
    assert r.json()["generated_text"] is not None
    info = requests.get(f"{server.url}/info", timeout=10).json()
    assert info["max_input_tokens"] == 256 and info["max_total_tokens"] == 512


def _open_stream(server, prompt: str, max_tokens: int) -> requests.Response:
    """A greedy completion stream of exactly max_tokens (ignore_eos), its first chunk read."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    body["logprobs"] = 0  # each chunk names its token: results compare token by token
    r = requests.post(
        f"{server.url}/v1/completions",
        json={**body, "stream": True},
        headers=AUTH,
        stream=True,
        timeout=120,
    )
    assert r.status_code == 200, r.text
    lines = r.iter_lines(decode_unicode=True)
    first = next(line for line in lines if line)
    assert first.startswith("data: ")  # generating now
    r.lines, r.body = itertools.chain([first], lines), body  # for whoever reads on
    return r


def _tokens(choices: list[dict]) -> tuple[list[str], list[float]]:
    """Tokens and their logprobs: text alone would not do, a random model writes broken UTF-8."""
    tokens = [t for c in choices for t in c["logprobs"]["tokens"]]
    return tokens, [lp for c in choices for lp in c["logprobs"]["token_logprobs"]]


def _rest_of_stream(r: requests.Response) -> tuple[tuple[list[str], list[float]], dict]:
    chunks = [line[6:] for line in r.lines if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    choices = [json.loads(c)["choices"][0] for c in chunks[:-1]]
    return _tokens([c for c in choices if c["logprobs"]]), choices[-1]


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_cancelled_streams_return_every_kv_block(served):
    server, _ = served
    before = _metrics(server)  # counters: the server has served this module's other tests
    streams = [_open_stream(server, p, 400) for p in PROMPTS[:3]]
    busy = _metrics(server)
    assert busy["switchyard_kv_blocks_used"] > 0 and busy["tgi_batch_current_size"] >= 3
    for r in streams:
        r.close()  # the client goes away mid-generation
    _wait_for(lambda: _metrics(server)["switchyard_kv_blocks_used"] == 0)
    _wait_for(lambda: _metrics(server)["switchyard_requests_in_flight"] == 0)  # permits too
    idle = _metrics(server)
    assert idle["switchyard_kv_blocks_free"] == idle["switchyard_kv_blocks_total"]
    assert idle["tgi_batch_current_size"] == 0
    cancelled = "switchyard_request_cancelled_total"
    assert idle[cancelled] - before.get(cancelled, 0) >= 3
    generated = "switchyard_generated_tokens_total"
    assert idle[generated] - before.get(generated, 0) < 3 * 400  # stopped early


def test_a_running_batch_keeps_admitting_and_overload_loses_nothing(served):
    server, model_dir = served
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(6)]
    # Long generations (~2 s here) hold most permits...
    held = [_open_stream(server, p, LONG) for p in prompts[: MAX_CONCURRENT - 2]]
    # ...while two short requests join the running batch and finish before it does.
    with ThreadPoolExecutor(2) as pool:
        short = list(pool.map(
            lambda p: requests.post(f"{server.url}/generate", headers=AUTH, timeout=120,
                                    json={"inputs": p, "parameters": {"max_new_tokens": 4}}),
            PROMPTS[:2],
        ))  # fmt: skip
    assert [r.status_code for r in short] == [200, 200], [r.text for r in short]
    assert _metrics(server)["tgi_batch_current_size"] == MAX_CONCURRENT - 2  # still running
    # Every permit taken: the next request is refused at once.
    held += [_open_stream(server, p, LONG) for p in prompts[MAX_CONCURRENT - 2 :]]
    started = time.monotonic()
    refused = requests.post(f"{server.url}/generate", json={"inputs": "Hi"}, headers=AUTH)
    assert time.monotonic() - started < 5
    assert refused.status_code == 429
    assert refused.json() == {
        "error": "Model is overloaded",
        "error_type": "overloaded",
        "request_id": refused.headers["x-request-id"],
    }
    # No accepted request is lost: every held stream runs to its end, and gives what the same
    # request gives alone.
    for i, r in enumerate(held):
        (tokens, logprobs), last = _rest_of_stream(r)
        assert last["finish_reason"] == "length" and len(tokens) == LONG
        if i in (0, len(held) - 1):  # two are enough, and each takes a while alone
            body = r.body
            alone = requests.post(f"{server.url}/v1/completions", json=body, headers=AUTH)
            alone_tokens, alone_logprobs = _tokens(alone.json()["choices"])
            assert alone_tokens == tokens
            assert alone_logprobs == pytest.approx(logprobs, abs=LOGPROB_TOLERANCE)
    for r, prompt in zip(short, PROMPTS[:2], strict=True):
        expected = _text(model_dir, greedy(model_dir, prompt, 4).token_ids)
        assert r.json()["generated_text"] == expected
