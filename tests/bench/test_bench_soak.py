"""The soak's request mix, answer checks and criteria on synthetic data (no servers, no clocks).
The soak itself runs end to end, shortened, in integration-tests/test_soak_short.py."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from bench.soak_checks import (
    Idle,
    latency_verdict,
    overload_verdict,
    p99,
    rss_verdict,
)
from bench.soak_client import Outcome
from bench.soak_requests import (
    ROUTES,
    Mix,
    SoakRequest,
    make_requests,
    output_problem,
    replay_window,
)
from bench.soak_rss import RssSample


def request(api: str = "tgi", stops=(), grammar: str = "", n: int = 1) -> SoakRequest:
    path = "/generate" if api == "tgi" else "/v1/completions"
    return SoakRequest(0, "k", path, api, False, {}, n, grammar, tuple(stops))


def test_requests_are_reproducible_and_independent_of_the_count():
    many = make_requests(200, 7, Mix(), "m", "lora")
    assert make_requests(50, 7, Mix(), "m", "lora") == many[:50]
    assert make_requests(10, 7, Mix(), "m", "lora", start=100) == many[100:110]
    assert make_requests(50, 8, Mix(), "m", "lora") != many[:50]


def test_the_mix_uses_every_route_and_feature_and_drops_a_share_of_streams():
    reqs = make_requests(3000, 0, Mix(), "m", "lora")
    features = Counter(f for r in reqs for f in r.features)
    assert set(ROUTES) <= set(features)
    for feature in ("sampled", "stop", "grammar:json", "grammar:regex", "n", "adapter"):
        assert features[feature] > 100, feature
    streams = [r for r in reqs if r.stream]
    assert sum(r.drop_after is not None for r in streams) / len(streams) == pytest.approx(0.3, 0.15)
    assert all(r.drop_after is None for r in reqs if not r.stream)
    assert all(r.n == 1 for r in reqs if r.api == "tgi")
    # No request without an adapter names it; OpenAI's base requests name the served model.
    assert all(r.body.get("model") in ("m", "lora") for r in reqs if r.api == "openai")
    assert not any(r.grammar and r.stops for r in reqs)
    assert all(r.drop_after is None for r in make_requests(500, 0, Mix(drop=0.0), "m", None))


def test_the_last_window_replays_the_first():
    reqs = make_requests(100, 0, Mix(), "m", "lora")
    out = replay_window(reqs, range(10, 20), range(90, 100))
    assert [r.index for r in out] == list(range(100))
    assert [r.body for r in out[90:]] == [r.body for r in reqs[10:20]]
    assert out[:90] == reqs[:90]


@pytest.mark.parametrize(
    "req, texts, finishes, last, wrong",
    [
        (request("openai", ["."]), ["Hi there"], ["stop"], "", False),
        (request("openai", ["."]), ["Hi. there"], ["length"], "", True),  # not trimmed
        (request("tgi", ["."]), ["Hi there."], ["stop_sequence"], ".", False),
        (request("tgi", ["."]), ["Wait..."], ["stop_sequence"], "...", False),  # one token
        (request("tgi", [" a"]), ["smoke and"], ["stop_sequence"], " and", False),
        (request("tgi", ["."]), ["Hi. there."], ["stop_sequence"], ".", True),  # missed first
        (request("tgi", ["."]), ["Hi there"], ["stop_sequence"], "re", True),  # no stop at all
        (request("tgi", ["."]), ["Hi there."], ["length"], ".", False),  # on the last token
        (request("tgi", ["."]), ["Hi. there"], ["length"], "re", True),
        (request("tgi", ["."]), ["Hi. there"], ["eos_token"], "re", True),
        (request("tgi", grammar="regex"), ["42 apples"], ["eos_token"], "", False),
        (request("tgi", grammar="regex"), ["42 pears"], ["eos_token"], "", True),
        (request("tgi", grammar="regex"), ["42 pe"], ["length"], "", False),  # cut short
        (request("openai", grammar="json"), ['{"ok": true}'], ["stop"], "", False),
        (request("openai", grammar="json"), ['{"ok": 1}'], ["stop"], "", True),
        (request("openai", n=2), ["a", "b"], ["stop", "length"], "", False),
        (request("openai", n=2), ["a"], ["stop"], "", True),
        (request("openai", n=2), ["a", "b"], ["stop", ""], "", True),
    ],
)
def test_output_problems(req, texts, finishes, last, wrong):
    assert bool(output_problem(req, texts, finishes, last)) == wrong


def outcome(index: int, latency: float = 1.0, **kw) -> Outcome:
    return Outcome(index, "generate", kw.pop("status", 200), latency, **kw)


def test_p99_and_latency_windows():
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([3.0]) == 3.0
    first = [outcome(i, 1.0) for i in range(100)]
    # The last window is 5% slower; a dropped request or an error is not a latency.
    last = [outcome(i, 1.05) for i in range(100, 200)]
    odd = [outcome(150, 100.0, dropped=True), outcome(151, 100.0, error="x")]
    verdict = latency_verdict(first + last + odd, range(0, 100), range(100, 200))
    assert verdict.passed and verdict.figures["ratio"] == pytest.approx(1.05)
    slow = [outcome(i, 1.2) for i in range(100, 200)]
    assert not latency_verdict(first + slow, range(0, 100), range(100, 200)).passed


def test_rss_growth_fails_only_past_five_percent():
    def samples(end_router: int) -> list[RssSample]:
        early = [RssSample(t, t, {"router": 100, "shard 0": 200}) for t in range(0, 10)]
        late = [RssSample(t, t, {"router": end_router, "shard 0": 190}) for t in range(90, 100)]
        return early + late

    assert rss_verdict(samples(104), range(0, 10), range(90, 100)).passed
    grown = rss_verdict(samples(110), range(0, 10), range(90, 100))
    assert not grown.passed and grown.figures["growth"]["router"] == pytest.approx(0.10)
    assert not rss_verdict(samples(100)[:10], range(0, 10), range(90, 100)).passed  # no data


def test_overload_takes_only_429s_and_complete_answers():
    refused = outcome(1, status=429, error="HTTP 429", error_type="overloaded")
    assert overload_verdict([outcome(0), refused]).passed
    assert not overload_verdict([outcome(0)]).passed  # the limit was never reached
    assert not overload_verdict([refused]).passed  # nothing accepted
    lost = outcome(2, error="the stream ended before its last event")
    assert not overload_verdict([outcome(0), refused, lost]).passed
    for other in (
        outcome(3, status=503, error="HTTP 503"),
        outcome(3, status=None, error="reset"),
        dataclasses.replace(refused, error_type="validation"),
    ):
        assert not overload_verdict([outcome(0), refused, other]).passed, other


def test_idle_is_clean_only_with_every_block_permit_and_slot_back():
    base = {
        "tgi_batch_current_size": 0.0,
        "tgi_queue_size": 0.0,
        "switchyard_requests_in_flight": 0.0,
        "switchyard_kv_blocks_used": 0.0,
        "switchyard_kv_blocks_free": 64.0,
        "switchyard_kv_blocks_total": 64.0,
        "switchyard_lora_adapters_live": 0.0,
    }
    assert Idle(base, 0.0).clean
    for name, value in [
        ("switchyard_kv_blocks_used", 1.0),
        ("switchyard_kv_blocks_free", 63.0),
        ("switchyard_requests_in_flight", 1.0),
        ("switchyard_lora_adapters_live", 1.0),
        ("tgi_queue_size", 1.0),
    ]:
        assert not Idle({**base, name: value}, 0.0).clean, name
