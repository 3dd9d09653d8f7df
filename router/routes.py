"""Every HTTP route in one table: server.py registers these, and GET /openapi.json describes
exactly these (router/api/openapi.py), so the two cannot drift apart."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from router.api.chat import ChatRequest
from router.api.lora import LoadLoraAdapter, UnloadLoraAdapter
from router.api.openai import CompletionRequest
from router.api.tgi import GenerateRequest, TokenizeRequest
from router.handlers.debug import MAX_STEP, debug_steps
from router.handlers.generate import generate
from router.handlers.lora_admin import load_lora_adapter, unload_lora_adapter
from router.handlers.misc import (
    compat_generate,
    health,
    info,
    metrics,
    models,
    openapi_json,
    tokenize,
)
from router.handlers.openai_chat import chat_completions
from router.handlers.openai_completions import completions
from router.handlers.stream import generate_stream

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
JSON, SSE, TEXT = "application/json", "text/event-stream", "text/plain"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    body: type[BaseModel] | None = None
    answers: tuple[str, ...] = (JSON,)  # media types of a 200
    query: tuple[dict[str, Any], ...] = ()  # OpenAPI parameter objects
    errors: tuple[str, ...] = ()  # statuses beyond every route's (openapi.ROUTE_ERRORS)


ROUTES = (
    Route("POST", "/", compat_generate, "TGI: /generate, or /generate_stream with `stream`",
          "TGI", GenerateRequest, (JSON, SSE)),
    Route("POST", "/generate", generate, "TGI: generate, one answer", "TGI", GenerateRequest),
    Route("POST", "/generate_stream", generate_stream, "TGI: generate, one event per token",
          "TGI", GenerateRequest, (SSE,)),
    Route("POST", "/tokenize", tokenize, "TGI: the tokens of `inputs`", "TGI", TokenizeRequest),
    Route("POST", "/v1/completions", completions, "OpenAI: text completion", "OpenAI",
          CompletionRequest, (JSON, SSE)),
    Route("POST", "/v1/chat/completions", chat_completions, "OpenAI: chat completion",
          "OpenAI", ChatRequest, (JSON, SSE)),
    Route("GET", "/v1/models", models, "OpenAI: the base model and its LoRA adapters", "OpenAI"),
    Route("POST", "/v1/load_lora_adapter", load_lora_adapter,
          "vLLM: load a LoRA adapter (--enable-lora-runtime-loading)", "LoRA", LoadLoraAdapter,
          (TEXT,), errors=("400",)),
    Route("POST", "/v1/unload_lora_adapter", unload_lora_adapter,
          "vLLM: unload a LoRA adapter (--enable-lora-runtime-loading)", "LoRA",
          UnloadLoraAdapter, (TEXT,), errors=("400",)),
    Route("GET", "/info", info, "TGI: model and server limits", "TGI"),
    Route("GET", "/health", health, "200 when every shard answers", "Server", answers=(),
          errors=("503",)),
    Route("GET", "/metrics", metrics, "Prometheus metrics", "Server", answers=(TEXT,)),
    Route("GET", "/debug/steps", debug_steps, "The scheduler's step timeline", "Server",
          query=({"name": "since", "in": "query", "required": False,
                  "schema": {"type": "integer", "minimum": 0, "maximum": MAX_STEP}},)),
    Route("GET", "/openapi.json", openapi_json, "This document", "Server"),
)  # fmt: skip
