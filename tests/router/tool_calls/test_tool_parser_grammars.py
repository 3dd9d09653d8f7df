"""The parsers' grammars under llguidance: they compile, take what the parser reads as calls,
and whatever a random walk through them writes parses into calls that follow the schemas."""

from __future__ import annotations

import json
import random

import jsonschema
import llguidance
import llguidance.hf
import pytest
from tokenizers import AddedToken

from launcher.tiny_models import build_tokenizer
from router.tool_calls.enforced_stream import ARGUMENT_HEADS, EnforcedCallStream
from router.tool_calls.hermes import CLOSE, OPEN
from router.tool_calls.registry import TOOL_PARSERS, tool_parser
from router.tool_calls.types import CallDelta, Tool, ToolParser
from tests.router.tool_calls.checks import check_stream

EOS = 2
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "days": {"type": "integer", "minimum": 0, "maximum": 99},
        "unit": {"enum": ["c", "f"]},
        "note": {"type": "string", "maxLength": 4},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
PING_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}
TOOLS = [Tool("get_weather", "The weather", WEATHER_SCHEMA), Tool("ping", None, PING_SCHEMA)]
SCHEMAS = {tool.name: tool.parameters for tool in TOOLS}

# Texts each grammar must take (all tools, parallel), in the format's layout of JSON.
ARGS = '{"city": "Paris", "days": 3, "unit": "c"}'
ACCEPTED = {
    "hermes": [
        f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>',
        '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Oslo", "days": 0, "unit": "f", "note": "ok"}}\n</tool_call>',
    ],
    "llama3_json": [
        f'{{"name": "get_weather", "parameters": {ARGS}}}',
        f'{{"name": "ping", "parameters": {{}}}}; {{"name": "get_weather", "parameters": {ARGS}}}',
    ],
    "mistral": [
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {ARGS}}}]',
        f'[TOOL_CALLS][{{"name": "ping", "arguments": {{}}}}, '
        f'{{"name": "get_weather", "arguments": {ARGS}}}]',
    ],
    "mistral_args": [
        f"[TOOL_CALLS]get_weather[ARGS]{ARGS}",
        f"[TOOL_CALLS]ping[ARGS]{{}}[TOOL_CALLS]get_weather[ARGS]{ARGS}",
    ],
    "pythonic": [
        '[get_weather(city="Paris", days=3, unit="c")]',
        '[ping(), get_weather(city="Oslo", days=0, unit="f", note="ok")]',
    ],
    "openai": [
        f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}"
        "<|call|>",
        "<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{}<|call|>"
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Oslo", "days": 0, "unit": "f", "note": "ok"}<|call|>',
    ],
}


def _xml(call: str, params: str, end: str, *pairs: tuple[str, str]) -> str:
    return call + "".join(params.format(k=k, v=v) for k, v in pairs) + end


WEATHER_PAIRS = (("city", "Paris"), ("days", "3"), ("unit", "c"))
OSLO_PAIRS = (("city", "Oslo"), ("days", "0"), ("unit", "f"), ("note", "ok"))
QWEN3_CODER = (
    "<tool_call>\n<function={}>\n",
    "<parameter={k}>\n{v}\n</parameter>\n",
    "</function>\n</tool_call>",
)
SEED = (
    "<seed:tool_call>\n<function={}>\n",
    "<parameter={k}>{v}</parameter>\n",
    "</function>\n</seed:tool_call>",
)
GLM45 = ("<tool_call>{}\n", "<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n", "</tool_call>")
GLM47 = ("<tool_call>{}", "<arg_key>{k}</arg_key><arg_value>{v}</arg_value>", "</tool_call>")
MINIMAX = ('<invoke name="{}">\n', '<parameter name="{k}">{v}</parameter>\n', "</invoke>\n")


def xml_calls(layout: tuple[str, str, str], separator: str, *calls) -> str:
    call, params, end = layout
    return separator.join(_xml(call.format(name), params, end, *pairs) for name, pairs in calls)


def minimax(*calls) -> str:
    return "<minimax:tool_call>\n" + xml_calls(MINIMAX, "", *calls) + "</minimax:tool_call>"


def dsml(*calls) -> str:
    """DeepSeek-V3.2's block: each parameter says whether its value is a string (`days` is
    the weather tool's only JSON one)."""

    def param(key: str, value: str) -> str:
        flag = "false" if key == "days" else "true"
        return f'<｜DSML｜parameter name="{key}" string="{flag}">{value}</｜DSML｜parameter>\n'

    body = "".join(
        f'<｜DSML｜invoke name="{name}">\n' + "".join(param(k, v) for k, v in pairs)
        + "</｜DSML｜invoke>\n"
        for name, pairs in calls
    )  # fmt: skip
    return "<｜DSML｜function_calls>\n" + body + "</｜DSML｜function_calls>"


