"""POST /v1/chat/completions: OpenAI's chat API over the tokenizer's own chat template."""

from __future__ import annotations

import time
from typing import Any

import jinja2
from aiohttp import web

from router.entry import Entry, Finished, Token, TokenEvent
from router.errors import RouterError, ValidationError
from router.handlers.common import (
    infer_of,
    read_json,
    submit,
    timing_headers,
    wait_finished,
)
from router.handlers.openai_common import (
    FINGERPRINT,
    FINISH_REASON,
    SHARED_FIELDS,
    StopTrimmer,
    check_fields,
    logprob,
    max_tokens_param,
    model_name,
    new_id,
    parse_shared,
    reject_unless,
    response_body,
    trim_stop,
    usage,
    validate,
    visible,
)
from router.handlers.sse import serve_sse
from router.infer import Infer
from router.validation import Fields

CHAT_FIELDS = SHARED_FIELDS | {
    "messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
    "tool_choice", "functions", "function_call", "modalities", "chat_template_kwargs",
}  # fmt: skip

# OpenAI's roles; any other is refused as OpenAI does, not handed to a template that might drop
# the message or render the unknown name as text.
ROLES = ("system", "developer", "user", "assistant", "tool", "function")

# apply_chat_template's own parameters and what the server decides itself: a request cannot
# set them through chat_template_kwargs.
RESERVED_TEMPLATE_VARIABLES = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "processor_kwargs",
})  # fmt: skip


