"""--speculate / --speculative-config: vLLM's keys, defaults and checks for method "ngram", and a
clear one-line refusal (naming the flag and the key) for everything else."""

from __future__ import annotations

import json

import pytest

from router.args import parse_args
from router.speculation.config import (
    MAX_SPECULATIVE_TOKENS,
    SpeculativeConfig,
    SpeculativeConfigError,
    parse_speculative_config,
    speculate,
)

BASE = ["--model-id", "/m", "--shard-uds-path", "/tmp/s"]


def spec(**fields) -> SpeculativeConfig:
    return parse_speculative_config(json.dumps(fields))


def test_vllm_defaults_for_the_lookup_window():
    # Neither bound: 5 and 5 (vLLM's); one bound: the other takes its value.
    assert spec(method="ngram", num_speculative_tokens=3) == SpeculativeConfig(3, "ngram", 5, 5)
    assert spec(method="ngram", num_speculative_tokens=3, prompt_lookup_max=4) == (
        SpeculativeConfig(3, "ngram", 4, 4)
    )
    assert spec(method="ngram", num_speculative_tokens=3, prompt_lookup_min=2) == (
        SpeculativeConfig(3, "ngram", 2, 2)
    )
    full = spec(
        method="ngram",
        num_speculative_tokens=7,
        prompt_lookup_min=1,
        prompt_lookup_max=3,
        disable_by_batch_size=8,
    )
    assert full == SpeculativeConfig(7, "ngram", 1, 3, 8)
    # Ours: without disable_by_batch_size, 8; null keeps vLLM's "never".
    assert spec(method="ngram", num_speculative_tokens=3).disable_by_batch_size == 8
    never = spec(method="ngram", num_speculative_tokens=3, disable_by_batch_size=None)
    assert never.disable_by_batch_size is None
    assert parse_speculative_config(never.to_json()) == never
    # vLLM's older spelling: the method as the model's name.
    assert spec(model="[ngram]", num_speculative_tokens=2).method == "ngram"
    assert spec(method="[ngram]", model="ngram", num_speculative_tokens=2).method == "ngram"


def test_a_model_other_than_ngram_is_a_draft_model():
    # vLLM's reading: without a method, a model names the draft (method draft_model).
    config = spec(model="/models/draft", num_speculative_tokens=4, disable_by_batch_size=None)
    assert (config.method, config.model, config.num_speculative_tokens) == (
        "draft_model",
        "/models/draft",
        4,
    )
    assert config.disable_by_batch_size is None
    assert spec(method="draft_model", model="org/d", num_speculative_tokens=2).model == "org/d"
    assert parse_speculative_config(config.to_json()) == config
    assert "prompt_lookup" not in config.to_json()


def test_speculate_is_the_shorthand_of_the_json():
    assert speculate(4) == spec(method="ngram", num_speculative_tokens=4)
    for config in (
        speculate(4),
        spec(method="ngram", num_speculative_tokens=2, disable_by_batch_size=3),
    ):
        assert parse_speculative_config(config.to_json()) == config


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"method": "eagle", "num_speculative_tokens": 3}, ["'eagle'", "not implemented", "ngram"]),
        ({"method": "draft_model", "num_speculative_tokens": 3}, ["'draft_model'", "needs model"]),
        (
            {"method": "ngram", "model": "/draft", "num_speculative_tokens": 3},
            ["'/draft'", "method 'ngram'", "'draft_model'"],
        ),
        ({"model": "/draft"}, ["num_speculative_tokens is required", "'draft_model'"]),
        (
            {"model": "/draft", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
            ["prompt_lookup_max", "only for method 'ngram'"],
        ),
        ({"model": 7, "num_speculative_tokens": 3}, ["model must be a non-empty string"]),
        ({"method": "mtp", "num_speculative_tokens": 1}, ["'mtp'", "not implemented"]),
        ({"method": "medusa", "num_speculative_tokens": 1}, ["'medusa'", "not implemented"]),
        ({"method": "wat", "num_speculative_tokens": 1}, ["'wat'", "not a known method"]),
        ({"num_speculative_tokens": 3}, ["method is required", "ngram"]),
        ({"method": "ngram"}, ["num_speculative_tokens is required"]),
        (
            {"method": "ngram", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1},
            ["'draft_tensor_parallel_size'", "supported keys", "prompt_lookup_max"],
        ),
        ({"method": "ngram", "num_speculative_tokens": 0}, ["num_speculative_tokens", "got 0"]),
        (
            {"method": "ngram", "num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1},
            ["num_speculative_tokens", f"between 1 and {MAX_SPECULATIVE_TOKENS}"],
        ),
        ({"method": "ngram", "num_speculative_tokens": 2.0}, ["must be an integer"]),
        ({"method": "ngram", "num_speculative_tokens": True}, ["must be an integer"]),
        ({"method": "ngram", "num_speculative_tokens": "3"}, ["must be an integer"]),
        (
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0},
            ["prompt_lookup_min", "got 0"],
        ),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_min": 4,
                "prompt_lookup_max": 2,
            },
            ["prompt_lookup_min=4 must be <= prompt_lookup_max=2"],
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 1},
            ["disable_by_batch_size", ">= 2"],
        ),
    ],
)
def test_refusals_name_the_key_and_the_supported_values(fields, words):
    with pytest.raises(SpeculativeConfigError) as err:
        spec(**fields)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("text", ["", "[1]", "{'method': 'ngram'}", "3"])
def test_not_a_json_object(text):
    with pytest.raises(SpeculativeConfigError, match="JSON"):
        parse_speculative_config(text)


def test_router_flags(capsys):
    assert parse_args(BASE).speculative_config is None
    assert parse_args([*BASE, "--speculate", "3"]).speculative_config == speculate(3)
    text = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'
    assert parse_args([*BASE, "--speculative-config", text]).speculative_config == (
        SpeculativeConfig(2, "ngram", 3, 3)
    )
    cases = [
        (["--speculate", "3", "--speculative-config", text], "cannot be used together"),
        (["--speculate", "0"], "argument --speculate: must be between 1 and 16"),
        (["--speculate", "x"], "argument --speculate: must be an integer"),
        (["--speculative-config", '{"method": "eagle"}'], "argument --speculative-config: "),
        (["--speculative-config", "{"], "argument --speculative-config: not valid JSON"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exc:
            parse_args([*BASE, *argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