DS_CALL = "<｜tool▁call▁begin｜>{}<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
DS3_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{}\n```json\n{}\n```<｜tool▁call▁end｜>"
KIMI_CALL = "<|tool_call_begin|>functions.{}:{}<|tool_call_argument_begin|>{}<|tool_call_end|>"
OSLO = '{"city": "Oslo", "days": 0, "unit": "f", "note": "ok"}'
ONE, BOTH = [("get_weather", WEATHER_PAIRS)], [("ping", ()), ("get_weather", OSLO_PAIRS)]
ACCEPTED |= {
    "qwen3_coder": [xml_calls(QWEN3_CODER, "\n", *ONE), xml_calls(QWEN3_CODER, "\n", *BOTH)],
    "seed_oss": [xml_calls(SEED, "\n", *ONE), xml_calls(SEED, "\n", *BOTH)],
    "glm45": [xml_calls(GLM45, "\n", *ONE), xml_calls(GLM45, "\n", *BOTH)],
    "glm47": [xml_calls(GLM47, "", *ONE), xml_calls(GLM47, "", *BOTH)],
    "minimax_m2": [minimax(*ONE), minimax(*BOTH)],
    "deepseek_v32": [dsml(*ONE), dsml(*BOTH)],
    "deepseek_v3": [
        "<｜tool▁calls▁begin｜>" + DS3_CALL.format("get_weather", ARGS) + "<｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜>" + DS3_CALL.format("ping", "{}") + "\n"
        + DS3_CALL.format("get_weather", OSLO) + "<｜tool▁calls▁end｜>",
    ],
    "deepseek_v31": [
        "<｜tool▁calls▁begin｜>" + DS_CALL.format("get_weather", ARGS) + "<｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜>" + DS_CALL.format("ping", "{}")
        + DS_CALL.format("get_weather", OSLO) + "<｜tool▁calls▁end｜>",
    ],
    "kimi_k2": [
        "<|tool_calls_section_begin|>" + KIMI_CALL.format("get_weather", 0, ARGS)
        + "<|tool_calls_section_end|>",
        "<|tool_calls_section_begin|>" + KIMI_CALL.format("ping", 0, "{}")
        + KIMI_CALL.format("get_weather", 1, OSLO) + "<|tool_calls_section_end|>",
    ],
}  # fmt: skip
# How each format writes the enum value "c" (the JSON ones: `"c"`).
UNIT_C = {"qwen3_coder": "\nc\n", "seed_oss": ">c<", "glm45": ">c<", "glm47": ">c<",
          "minimax_m2": ">c<", "deepseek_v32": ">c<"}  # fmt: skip

# Variants: which parser, and which markers the tokenizer does not hold as one token.
VARIANTS = {
    "hermes": ("hermes", set()),
    "llama3_json": ("llama3_json", set()),
    "mistral": ("mistral", {"[ARGS]"}),  # a v3 tokenizer: the list form
    "mistral_args": ("mistral", set()),  # `[ARGS]` is a token: the newer form
    "pythonic": ("pythonic", set()),
    "openai": ("openai", set()),
    **{name: (name, set()) for name in UNIT_C},
    "deepseek_v3": ("deepseek_v3", set()),
    "deepseek_v31": ("deepseek_v31", set()),
    "kimi_k2": ("kimi_k2", set()),
}


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tokenizer(512)
    # As in Qwen's tokenizers: `<tool_call>` and `</tool_call>` are added tokens, not special.
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in (OPEN, CLOSE)])
    # The others as special tokens: GLM's argument tags among them, so the XML grammars meet
    # a value's closing tag both as a token (GLM) and as text (Qwen3-Coder's `</parameter>`).
    special = {m for parser in TOOL_PARSERS.values() for m in parser.markers} - {OPEN, CLOSE}
    tok.add_special_tokens({"additional_special_tokens": sorted(special)})
    return tok


@pytest.fixture(scope="module")
def ll_tokenizer(tokenizer):
    return llguidance.hf.from_tokenizer(tokenizer, eos_token=[EOS])


def marker_of(tokenizer, text_only: set[str]):
    def marker(text: str) -> str:
        token_id = tokenizer.convert_tokens_to_ids(text)
        if text not in text_only and tokenizer.convert_ids_to_tokens(token_id) == text:
            return f"<[{token_id}]>"
        return json.dumps(text)

    return marker