def template_variables(payload: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `chat_template_kwargs`: extra variables for the chat template, such as Qwen3's
    `enable_thinking`."""
    variables = payload.get("chat_template_kwargs")
    if variables is None:
        return {}
    if not isinstance(variables, dict):
        raise ValidationError("`chat_template_kwargs` must be a JSON object")
    reserved = sorted(RESERVED_TEMPLATE_VARIABLES.intersection(variables))
    if reserved:
        raise ValidationError(
            f"`chat_template_kwargs` may not set {', '.join(f'`{k}`' for k in reserved)}"
        )
    return variables


def _content(index: int, content: Any) -> str:
    if content is None:  # an assistant turn that only called tools
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValidationError(
                    f"`messages[{index}].content`: only text parts are supported. Given: {kind}"
                )
            if not isinstance(part.get("text"), str):
                raise ValidationError(f"`messages[{index}].content`: a text part needs `text`")
            texts.append(part["text"])
        return "".join(texts)
    raise ValidationError(f"`messages[{index}].content` must be a string or a list of parts")


def parse_messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    raw = payload.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ValidationError("`messages` must be a non-empty list")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict):
            raise ValidationError(f"`messages[{i}]` must be a JSON object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ValidationError(f"`messages[{i}].role` must be a non-empty string")
        if role not in ROLES:
            raise ValidationError(
                f"`messages[{i}].role` must be one of {', '.join(ROLES)}. Given: {role!r}"
            )
        reject_unless(message, "tool_calls", not message.get("tool_calls"))
        messages.append({"role": role, "content": _content(i, message.get("content"))})
    return messages


def _reject_tools(payload: dict[str, Any]) -> None:
    reject_unless(payload, "tools", not payload.get("tools"))
    reject_unless(payload, "functions", not payload.get("functions"))
    reject_unless(payload, "tool_choice", payload.get("tool_choice") in ("none", "auto"))
    reject_unless(payload, "function_call", payload.get("function_call") in ("none", "auto"))
    fmt = payload.get("response_format")
    reject_unless(payload, "response_format", isinstance(fmt, dict) and fmt.get("type") == "text")
    reject_unless(payload, "modalities", payload.get("modalities") == ["text"])


def _logprobs_param(payload: dict[str, Any], params: dict[str, Any]) -> bool:
    f = Fields(payload)
    wanted = f.boolean("logprobs", False)
    top = f.integer("top_logprobs")
    if top is not None and not wanted:
        raise ValidationError("`top_logprobs` requires `logprobs` to be true")
    if top:
        params["top_n_tokens"] = top
    return wanted


def token_logprob(infer: Infer, token: Token, top: tuple[Token, ...]) -> dict[str, Any]:
    def one(t: Token, text: str) -> dict[str, Any]:
        return {"token": text, "logprob": logprob(t.logprob), "bytes": list(text.encode())}

    chosen = one(token, infer.tokenizer.piece(token.id))
    return {**chosen, "top_logprobs": [one(t, t.text) for t in top]}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    received = time.monotonic()
    infer = infer_of(request)
    payload = await read_json(request)
    check_fields(payload, CHAT_FIELDS)
    shared = parse_shared(payload, infer.adapters)
    _reject_tools(payload)
    max_name = max_tokens_param(payload, ("max_completion_tokens", "max_tokens"), shared.generate)
    logprobs = _logprobs_param(payload, shared.generate)
    messages = parse_messages(payload)
    variables = template_variables(payload)
    if not infer.tokenizer.has_chat_template:
        raise ValidationError("the model's tokenizer has no chat template; use /v1/completions")
    try:
        prompt = await infer.tokenizer.apply_chat_template(messages, variables)
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as err:
        raise ValidationError(f"`messages` rejected by the model's chat template: {err}") from None
    renames = {"inputs": "messages", "max_new_tokens": max_name, "top_n_tokens": "top_logprobs"}
    # The template writes the special tokens it wants (BOS...): none are added on top (as TGI).
    valid = await validate(infer, prompt, shared, renames, add_special_tokens=False)
    with infer.permit():
        entry = submit(request, valid, received)
        if shared.stream:
            stream = ChatStream(infer, entry, logprobs, shared.include_usage)
            headers = {"x-compute-type": infer.model.device_type or "unknown"}
            return await serve_sse(request, entry, headers, stream)
        try:
            finished = await wait_finished(entry)
        finally:
            if not entry.done:
                entry.cancel()
    content = trim_stop(finished.generated_text, valid.stop)
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "logprobs": None,
        "finish_reason": FINISH_REASON[finished.finish_reason],
    }
    if logprobs:
        steps = zip(entry.tokens, entry.top_tokens, strict=True)
        choice["logprobs"] = {"content": [token_logprob(infer, t, top) for t, top in steps]}
    body = response_body(
        infer, entry, object_type="chat.completion", id_prefix="chatcmpl", choice=choice
    )
    return web.json_response(body, headers=timing_headers(infer, entry, finished))


class ChatStream:
    """`chat.completion.chunk` events: the role first, then content, then finish_reason."""

    prefix = b"data: "

    def __init__(self, infer: Infer, entry: Entry, logprobs: bool, include_usage: bool) -> None:
        self.infer, self.entry = infer, entry
        self.logprobs, self.include_usage = logprobs, include_usage
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self.trimmer = StopTrimmer(entry.request.stop)
        self.started = False
        self.finished: Finished | None = None

    def chunk(self, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": model_name(self.infer, self.entry),
            "system_fingerprint": FINGERPRINT,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            ],
        }
        if self.include_usage:
            out["usage"] = None  # only the last chunk carries it
        return out

    def on_token(self, event: TokenEvent) -> list[Any]:
        out = []
        if not self.started:
            self.started = True
            out.append(self.chunk({"role": "assistant", "content": ""}))
        text = self.trimmer.push(visible(event.token))
        if event.end is not None:
            self.finished = event.end
            text += self.trimmer.flush()
        lp = None
        if self.logprobs:
            lp = {"content": [token_logprob(self.infer, event.token, event.top_tokens)]}
        if text or lp:
            out.append(self.chunk({"content": text}, lp))
        return out

    def on_error(self, error: RouterError) -> list[Any]:
        return [error.to_json(self.entry.request_id)]

    def on_end(self) -> list[Any]:
        assert self.finished is not None
        out: list[Any] = [self.chunk({}, finish=FINISH_REASON[self.finished.finish_reason])]
        if self.include_usage:
            out.append({**self.chunk({}), "choices": [], "usage": usage(self.entry)})
        return [*out, "[DONE]"]
