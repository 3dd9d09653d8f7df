"""The tiny tokenizers of launcher/chat_families.py render tools, tool calls, tool results and
reasoning in each family's own format, keep their markers as single tokens, and load back from
disk (transformers and the router's Tokenizer) with the same template."""

import asyncio
import json

import jinja2
import jinja2.meta
import pytest

from launcher.chat_families import FAMILIES, family_tokenizer, save_family

TOOL_FAMILIES = ["qwen", "llama3", "mistral", "llama4", "deepseek_r1", "qwen3_coder", "kimi_k2"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time in a time zone",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"type": "string"}},
                "required": ["tz"],
            },
        },
    },
]
CALL_ID = "call00001"  # 9 alphanumerics, as Mistral's ids are
RESULT = '{"temperature": 21}'


def history(arguments: str | dict = '{"city": "Paris"}') -> list[dict]:
    """system, user, an assistant tool call (arguments as OpenAI clients send them: a JSON
    string), its result, and the next user turn."""
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": CALL_ID,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": CALL_ID, "content": RESULT},
        {"role": "user", "content": "And the time in Tokyo?"},
    ]


def _fn(tool: dict) -> dict:
    return tool["function"]


# How each family lists a tool: what the prompt must contain for it (name and parameters).
TOOL_LISTING = {
    "qwen": lambda tool: json.dumps(tool),
    "llama3": lambda tool: json.dumps(tool, indent=4),
    "mistral": lambda tool: json.dumps({"type": "function", "function": _fn(tool)}),
    "llama4": lambda tool: json.dumps(_fn(tool), indent=4),
    "deepseek_r1": lambda tool: json.dumps(_fn(tool)),
    "qwen3_coder": lambda tool: json.dumps(tool),
    "kimi_k2": lambda tool: json.dumps(tool),
}

# The earlier call and its result, exactly as each family writes them.
HISTORY_PARTS = {
    "qwen": [
        "<|im_start|>system\nYou are terse.\n\n# Tools\n",
        "<tools>\n",
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>',
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n",
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n',
        f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n",
        "<|im_start|>user\nAnd the time in Tokyo?<|im_end|>\n",
    ],
    "llama3": [
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n",
        "You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n",
        '{"name": function name, "parameters": dictionary of argument name and its value}',
        "\n\nWeather in Paris?<|eot_id|>",
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": '
        '{"city": "Paris"}}<|eot_id|>',
        f"<|start_header_id|>ipython<|end_header_id|>\n\n{RESULT}<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\nAnd the time in Tokyo?<|eot_id|>",
    ],
    "mistral": [
        "<s>[INST] Weather in Paris?[/INST]",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, '
        f'"id": "{CALL_ID}"}}]</s>',
        f'[TOOL_RESULTS] {{"content": {RESULT}, "call_id": "{CALL_ID}"}}[/TOOL_RESULTS]',
        "[AVAILABLE_TOOLS] [{",
        "}][/AVAILABLE_TOOLS][INST] You are terse.\n\nAnd the time in Tokyo?[/INST]",
    ],
    "llama4": [
        "<|begin_of_text|><|header_start|>system<|header_end|>\n\nYou are terse.\n\n",
        "[func_name1(params_name1=params_value1, params_name2=params_value2...), "
        "func_name2(params)]",
        "<|header_start|>user<|header_end|>\n\nWeather in Paris?<|eot|>",
        '<|header_start|>assistant<|header_end|>\n\n[get_weather(city="Paris")]<|eot|>',
        f"<|header_start|>ipython<|header_end|>\n\n{RESULT}<|eot|>",
        "<|header_start|>user<|header_end|>\n\nAnd the time in Tokyo?<|eot|>",
    ],
    "deepseek_r1": [
        "<｜begin▁of▁sentence｜>You are terse.\n\n## Tools\n",
        "<｜User｜>Weather in Paris?<｜Assistant｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
        "<｜end▁of▁sentence｜>",
        f"<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{RESULT}<｜tool▁output▁end｜>"
        "<｜tool▁outputs▁end｜>",
        "<｜User｜>And the time in Tokyo?",
    ],
    "qwen3_coder": [
        "<|im_start|>system\n# Tools\n<tools>\n",
        "<|im_start|>assistant\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>\n",
        f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n",
        "<|im_start|>user\nAnd the time in Tokyo?<|im_end|>\n",
    ],
    "kimi_k2": [
        "<|im_system|>tool_declare<|im_middle|>[{",
        "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>",
        f"<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>"
        f'{CALL_ID}<|tool_call_argument_begin|>{{"city": "Paris"}}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>",
        f"<|im_system|>tool<|im_middle|>## Return of {CALL_ID}\n{RESULT}<|im_end|>",
    ],
}

