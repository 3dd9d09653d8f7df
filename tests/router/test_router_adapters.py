"""router/adapters.py on its own: the --lora-adapters syntax, name resolution, live counts and the
admission gate."""

import pytest

from router.adapters import (
    AdapterRegistry,
    AdapterSpecError,
    LiveAdapters,
    LoraAdapter,
    parse_adapters,
)
from router.args import parse_args
from router.errors import ModelNotFoundError, ValidationError


def test_flag_syntax_comma_separated_and_repeated():
    parsed = parse_adapters(["sql=/a/sql, chat = /a/chat", "x=/a/x,"], "base-model")
    assert parsed == (
        LoraAdapter("sql", "/a/sql"),
        LoraAdapter("chat", "/a/chat"),
        LoraAdapter("x", "/a/x"),
    )
    assert parse_adapters([], "m") == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("sql", "'sql' is not NAME=DIR"),
        ("=/a/sql", "'=/a/sql' is not NAME=DIR"),
        ("sql=", "'sql=' is not NAME=DIR"),
        ("sql=/a,sql=/b", "'sql' is given twice"),
        ("m=/a", "'m' is the served model name"),
        ("base=/a", "'base' is reserved for the base model"),
    ],
)
def test_bad_specs_name_the_entry(value, message):
    with pytest.raises(AdapterSpecError, match=message):
        parse_adapters([value], "m")


def test_router_flags(capsys):
    args = parse_args(["--model-id", "/m", "--shard-uds-path", "/s", "--lora-adapters", "a=/x"])
    assert args.lora_adapters == (LoraAdapter("a", "/x"),) and args.max_loras == 4
    args = parse_args(["--model-id", "/m", "--shard-uds-path", "/s", "--max-loras", "2"])
    assert args.lora_adapters == () and args.max_loras == 2
    for bad, flag in ([["--lora-adapters", "a=/x,a=/y"], "--lora-adapters"],
                      [["--max-loras", "0"], "--max-loras"]):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            parse_args(["--model-id", "/m", "--shard-uds-path", "/s", *bad])
        assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_registry_resolves_names_and_refuses_unknown_ones():
    reg = AdapterRegistry((LoraAdapter("sql", "/a"), LoraAdapter("chat", "/b")), "tiny")
    assert reg.adapter_id("sql") == "sql" and reg.adapter_id("") == ""
    with pytest.raises(ValidationError, match="'tiny' is not a loaded LoRA adapter. Loaded: sql"):
        reg.adapter_id("tiny")
    assert [reg.model(m) for m in ("chat", "tiny", None)] == ["chat", "", ""]
    with pytest.raises(ModelNotFoundError) as err:
        reg.model("sq1")
    assert err.value.status == 404 and err.value.to_json("r")["error_type"] == "model_not_found"
    assert str(err.value) == "The model `sq1` does not exist. Available models: tiny, sql, chat"
    empty = AdapterRegistry((), "tiny")
    assert empty.model("anything") == ""  # one model served: `model` is not checked
    with pytest.raises(ValidationError, match="no LoRA adapters are loaded"):
        empty.adapter_id("sql")


def test_live_counts_per_request_and_the_gate():
    live = LiveAdapters(max_loras=2)
    for adapter in ("a", "a", "", "b"):
        live.acquire(adapter)
    assert live.live() == {"a", "b"} and live.distinct == 2
    gate = live.gate()
    assert gate.admit("") and gate.admit("a") and gate.admit("b")
    assert not gate.admit("c")  # both slots taken
    live.release("a")
    assert live.live() == {"a", "b"}  # a's second request is still live
    live.release("a")
    live.release("")
    assert live.live() == {"b"}
    gate = live.gate()
    assert gate.admit("c")  # the slot a left
    assert not gate.admit("d")  # c took it within this round
    assert live.live() == {"b"}  # a gate only counts; admission is acquire()
    live.clear()
    assert live.distinct == 0
    with pytest.raises(ValueError, match="max_loras"):
        LiveAdapters(0)