def grammar_of(tokenizer, variant: str, tools=TOOLS, parallel=True) -> tuple[ToolParser, str]:
    name, text_only = VARIANTS[variant]
    parser = tool_parser(name).for_tools(tools)
    return parser, parser.grammar(tools, parallel, marker_of(tokenizer, text_only))


def matcher(ll_tokenizer, grammar: str) -> llguidance.LLMatcher:
    found = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar))
    assert not found.is_error(), found.get_error()
    return found


def takes(ll_tokenizer, tokenizer, grammar: str, text: str) -> bool:
    found = matcher(ll_tokenizer, grammar)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return found.consume_tokens(ids) and found.is_accepting()


def check_calls(parser: ToolParser, text: str, most: int | None = None) -> None:
    """`text` is calls only, each of a tool and following its schema; so is its stream."""
    parsed = parser.parse(text)
    assert parsed.content is None, text
    assert parsed.calls and (most is None or len(parsed.calls) <= most), text
    for call in parsed.calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    check_stream(parser, text, list(text))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("parallel", [True, False])
def test_grammar_compiles(tokenizer, ll_tokenizer, variant, parallel):
    _, grammar = grammar_of(tokenizer, variant, parallel=parallel)
    lark = llguidance.LLMatcher.grammar_from_lark(grammar)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(lark, ll_tokenizer)
    assert not is_error, messages


@pytest.mark.parametrize("variant", VARIANTS)
def test_grammar_takes_what_the_parser_reads(tokenizer, ll_tokenizer, variant):
    parser, grammar = grammar_of(tokenizer, variant)
    for text in ACCEPTED[variant]:
        check_calls(parser, text)
        assert takes(ll_tokenizer, tokenizer, grammar, text), text


@pytest.mark.parametrize("variant", VARIANTS)
def test_grammar_refuses_what_it_must(tokenizer, ll_tokenizer, variant):
    parser, single = grammar_of(tokenizer, variant, parallel=False)
    one, two = ACCEPTED[variant]
    assert takes(ll_tokenizer, tokenizer, single, one)
    assert not takes(ll_tokenizer, tokenizer, single, two)  # two calls, one allowed
    assert not takes(ll_tokenizer, tokenizer, single, one.replace("get_weather", "get_weathe"))
    unit = UNIT_C.get(variant, '"c"')
    assert unit in one
    assert not takes(ll_tokenizer, tokenizer, single, one.replace(unit, unit.replace("c", "k")))
    # A named choice offers its tool only.
    _, named = grammar_of(tokenizer, variant, tools=[TOOLS[1]], parallel=False)
    assert not takes(ll_tokenizer, tokenizer, named, one)


def walk(tokenizer, ll_tokenizer, grammar: str, seed: int) -> str:
    """A random answer under `grammar`: random allowed tokens, stopping at random where it may
    stop (past 150 tokens, a token that ends it where there is one; never over 600)."""
    rng = random.Random(seed)
    found = matcher(ll_tokenizer, grammar)
    tokens: list[int] = []
    while not found.is_stopped() and len(tokens) < 600:
        if found.is_accepting() and rng.random() < 0.5:
            break
        bias = found.compute_logit_bias()
        allowed = [i for i, b in enumerate(bias) if b and i != EOS]
        if not allowed:
            break
        if len(tokens) > 150:  # long enough: head for an end (a block's closer, say)
            allowed = [i for i in allowed if _ends(found, i)] or allowed
        tokens.append(rng.choice(allowed))
        assert found.consume_token(tokens[-1]), found.get_error()
    assert found.is_accepting(), tokenizer.decode(tokens)
    return tokenizer.decode(tokens)


def _ends(found: llguidance.LLMatcher, token: int) -> bool:
    after = found.deep_copy()
    return after.consume_token(token) and after.is_accepting()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_walks_parse_into_valid_calls(tokenizer, ll_tokenizer, variant, parallel, seed):
    parser, grammar = grammar_of(tokenizer, variant, parallel=parallel)
    text = walk(tokenizer, ll_tokenizer, grammar, seed)
    check_calls(parser, text, most=None if parallel else 1)