GENERATION_PROMPT_END = {
    "qwen": "<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral": "[/INST]",  # no assistant header: the model answers right after [/INST]
    "llama4": "<|eot|><|header_start|>assistant<|header_end|>\n\n",
    "deepseek_r1": "<｜User｜>And the time in Tokyo?<｜Assistant｜><think>\n",
    "qwen3_coder": "<|im_end|>\n<|im_start|>assistant\n",
    "kimi_k2": "<|im_end|><|im_assistant|>assistant<|im_middle|>",
}


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    return {name: family_tokenizer(name) for name in FAMILIES}


def render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **kwargs
    )


def _arguments(name: str) -> str | dict:
    # pythonic calls need an object (test_pythonic_arguments_must_be_an_object)
    # and so does Qwen3-Coder's template, which writes each argument apart
    return {"city": "Paris"} if name in ("llama4", "qwen3_coder") else '{"city": "Paris"}'


@pytest.mark.parametrize("name", TOOL_FAMILIES)
def test_tools_and_tool_history_render_in_the_family_format(tokenizers, name):
    prompt = render(tokenizers[name], history(_arguments(name)), tools=TOOLS)
    for tool in TOOLS:
        assert TOOL_LISTING[name](tool) in prompt
    for part in HISTORY_PARTS[name]:
        assert part in prompt, part
    assert prompt.endswith(GENERATION_PROMPT_END[name])


@pytest.mark.parametrize("name", ["qwen", "llama3", "mistral", "deepseek_r1"])
def test_dict_arguments_render_as_the_json_string_does(tokenizers, name):
    as_string = render(tokenizers[name], history('{"city": "Paris"}'), tools=TOOLS)
    assert render(tokenizers[name], history({"city": "Paris"}), tools=TOOLS) == as_string


def test_qwen_generation_prompt_follows_enable_thinking(tokenizers):
    messages = [{"role": "user", "content": "hi"}]
    on = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render(tokenizers["qwen"], messages) == on
    assert render(tokenizers["qwen"], messages, enable_thinking=True) == on
    off = render(tokenizers["qwen"], messages, enable_thinking=False)
    assert off == on + "<think>\n\n</think>\n\n"


def test_qwen_drops_reasoning_of_answered_queries_only(tokenizers):
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nold thought\n</think>\n\nanswer1"},
        {"role": "user", "content": "q2"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "current thought",
            "tool_calls": [{"id": "x", "function": {"name": "get_time", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "x", "content": "noon"},
        {"role": "tool", "tool_call_id": "x", "content": "again"},
    ]
    prompt = render(tokenizers["qwen"], messages)
    assert "old thought" not in prompt
    assert "<|im_start|>assistant\nanswer1<|im_end|>" in prompt
    # the tool round of the query still being answered keeps its reasoning
    assert "<|im_start|>assistant\n<think>\ncurrent thought\n</think>\n\n<tool_call>\n" in prompt
    # consecutive results share one user turn
    assert (
        "<|im_start|>user\n<tool_response>\nnoon\n</tool_response>\n"
        "<tool_response>\nagain\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in prompt


def test_deepseek_r1_keeps_only_the_answer_of_history_turns(tokenizers):
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nold thought\n</think>\n\nanswer1"},
        {"role": "user", "content": "q2"},
    ]
    prompt = render(tokenizers["deepseek_r1"], messages)
    assert prompt == (
        "<｜begin▁of▁sentence｜><｜User｜>q1<｜Assistant｜>\n\nanswer1<｜end▁of▁sentence｜>"
        "<｜User｜>q2<｜Assistant｜><think>\n"
    )


def test_pythonic_arguments_render_as_python_literals(tokenizers):
    arguments = {"s": 'a"b', "t": True, "n": None, "xs": [1, 2.5], "d": {"k": False}}
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "tool_calls": [
                {"function": {"name": "f", "arguments": arguments}},
                {"function": {"name": "g", "arguments": {}}},
            ],
        },
    ]
    prompt = render(tokenizers["llama4"], messages)
    assert '[f(s="a\\"b", t=True, n=None, xs=[1, 2.5], d={"k": False}), g()]<|eot|>' in prompt


