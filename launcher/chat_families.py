"""Tiny tokenizers whose chat templates render tools and reasoning as each model family does.

There is no model hub here, so the tests of tool calling (`tools`, assistant `tool_calls`,
`tool` messages) and reasoning (`<think>`) need local tokenizers whose Jinja chat templates
produce the prompt formats real checkpoints use: Hermes-style `<tool_call>` blocks (Qwen2.5 and
Qwen3, with Qwen3's thinking switch), Llama 3.1's JSON calls, Mistral's v3 `[TOOL_CALLS]`,
Llama 4 / 3.2's pythonic `[f(x=1)]` calls, DeepSeek-R1's opened `<think>` block and gpt-oss's
harmony messages (channels, recipients, `<|call|>`). The templates are written here from the
formats' public descriptions; they are compact, not the vendors' files, but they put the same
markers in the same places, so a parser that reads a real model's output reads theirs. Each
family's markers are single tokens, as in the real vocabularies.

`family_tokenizer(name)` builds one on top of `tiny_models.build_tokenizer`; `save_family` writes
it where `AutoTokenizer.from_pretrained` (and so the router) loads it back with its template;
`tiny_models.build_model(..., chat_family=name)` builds a whole checkpoint with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher.tiny_models import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tokenizer

# Tool-call arguments arrive from OpenAI clients as a JSON string and from Python callers as a
# dict: a string is already the JSON the model would have written, a dict is serialized.
_ARGS_JSON = (
    "{%- macro args_json(args) -%}"
    "{%- if args is string -%}{{- args -}}{%- else -%}{{- (args or {}) | tojson -}}{%- endif -%}"
    "{%- endmacro -%}\n"
)

# Qwen2.5 / Qwen3 (Hermes tool format). Reasoning of assistant turns before the last real user
# query is dropped; turns after it (a tool-calling round in progress) keep theirs, as Qwen3's
# template does, since the model is still reasoning about that query.
QWEN_TEMPLATE = (
    _ARGS_JSON
    + r"""{%- set has_system = messages and messages[0].role == 'system' -%}
{%- set system = messages[0].content if has_system else none -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if system -%}{{- system + '\n\n' -}}{%- endif -%}
  {{- '# Tools\n\nYou may call one or more of these functions to help with the user query. '
      + 'Their signatures are inside <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + tool | tojson -}}{%- endfor -%}
  {{- '\n</tools>\n\nTo call a function, return a JSON object with its name and arguments '
      + 'inside <tool_call></tool_call> XML tags:\n<tool_call>\n'
      + '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system is not none -%}
  {{- '<|im_start|>system\n' + system + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_query=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' and not (m.content is string and m.content.startswith('<tool_response>')
        and m.content.endswith('</tool_response>')) -%}
    {%- set ns.last_query = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
    {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' -%}
    {%- if '</think>' in content -%}
      {%- if not reasoning -%}
        {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
      {%- endif -%}
      {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
      {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' -}}
    {%- endif -%}
    {{- content -}}
    {%- for call in message.tool_calls or [] -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
      {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' + args_json(fn.arguments)
          + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\n\n</think>\n\n' -}}
  {%- endif -%}
{%- endif -%}"""
)

# Llama 3.1 (JSON tool calling): "Environment: ipython" in the system turn, the tools and the
# answer format in the first user turn, results in `ipython` turns. Several calls in one turn
# (which the real template refuses) are joined with "; ", as Llama 3 parsers accept.
LLAMA3_TEMPLATE = (
    _ARGS_JSON
    + r"""{{- bos_token -}}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- set system = messages[0].content if has_system else '' -%}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{%- if tools -%}{{- 'Environment: ipython\n' -}}{%- endif -%}
{{- 'Cutting Knowledge Date: December 2023\nToday Date: '
    + (date_string if date_string is defined else '26 Jul 2024') + '\n\n'
    + system + '<|eot_id|>' -}}
{%- set ns = namespace(tools_pending=(tools or []) | length > 0) -%}
{%- for message in (messages[1:] if has_system else messages) -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if message.role == 'user' and ns.tools_pending -%}
    {%- set ns.tools_pending = false -%}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n'
        + 'Answer with a JSON function call, with its arguments, if one of the following '
        + 'functions helps with the prompt.\n\nRespond in the format {"name": function name, '
        + '"parameters": dictionary of argument name and its value}. Do not use variables.\n\n' -}}
    {%- for tool in tools -%}{{- (tool | tojson(indent=4)) + '\n\n' -}}{%- endfor -%}
    {{- content | trim + '<|eot_id|>' -}}
  {%- elif message.role == 'assistant' and message.tool_calls -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
    {%- for call in message.tool_calls -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if not loop.first -%}{{- '; ' -}}{%- endif -%}
      {{- '{"name": "' + fn.name + '", "parameters": ' + args_json(fn.arguments) + '}' -}}
    {%- endfor -%}
    {{- '<|eot_id|>' -}}
  {%- elif message.role in ('tool', 'ipython') -%}
    {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' -}}
    {%- if message.content is mapping or (message.content is iterable
          and message.content is not string) -%}
      {{- message.content | tojson -}}
    {%- else -%}
      {{- content -}}
    {%- endif -%}
    {{- '<|eot_id|>' -}}
  {%- else -%}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + content | trim
        + '<|eot_id|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}"""
)

# Mistral v3 (Mistral-7B-Instruct-v0.3's tokenizer): the tools before the last user turn, which
# also carries the system prompt. Real templates raise unless every tool call id is 9
# alphanumerics; this one renders whatever id it gets, so a server that must make such ids is
# tested by its own assertions, not by a template error. A tool result that looks like JSON goes
# in as JSON, anything else as a JSON string, as mistral_common encodes results.
MISTRAL_TEMPLATE = (
    _ARGS_JSON
    + r"""{{- bos_token -}}
{%- set system = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- set msgs = messages[1:] if system is not none else messages -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in msgs -%}
  {%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for message in msgs -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if message.role == 'user' -%}
    {%- if tools and loop.index0 == ns.last_user -%}
      {{- '[AVAILABLE_TOOLS] [' -}}
      {%- for tool in tools -%}
        {%- set fn = tool.function if tool.function is defined else tool -%}
        {{- '{"type": "function", "function": ' + fn | tojson + '}'
            + (', ' if not loop.last else '') -}}
      {%- endfor -%}
      {{- '][/AVAILABLE_TOOLS]' -}}
    {%- endif -%}
    {%- if system is not none and loop.index0 == ns.last_user -%}
      {%- set content = system + '\n\n' + content -%}
    {%- endif -%}
    {{- '[INST] ' + content + '[/INST]' -}}
  {%- elif message.role == 'assistant' and message.tool_calls -%}
    {{- '[TOOL_CALLS] [' -}}
    {%- for call in message.tool_calls -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {{- '{"name": "' + fn.name + '", "arguments": ' + args_json(fn.arguments) + ', "id": "'
          + (call.id or '') + '"}' + (', ' if not loop.last else '') -}}
    {%- endfor -%}
    {{- ']' + eos_token -}}
  {%- elif message.role == 'assistant' -%}
    {{- ' ' + content | trim + eos_token -}}
  {%- elif message.role == 'tool' -%}
    {%- set result = content | trim -%}
    {{- '[TOOL_RESULTS] {"content": '
        + (result if result[:1] in ('{', '[') else result | tojson)
        + ', "call_id": "' + (message.tool_call_id or '') + '"}[/TOOL_RESULTS]' -}}
  {%- endif -%}
{%- endfor -%}"""
)

# Llama 4 / Llama 3.2 pythonic tool calling: the functions as JSON in the system turn, calls as a
# Python list of calls. Arguments must be objects here (a JSON string cannot become keyword
# arguments in Jinja): a server has to parse OpenAI's string arguments before rendering, as vLLM
# does, and the template says so rather than render a call the model could never have written.
LLAMA4_TEMPLATE = r"""{%- macro py(v) -%}
  {%- if v is string -%}{{- v | tojson -}}
  {%- elif v is boolean -%}{{- 'True' if v else 'False' -}}
  {%- elif v is none -%}{{- 'None' -}}
  {%- elif v is mapping -%}
    {{- '{' -}}
    {%- for k, x in v.items() -%}
      {{- (k | tojson) + ': ' + py(x) + (', ' if not loop.last else '') -}}
    {%- endfor -%}
    {{- '}' -}}
  {%- elif v is iterable -%}
    {{- '[' -}}
    {%- for x in v -%}{{- py(x) + (', ' if not loop.last else '') -}}{%- endfor -%}
    {{- ']' -}}
  {%- else -%}{{- v | string -}}
  {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set system = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- if tools or system is not none -%}
  {{- '<|header_start|>system<|header_end|>\n\n' -}}
  {%- if system -%}{{- system + ('\n\n' if tools else '') -}}{%- endif -%}
  {%- if tools -%}
    {{- 'You may call functions to answer the question. To call any, answer with only a list '
        + 'of calls in the format [func_name1(params_name1=params_value1, '
        + 'params_name2=params_value2...), func_name2(params)] and no other text.\n\n'
        + 'Here is a list of functions in JSON format that you can invoke.\n\n' -}}
    {%- for tool in tools -%}
      {%- set fn = tool.function if tool.function is defined else tool -%}
      {{- (fn | tojson(indent=4)) + '\n\n' -}}
    {%- endfor -%}
  {%- endif -%}
  {{- '<|eot|>' -}}
{%- endif -%}
{%- for message in (messages[1:] if system is not none else messages) -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if message.role == 'assistant' and message.tool_calls -%}
    {{- '<|header_start|>assistant<|header_end|>\n\n' + content | trim + '[' -}}
    {%- for call in message.tool_calls -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if fn.arguments is string -%}
        {{- raise_exception('pythonic tool calls need their arguments as an object, not a JSON '
                            + 'string: parse them before rendering') -}}
      {%- endif -%}
      {{- fn.name + '(' -}}
      {%- for k, v in (fn.arguments or {}).items() -%}
        {{- k + '=' + py(v) + (', ' if not loop.last else '') -}}
      {%- endfor -%}
      {{- ')' + (', ' if not loop.last else '') -}}
    {%- endfor -%}
    {{- ']<|eot|>' -}}
  {%- elif message.role in ('tool', 'ipython') -%}
    {{- '<|header_start|>ipython<|header_end|>\n\n' -}}
    {%- if message.content is mapping or (message.content is iterable
          and message.content is not string) -%}
      {{- message.content | tojson -}}
    {%- else -%}
      {{- content -}}
    {%- endif -%}
    {{- '<|eot|>' -}}
  {%- else -%}
    {{- '<|header_start|>' + message.role + '<|header_end|>\n\n' + content | trim + '<|eot|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|header_start|>assistant<|header_end|>\n\n' -}}
{%- endif -%}"""

# DeepSeek-R1: no role headers, the generation prompt opens the think block itself (so the
# model's output starts inside its reasoning and holds only `</think>`), and history turns keep
# only what follows `</think>`. R1 has no tool list of its own: a simple JSON list in the system
# prompt. Earlier calls and results use DeepSeek's tool-call markers so a history renders.
DEEPSEEK_R1_TEMPLATE = (
    _ARGS_JSON
    + r"""{{- bos_token -}}
{%- set system = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- if system -%}{{- system -}}{%- endif -%}
{%- if tools -%}
  {{- ('\n\n' if system else '') + '## Tools\n\nYou can call these functions:\n' -}}
  {%- for tool in tools -%}
    {%- set fn = tool.function if tool.function is defined else tool -%}
    {{- '\n' + fn | tojson -}}
  {%- endfor -%}
  {{- '\n' -}}
{%- endif -%}
{%- set ns = namespace(in_outputs=false) -%}
{%- for message in (messages[1:] if system is not none else messages) -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if message.role != 'tool' and ns.in_outputs -%}
    {{- '<｜tool▁outputs▁end｜>' -}}
    {%- set ns.in_outputs = false -%}
  {%- endif -%}
  {%- if message.role == 'user' -%}
    {{- '<｜User｜>' + content -}}
  {%- elif message.role == 'assistant' -%}
    {{- '<｜Assistant｜>' + content.split('</think>')[-1] -}}
    {%- if message.tool_calls -%}
      {{- '<｜tool▁calls▁begin｜>' -}}
      {%- for call in message.tool_calls -%}
        {%- set fn = call.function if call.function is defined else call -%}
        {{- ('\n' if not loop.first else '') + '<｜tool▁call▁begin｜>' + (call.type or 'function')
            + '<｜tool▁sep｜>' + fn.name + '\n```json\n' + args_json(fn.arguments)
            + '\n```<｜tool▁call▁end｜>' -}}
      {%- endfor -%}
      {{- '<｜tool▁calls▁end｜>' -}}
    {%- endif -%}
    {{- '<｜end▁of▁sentence｜>' -}}
  {%- elif message.role == 'tool' -%}
    {{- ('\n' if ns.in_outputs else '<｜tool▁outputs▁begin｜>')
        + '<｜tool▁output▁begin｜>' + content + '<｜tool▁output▁end｜>' -}}
    {%- set ns.in_outputs = true -%}
  {%- endif -%}
{%- endfor -%}
{%- if ns.in_outputs -%}{{- '<｜tool▁outputs▁end｜>' -}}{%- endif -%}
{%- if add_generation_prompt -%}{{- '<｜Assistant｜><think>\n' -}}{%- endif -%}"""
)


# gpt-oss (OpenAI's harmony format): every turn `<|start|>ROLE<|message|>...<|end|>`; the system
# turn names the channels, the developer turn carries the instructions (the request's system
# message) and the tools (each as `type NAME = (_: PARAMETERS) => any;` in a `functions`
# namespace: the schema as JSON, where the real template writes TypeScript). Past assistant turns:
# calls `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>`
# (their reasoning as an analysis message before them), text before calls as a commentary
# preamble, answers as final messages (their reasoning dropped, as the real template does);
# results `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>...<|end|>`, NAME
# found through the call's id. The answer's header follows the prompt's `<|start|>assistant`.
GPT_OSS_TEMPLATE = (
    _ARGS_JSON
    + r"""{%- set has_system = messages and messages[0].role in ('system', 'developer') -%}
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n'
    + 'Knowledge cutoff: 2024-06\n\nReasoning: '
    + (reasoning_effort if reasoning_effort is defined else 'medium')
    + '\n\n# Valid channels: analysis, commentary, final. Channel must be included for every '
    + 'message.' -}}
{%- if tools -%}
  {{- "\nCalls to these tools must go to the commentary channel: 'functions'." -}}
{%- endif -%}
{{- '<|end|>' -}}
{%- if has_system or tools -%}
  {{- '<|start|>developer<|message|>' -}}
  {%- if has_system -%}
    {{- '# Instructions\n\n' + messages[0].content + ('\n\n' if tools else '') -}}
  {%- endif -%}
  {%- if tools -%}
    {{- '# Tools\n\n## functions\n\nnamespace functions {\n' -}}
    {%- for tool in tools -%}
      {%- set fn = tool.function if tool.function is defined else tool -%}
      {{- '\n' + ('// ' + fn.description + '\n' if fn.description else '') + 'type ' + fn.name
          + ' = (_: ' + (fn.parameters or {}) | tojson + ') => any;\n' -}}
    {%- endfor -%}
    {{- '\n} // namespace functions' -}}
  {%- endif -%}
  {{- '<|end|>' -}}
{%- endif -%}
{%- set ns = namespace(calls=[], name='tool') -%}
{%- for message in (messages[1:] if has_system else messages) -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if message.role == 'assistant' and message.tool_calls -%}
    {%- if message.reasoning_content is string and message.reasoning_content -%}
      {{- '<|start|>assistant<|channel|>analysis<|message|>' + message.reasoning_content
          + '<|end|>' -}}
    {%- endif -%}
    {%- if content -%}
      {{- '<|start|>assistant<|channel|>commentary<|message|>' + content + '<|end|>' -}}
    {%- endif -%}
    {%- for call in message.tool_calls -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {{- '<|start|>assistant to=functions.' + fn.name + '<|channel|>commentary json<|message|>'
          + args_json(fn.arguments) + '<|call|>' -}}
    {%- endfor -%}
    {%- set ns.calls = message.tool_calls -%}
  {%- elif message.role == 'assistant' -%}
    {{- '<|start|>assistant<|channel|>final<|message|>' + content + '<|end|>' -}}
  {%- elif message.role == 'tool' -%}
    {%- set ns.name = message.name if message.name is defined and message.name else 'tool' -%}
    {%- for call in ns.calls -%}
      {%- if call.id is defined and call.id == message.tool_call_id -%}
        {%- set ns.name = (call.function if call.function is defined else call).name -%}
      {%- endif -%}
    {%- endfor -%}
    {{- '<|start|>functions.' + ns.name + ' to=assistant<|channel|>commentary<|message|>'
        + content + '<|end|>' -}}
  {%- else -%}
    {{- '<|start|>' + message.role + '<|message|>' + content + '<|end|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"""
)


@dataclass(frozen=True)
class Family:
    """One chat format: its template, the markers it needs as single tokens and the names of the
    server's parsers for its model output (None: the family has no such output)."""

    name: str
    template: str
    # Special tokens (skipped by decode(skip_special_tokens=True)), bos and eos among them.
    special_tokens: tuple[str, ...]
    # Tokens that are single ids but stay in decoded text, as Qwen's `<tool_call>` and `<think>`.
    added_tokens: tuple[str, ...]
    eos_token: str
    bos_token: str | None
    tool_parser: str | None
    reasoning_parser: str | None
    # Further tokens that end a turn (generation_config's eos list), e.g. Llama 3's <|eom_id|>.
    extra_eos_tokens: tuple[str, ...] = ()


# Qwen3-Coder / Qwen3.5: Qwen's turns, calls as XML with each value on lines of its own (a
# mapping or list as JSON, anything else as Python's `str`, as Qwen3-Coder's template does).
QWEN3_CODER_TEMPLATE = r"""{%- if tools -%}
  {{- '<|im_start|>system\n# Tools\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + tool | tojson -}}{%- endfor -%}
  {{- '\n</tools>\nCall a function as <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n'
      + '</parameter>\n</function>\n</tool_call><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if message.role == 'assistant' -%}
    {{- '<|im_start|>assistant\n' + content -}}
    {%- for call in message.tool_calls or [] -%}
      {{- '\n<tool_call>\n<function=' + call.function.name + '>\n' -}}
      {%- for key, value in (call.function.arguments or {}).items() -%}
        {%- if value is mapping or (value is sequence and value is not string) -%}
          {%- set value = value | tojson -%}
        {%- endif -%}
        {{- '<parameter=' + key + '>\n' + value | string + '\n</parameter>\n' -}}
      {%- endfor -%}
      {{- '</function>\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>user\n<tool_response>\n' + content + '\n</tool_response><|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"""

# Kimi K2: each call written back under its id (`functions.<name>:<index>`), each result under
# its `tool_call_id`; the section and call markers are special tokens.
KIMI_TOOL_MARKERS = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
KIMI_K2_TEMPLATE = (
    _ARGS_JSON
    + r"""{%- if tools -%}
  {{- '<|im_system|>tool_declare<|im_middle|>' + tools | tojson + '<|im_end|>' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- set content = message.content if message.content is string else '' -%}
  {%- if message.role == 'assistant' -%}
    {{- '<|im_assistant|>assistant<|im_middle|>' + content -}}
    {%- if message.tool_calls -%}
      {{- '<|tool_calls_section_begin|>' -}}
      {%- for call in message.tool_calls -%}
        {{- '<|tool_call_begin|>' + call.id + '<|tool_call_argument_begin|>'
            + args_json(call.function.arguments) + '<|tool_call_end|>' -}}
      {%- endfor -%}
      {{- '<|tool_calls_section_end|>' -}}
    {%- endif -%}
    {{- '<|im_end|>' -}}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_system|>tool<|im_middle|>## Return of ' + message.tool_call_id + '\n' + content
        + '<|im_end|>' -}}
  {%- else -%}
    {{- '<|im_' + message.role + '|>' + message.role + '<|im_middle|>' + content + '<|im_end|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}{%- endif -%}"""
)

_DEEPSEEK_TOOL_MARKERS = tuple(
    f"<｜tool▁{kind}▁{edge}｜>"
    for kind in ("calls", "call", "outputs", "output")
    for edge in ("begin", "end")
) + ("<｜tool▁sep｜>",)

# gpt-oss's harmony markup: special tokens, so the answer's text leaves them out.
HARMONY_MARKERS = (
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
)

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            name="qwen",
            template=QWEN_TEMPLATE,
            special_tokens=("<|im_start|>", "<|im_end|>"),
            added_tokens=(
                "<tool_call>",
                "</tool_call>",
                "<tool_response>",
                "</tool_response>",
                "<think>",
                "</think>",
            ),
            eos_token="<|im_end|>",
            bos_token=None,
            tool_parser="hermes",
            reasoning_parser="qwen3",
        ),
        Family(
            name="llama3",
            template=LLAMA3_TEMPLATE,
            special_tokens=(
                "<|begin_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|eom_id|>",
                "<|python_tag|>",
            ),
            added_tokens=(),
            eos_token="<|eot_id|>",
            bos_token="<|begin_of_text|>",
            tool_parser="llama3_json",
            reasoning_parser=None,
            extra_eos_tokens=("<|eom_id|>",),
        ),
        Family(
            name="mistral",
            template=MISTRAL_TEMPLATE,
            special_tokens=(
                "<s>",
                "</s>",
                "[INST]",
                "[/INST]",
                "[TOOL_CALLS]",
                "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]",
                "[TOOL_RESULTS]",
                "[/TOOL_RESULTS]",
            ),
            added_tokens=(),
            eos_token="</s>",
            bos_token="<s>",
            tool_parser="mistral",
            reasoning_parser=None,
        ),
        Family(
            name="llama4",
            template=LLAMA4_TEMPLATE,
            special_tokens=(
                "<|begin_of_text|>",
                "<|header_start|>",
                "<|header_end|>",
                "<|eot|>",
                "<|python_start|>",
                "<|python_end|>",
            ),
            added_tokens=(),
            eos_token="<|eot|>",
            bos_token="<|begin_of_text|>",
            tool_parser="pythonic",
            reasoning_parser=None,
        ),
        Family(
            name="deepseek_r1",
            template=DEEPSEEK_R1_TEMPLATE,
            special_tokens=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
            # Not special in DeepSeek's vocabulary either: only bos and eos are.
            added_tokens=("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>")
            + _DEEPSEEK_TOOL_MARKERS,
            eos_token="<｜end▁of▁sentence｜>",
            bos_token="<｜begin▁of▁sentence｜>",
            tool_parser=None,
            reasoning_parser="deepseek_r1",
        ),
        Family(
            name="gpt_oss",
            template=GPT_OSS_TEMPLATE,
            special_tokens=HARMONY_MARKERS,
            added_tokens=(),
            eos_token="<|return|>",
            bos_token=None,
            tool_parser="openai",
            reasoning_parser="openai_gptoss",
            extra_eos_tokens=("<|call|>",),  # a call ends the turn too: the caller answers it
        ),
        Family(
            name="qwen3_coder",
            template=QWEN3_CODER_TEMPLATE,
            special_tokens=("<|im_start|>", "<|im_end|>"),
            added_tokens=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
            eos_token="<|im_end|>",
            bos_token=None,
            tool_parser="qwen3_coder",
            reasoning_parser=None,
        ),
        Family(
            name="kimi_k2",
            template=KIMI_K2_TEMPLATE,
            special_tokens=(
                "<|im_system|>",
                "<|im_user|>",
                "<|im_assistant|>",
                "<|im_middle|>",
                "<|im_end|>",
                *KIMI_TOOL_MARKERS,
            ),  # fmt: skip
            added_tokens=(),
            eos_token="<|im_end|>",
            bos_token=None,
            tool_parser="kimi_k2",
            reasoning_parser=None,
        ),
        # The default tiny template: it ignores `tools` and cannot render tool calls, for the
        # tests of a template that cannot do tools.
        Family(
            name="plain",
            template=CHAT_TEMPLATE,
            special_tokens=tuple(SPECIAL_TOKENS),
            added_tokens=(),
            eos_token="</s>",
            bos_token="<s>",
            tool_parser=None,
            reasoning_parser=None,
        ),
    )
}


def family_tokenizer(name: str, vocab_size: int = 512):
    """A fast tokenizer for family `name`: `build_tokenizer(vocab_size)`'s BPE plus the family's
    markers as added tokens (after the trained vocabulary, so `len(tokenizer)` may exceed
    `vocab_size`), its chat template, bos and eos."""
    from tokenizers import AddedToken

    if name not in FAMILIES:
        raise ValueError(f"unknown chat family {name!r}; one of {sorted(FAMILIES)}")
    family = FAMILIES[name]
    tokenizer = build_tokenizer(vocab_size)
    if name == "plain":
        return tokenizer
    new_special = [t for t in family.special_tokens if t not in SPECIAL_TOKENS]
    # The list replaces the tokenizer's extra special tokens, so the base's `<|end|>` stays in it.
    extra_special = [t for t in SPECIAL_TOKENS if t not in ("<unk>", "<s>", "</s>")]
    tokenizer.add_special_tokens({"additional_special_tokens": extra_special + new_special})
    # normalized=False: the marker matches the raw text, not a normalized form of it.
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in family.added_tokens]
    )
    tokenizer.eos_token = family.eos_token
    tokenizer.bos_token = family.bos_token
    tokenizer.chat_template = family.template
    for token in (*family.special_tokens, *family.added_tokens):
        ids = tokenizer.encode(token, add_special_tokens=False)
        if ids != [tokenizer.convert_tokens_to_ids(token)]:
            raise AssertionError(f"{name}: {token!r} encodes as {ids}, not one token")
    return tokenizer


def family_eos_ids(name: str, tokenizer) -> int | list[int]:
    """generation_config's eos_token_id for a family's tokenizer: one id, or a list where the
    family has further tokens that end a turn."""
    family = FAMILIES[name]
    if not family.extra_eos_tokens:
        return tokenizer.convert_tokens_to_ids(family.eos_token)
    return tokenizer.convert_tokens_to_ids([family.eos_token, *family.extra_eos_tokens])


def save_family(name: str, path: str | Path, vocab_size: int = 512) -> Path:
    """Writes family `name`'s tokenizer, chat template included, to the directory `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    family_tokenizer(name, vocab_size).save_pretrained(path)
    return path