def streamed_calls(parser: ToolParser, text: str, cuts: list[int]) -> list[tuple[str, dict]]:
    """The calls an enforced request's stream tells for `text` pushed in pieces, put together
    as a client does: by index, the name from the first delta, arguments joined."""
    stream = EnforcedCallStream(ARGUMENT_HEADS[parser.name])
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    deltas = [d for piece in pieces for d in stream.push(piece)] + stream.finish()
    assert all(isinstance(d, CallDelta) for d in deltas), "an enforced answer is calls only"
    calls: dict[int, list] = {}
    for d in deltas:
        call = calls.setdefault(d.index, [None, ""])
        if d.name is not None:
            assert call[0] is None and call[1] == "", "the name comes first, once"
            call[0] = d.name
        call[1] += d.arguments
    return [(name, json.loads(arguments)) for name, arguments in calls.values()]


JSON_VARIANTS = [v for v, (name, _) in VARIANTS.items() if name in ARGUMENT_HEADS]


@pytest.mark.parametrize("variant", JSON_VARIANTS)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_enforced_calls_stream_their_arguments_in_fragments(tokenizer, ll_tokenizer, variant, seed):
    """Whatever the grammar lets a model write, cut anywhere: the names and arguments the
    stream tells are the calls parse() finds in the whole."""
    parser, grammar = grammar_of(tokenizer, variant, parallel=True)
    rng = random.Random(seed)
    for text in [*ACCEPTED[variant], walk(tokenizer, ll_tokenizer, grammar, seed)]:
        whole = [(c.name, json.loads(c.arguments)) for c in parser.parse(text).calls]
        assert whole, text
        every_char = list(range(1, len(text)))
        at_random = sorted(rng.sample(every_char, min(len(every_char), rng.randint(1, 8))))
        for cuts in (every_char, at_random, []):
            assert streamed_calls(parser, text, cuts) == whole, (text, cuts)


def test_pythonic_any_object_takes_any_keywords(tokenizer, ll_tokenizer):
    # No `properties`: any keyword arguments, any JSON values.
    parser, grammar = grammar_of(tokenizer, "pythonic", tools=[Tool("f")], parallel=False)
    for text in ("[f()]", '[f(a=1, b_2="x", c=[true, null])]'):
        assert takes(ll_tokenizer, tokenizer, grammar, text), text
        assert parser.parse(text).calls
    assert not takes(ll_tokenizer, tokenizer, grammar, "[f(1)]")


def test_pythonic_optional_properties_in_order(tokenizer, ll_tokenizer):
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "integer"},
            "c": {"type": "integer"},
        },
        "required": ["b"],
    }
    _, grammar = grammar_of(tokenizer, "pythonic", tools=[Tool("f", None, schema)], parallel=False)
    for text, ok in [
        ("[f(b=1)]", True),
        ("[f(a=1, b=2)]", True),
        ("[f(b=2, c=3)]", True),
        ("[f(a=1, b=2, c=3)]", True),
        ("[f()]", False),
        ("[f(a=1)]", False),
        ("[f(b=2, a=1)]", False),
        ("[f(, b=2)]", False),
    ]:
        assert takes(ll_tokenizer, tokenizer, grammar, text) is ok, text


def test_pythonic_refs_resolve_in_property_schemas(tokenizer, ll_tokenizer):
    schema = {
        "type": "object",
        "$defs": {"unit": {"enum": ["c", "f"]}},
        "properties": {"unit": {"$ref": "#/$defs/unit"}},
        "required": ["unit"],
    }
    _, grammar = grammar_of(tokenizer, "pythonic", tools=[Tool("f", None, schema)], parallel=False)
    assert takes(ll_tokenizer, tokenizer, grammar, '[f(unit="c")]')
    assert not takes(ll_tokenizer, tokenizer, grammar, '[f(unit="k")]')


def test_names_are_exact_literals(tokenizer, ll_tokenizer):
    odd = Tool('say "hi"\\', None, PING_SCHEMA)
    for variant in ("hermes", "llama3_json", "mistral"):
        parser, grammar = grammar_of(tokenizer, variant, tools=[odd], parallel=False)
        text = walk(tokenizer, ll_tokenizer, grammar, 0)
        assert [c.name for c in parser.parse(text).calls] == [odd.name]


def test_enforced_stream_follows_strings_and_nesting():
    """Braces, brackets and escaped quotes inside strings do not end the arguments."""
    tricky = '{"city": "a}\\"{[", "days": 1, "unit": "c", "note": "]]\\\\"}'
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {tricky}}}\n</tool_call>'
    parser = tool_parser("hermes")
    assert [c.name for c in parser.parse(text).calls] == ["get_weather"]
    for cuts in (list(range(1, len(text))), []):
        assert streamed_calls(parser, text, cuts) == [("get_weather", json.loads(tricky))]