def test_pythonic_arguments_must_be_an_object(tokenizers):
    """A JSON string cannot become keyword arguments in Jinja: the server parses it first."""
    with pytest.raises(jinja2.TemplateError, match="parse them before rendering"):
        render(tokenizers["llama4"], history('{"city": "Paris"}'), tools=TOOLS)


def test_mistral_renders_any_tool_call_id(tokenizers):
    """Real Mistral templates raise unless ids are 9 alphanumerics; this one does not."""
    messages = history()
    messages[2]["tool_calls"][0]["id"] = "call_abc-123456789"
    messages[3]["tool_call_id"] = "call_abc-123456789"
    prompt = render(tokenizers["mistral"], messages, tools=TOOLS)
    assert '"id": "call_abc-123456789"}]</s>' in prompt
    assert '"call_id": "call_abc-123456789"}[/TOOL_RESULTS]' in prompt


def test_mistral_plain_text_result_is_a_json_string(tokenizers):
    messages = history()
    messages[3]["content"] = "sunny"
    prompt = render(tokenizers["mistral"], messages)
    assert f'[TOOL_RESULTS] {{"content": "sunny", "call_id": "{CALL_ID}"}}' in prompt


def test_plain_template_cannot_render_tools(tokenizers):
    template = FAMILIES["plain"].template
    assert "tools" not in jinja2.meta.find_undeclared_variables(
        jinja2.Environment().parse(template)
    )
    prompt = render(tokenizers["plain"], [{"role": "user", "content": "hi"}], tools=TOOLS)
    assert prompt == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    assert FAMILIES["plain"].tool_parser is None


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_markers_are_single_tokens(tokenizers, name):
    tokenizer, family = tokenizers[name], FAMILIES[name]
    for token in family.special_tokens + family.added_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        assert token == tokenizer.unk_token or token_id != tokenizer.unk_token_id, token
        assert tokenizer.encode(token, add_special_tokens=False) == [token_id]
        # special markers drop out of the text a client sees, added ones (<think>) stay in it
        kept = tokenizer.decode([token_id], skip_special_tokens=True)
        assert kept == ("" if token in family.special_tokens else token)
    assert tokenizer.eos_token == family.eos_token
    assert tokenizer.bos_token == family.bos_token


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_saved_family_loads_back_with_its_template(tokenizers, tmp_path, name):
    from transformers import AutoTokenizer

    from router.tokenizer import Tokenizer

    save_family(name, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    tools = TOOLS if name != "plain" else None
    messages = history(_arguments(name)) if name != "plain" else [{"role": "user", "content": "hi"}]
    expected = render(tokenizers[name], messages, tools=tools)
    assert render(loaded, messages, tools=tools) == expected
    assert loaded.encode(expected, add_special_tokens=False) == tokenizers[name].encode(
        expected, add_special_tokens=False
    )
    assert (loaded.eos_token, loaded.bos_token) == (
        FAMILIES[name].eos_token,
        FAMILIES[name].bos_token,
    )

    router_tokenizer = Tokenizer.from_dir(tmp_path)
    try:
        rendered = router_tokenizer.apply_chat_template(messages, tools=tools)
        assert asyncio.run(rendered) == expected
    finally:
        router_tokenizer.close()


def test_build_model_takes_a_family_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from launcher.tiny_models import build_model

    path = build_model(
        tmp_path,
        chat_family="llama3",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
    )
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    # the embedding covers the markers added after the trained vocabulary
    assert config["vocab_size"] >= len(tokenizer) > 512
    assert config["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|eot_id|>")
    assert config["bos_token_id"] == tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.convert_tokens_to_ids(
        ["<|eot_id|>", "<|eom_id|>"]
    )
    assert tokenizer.chat_template == FAMILIES["llama3"].template
