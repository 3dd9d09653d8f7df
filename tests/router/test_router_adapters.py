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
    assert empty.model("tiny") == "" and empty.model(None) == ""
    with pytest.raises(
        ModelNotFoundError, match="`anything` does not exist. Available models: tiny$"
    ):
        empty.model("anything")  # no adapters: still only the served model's name
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
    assert live.draining == "b"  # d found no slot: b, the only live adapter, drains for it
    live.clear()
    assert live.distinct == 0 and live.draining is None
    with pytest.raises(ValueError, match="max_loras"):
        LiveAdapters(0)


def test_the_drain_frees_a_slot_for_the_first_skipped_request():
    live = LiveAdapters(max_loras=2)
    for adapter in ("a", "b", "b"):
        live.acquire(adapter)
    gate = live.gate()
    assert gate.admit("a")  # before anything was skipped, a admits as usual
    assert not gate.admit("c")  # no slot: skipped, and a (one request, b has two) drains
    assert live.draining == "a"
    assert gate.admit("") and gate.admit("b")  # no new slot needed: not held up
    assert not gate.admit("a")  # came after c: would keep a's slot from c
    assert not gate.admit("d")
    gate = live.gate()  # next round, a still live: c is skipped again, the drain goes on
    assert not gate.admit("c") and not gate.admit("a") and live.draining == "a"
    live.release("a")
    assert live.draining is None and live.live() == {"b"}
    gate = live.gate()
    assert gate.admit("c")  # first in the queue: first to the freed slot
    assert not gate.admit("d") and not gate.admit("a")
    assert live.draining == "b"  # the only live adapter now drains for d
