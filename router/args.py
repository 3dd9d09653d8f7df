"""The router's command line (the contract with the launcher is in docs/architecture.md).

Token limits stay `None` when unset: their defaults depend on the model's context length, which
only the shards know, so `router.limits` resolves them after the Info RPC.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from router.adapters import AdapterSpecError, LoraAdapter, parse_adapters
from router.api.fields import MAX_MODEL_NAME_CHARS
from router.speculation.config import SpeculativeConfig
from router.speculation.flags import add_speculation_flags, resolve_speculation
from router.step_deadlines import DEFAULT_STEP_TIMEOUT_S

# The launcher hands the API key over in the environment, not on a command line that `ps` and
# the launcher's own log would show.
API_KEY_ENV = "SWITCHYARD_API_KEY"
# TGI's default: bodies are small JSON documents; the token limits are the real bound on prompts.
DEFAULT_PAYLOAD_LIMIT = 2_000_000
# Run alone, the router expects shards that are already up; the launcher passes its own startup
# timeout instead, having started the router beside shards that may load for minutes.
DEFAULT_CONNECT_TIMEOUT_S = 60.0
# Distinct LoRA adapters the shards hold on the device at once (the launcher's default too).
DEFAULT_MAX_LORAS = 4
# Input bounds beyond TGI's flags (docs/architecture.md, "Bounded input").
# Every step scans a window as long as the longest stop sequence: one request must not make every
# step of the batch slow (TGI has no such bound; no real stop sequence comes close).
DEFAULT_MAX_STOP_SEQUENCE_LENGTH = 1024
# A grammar's text in bytes (a JSON schema as JSON, a regex, the choices). OpenAI bounds a schema
# at 5000 properties and 120,000 characters of names and enum values; a 300 KB schema compiles in
# about 0.5 s on a CPU core, and llguidance refuses schemas past about 600 KB itself.
DEFAULT_MAX_GRAMMAR_SIZE = 256 * 1024
# aiohttp's own: the request line and each header field (nginx's buffer is 8 KiB too).
DEFAULT_MAX_HEADER_SIZE = 8190
DEFAULT_MAX_HEADERS = 128  # aiohttp's (hyper, under TGI, allows 100)
# The parsers' names, as vLLM's flags take them (the registries import the parsers only when
# one is chosen; tests/launcher/test_launcher_chat_parsers.py checks both lists against them).
# The registries' names (router/tool_calls/registry.py, router/reasoning/registry.py), spelled out
# so that parsing flags imports no parser; a test keeps them equal.
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral", "pythonic", "openai", "qwen3_coder",
                     "qwen3_xml", "ernie45", "glm45", "glm47", "minimax_m2", "seed_oss",
                     "deepseek_v3", "deepseek_v31", "deepseek_v32", "kimi_k2", "llama4_pythonic",
                     "llama4_json", "granite", "phi4_mini_json", "hunyuan_a13b",
                     "olmo3")  # fmt: skip
REASONING_PARSERS = ("deepseek_r1", "qwen3", "openai_gptoss", "glm45", "minimax_m2", "seed_oss",
                     "deepseek_v3", "ernie45", "granite", "hunyuan_a13b", "kimi_k2",
                     "minimax_m2_append_think", "mistral", "olmo3", "step3")  # fmt: skip


@dataclass(frozen=True)
class RouterArgs:
    model_id: str
    shard_uds_path: str
    hostname: str = "0.0.0.0"
    port: int = 3000
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    max_batch_total_tokens: int | None = None
    max_concurrent_requests: int = 128
    max_stop_sequences: int = 4
    max_best_of: int = 2
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20
    # Seconds a decode step may take before the shards are declared hung; scaled per step
    # (router/step_deadlines.py). 0 on the command line: never.
    shard_step_timeout: float | None = DEFAULT_STEP_TIMEOUT_S
    # Seconds to wait at startup for the shards' sockets and connections (they may still be
    # loading: the launcher starts the router beside them and passes its own startup timeout).
    shard_connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    max_batch_size: int | None = None
    prefill_chunking: bool = True
    prefill_chunk_tokens: int | None = None
    # Automatic prefix caching (router/prefix_cache.py). None: on, unless the model keeps a state
    # per sequence (router/model_fit.py).
    prefix_caching: bool | None = None
    max_top_n_tokens: int = 5
    payload_limit: int = DEFAULT_PAYLOAD_LIMIT
    max_stop_sequence_length: int = DEFAULT_MAX_STOP_SEQUENCE_LENGTH
    max_grammar_size: int = DEFAULT_MAX_GRAMMAR_SIZE
    max_header_size: int = DEFAULT_MAX_HEADER_SIZE
    max_headers: int = DEFAULT_MAX_HEADERS
    api_key: str | None = None
    cors_allow_origin: tuple[str, ...] = field(default_factory=tuple)
    served_model_name: str | None = None
    lora_adapters: tuple[LoraAdapter, ...] = ()
    max_loras: int = DEFAULT_MAX_LORAS
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter; paths only under lora_dir.
    enable_lora_runtime_loading: bool = False
    lora_dir: str | None = None  # a real path (symlinks resolved)
    # Tool calling and reasoning on /v1/chat/completions (router/chat_features.py).
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    # Speculative decoding (router/speculation/): --speculate N or --speculative-config JSON.
    speculative_config: SpeculativeConfig | None = None

    @property
    def model_name(self) -> str:
        """The name /info reports: the served name when given, else the model directory."""
        return self.served_model_name or self.model_id


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0.0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m router",
        description="Switchyard router: HTTP API, validation, batching and KV blocks.",
    )
    p.add_argument("--model-id", required=True, help="local model directory (tokenizer source)")
    p.add_argument("--shard-uds-path", required=True, help="shard r listens on unix://{P}-{r}")
    p.add_argument("--hostname", default="0.0.0.0")
    p.add_argument("--port", type=_positive_int, default=3000)
    p.add_argument("--max-input-tokens", type=_positive_int, default=None)
    p.add_argument("--max-total-tokens", type=_positive_int, default=None)
    p.add_argument("--max-batch-prefill-tokens", type=_positive_int, default=None)
    # 0 means unset, so the launcher can always forward the flag.
    p.add_argument("--max-batch-total-tokens", type=_non_negative_int, default=None)
    p.add_argument("--max-concurrent-requests", type=_positive_int, default=128)
    p.add_argument("--max-stop-sequences", type=_non_negative_int, default=4)
    p.add_argument("--max-best-of", type=_positive_int, default=2)
    p.add_argument("--waiting-served-ratio", type=_non_negative_float, default=0.3)
    p.add_argument("--max-waiting-tokens", type=_non_negative_int, default=20)
    p.add_argument(
        "--shard-step-timeout",
        type=_non_negative_float,
        default=DEFAULT_STEP_TIMEOUT_S,
        help="seconds a decode step may take before the shards are declared hung and the server "
        "stops (503 on /health, an error to every request); one more such budget per 1024 "
        "prompt tokens in the step, and 10x for the first 10 steps; 0: never (default: "
        f"{DEFAULT_STEP_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--shard-connect-timeout",
        type=_non_negative_float,
        default=DEFAULT_CONNECT_TIMEOUT_S,
        help="seconds to wait at startup for every shard's socket to appear and answer (the "
        f"shards may still be loading their model; default: {DEFAULT_CONNECT_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--max-batch-size", type=_positive_int, default=None, help="requests per batch (unbounded)"
    )
    p.add_argument(
        "--prefill-chunking",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compute prompts over several steps, mixed into the decoding of running requests "
        "(default: on)",
    )
    p.add_argument(
        "--prefill-chunk-tokens",
        type=_positive_int,
        default=None,
        help="with chunking, prompt tokens a step may add while requests are decoding, grown "
        "up to 4x when many prompt tokens wait (default: 64 on CPU, --max-batch-prefill-tokens "
        "on GPU)",
    )
    p.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep the KV blocks of computed prompts and reuse them for later requests that "
        "start with the same tokens (default: on, but off for models with linear attention)",
    )
    p.add_argument("--max-top-n-tokens", type=_non_negative_int, default=5)
    p.add_argument(
        "--payload-limit", type=_positive_int, default=DEFAULT_PAYLOAD_LIMIT, help="bytes"
    )
    p.add_argument(
        "--max-stop-sequence-length",
        type=_positive_int,
        default=DEFAULT_MAX_STOP_SEQUENCE_LENGTH,
        help="characters of one stop sequence",
    )
    p.add_argument(
        "--max-grammar-size",
        type=_positive_int,
        default=DEFAULT_MAX_GRAMMAR_SIZE,
        help="bytes of a structured-output grammar (a JSON schema as JSON text, a regex, the "
        "choices)",
    )
    p.add_argument(
        "--max-header-size",
        type=_positive_int,
        default=DEFAULT_MAX_HEADER_SIZE,
        help="bytes of the request line and of each header field (else 431)",
    )
    p.add_argument(
        "--max-headers",
        type=_positive_int,
        default=DEFAULT_MAX_HEADERS,
        help="header fields in one request (else 431)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help=f"require `Authorization: Bearer KEY` on generation routes (or set {API_KEY_ENV})",
    )
    p.add_argument(
        "--cors-allow-origin",
        action="append",
        default=None,
        help="origin allowed to call the API from a browser (repeatable, or comma-separated; "
        "'*' for any)",
    )
    p.add_argument("--served-model-name", default=None)
    p.add_argument(
        "--lora-adapters",
        action="append",
        default=None,
        metavar="NAME=DIR[,NAME=DIR...]",
        help="LoRA adapters the shards loaded (repeatable, or comma-separated)",
    )
    p.add_argument(
        "--max-loras",
        type=_positive_int,
        default=DEFAULT_MAX_LORAS,
        help="distinct adapters among the requests on the shards at once (their device slots)",
    )
    p.add_argument(
        "--enable-lora-runtime-loading",
        action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (needs --lora-dir; "
        "the shards must run with --enable-lora)",
    )
    p.add_argument(
        "--lora-dir",
        default=None,
        metavar="DIR",
        help="the only directory runtime-loaded adapters may come from (its subdirectories)",
    )
    add_chat_parser_flags(p)
    add_speculation_flags(p)
    return p


def add_chat_parser_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """vLLM's flags for tool calling and reasoning (the launcher offers the same)."""
    p.add_argument(
        "--tool-call-parser",
        choices=TOOL_CALL_PARSERS,
        default=None,
        help="the model's tool-call format, for `tools` on /v1/chat/completions: hermes (Qwen2.5, "
        "Qwen3, Hermes), llama3_json (Llama 3.1-3.3), mistral, pythonic (Llama 4), openai "
        "(gpt-oss, with --reasoning-parser openai_gptoss), qwen3_coder or qwen3_xml (Qwen3-Coder, "
        "Qwen3.5), ernie45 (ERNIE 4.5: hermes' blocks), "
        "glm45/glm47 (GLM-4.5 to 4.7), minimax_m2, seed_oss, deepseek_v3, deepseek_v31 "
        "(DeepSeek-V3.1, V3.2-Exp), deepseek_v32 (DeepSeek-V3.2's DSML), kimi_k2, "
        "llama4_pythonic and llama4_json (Llama 4), granite "
        "(Granite 3.x), phi4_mini_json (Phi-4-mini), hunyuan_a13b, olmo3 (Olmo 3); needed for "
        "tool_choice required or a named function",
    )
    p.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        default=None,
        help="let the model decide whether to call tools (tool_choice auto, OpenAI's default "
        "with tools); needs --tool-call-parser",
    )
    p.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        default=None,
        help="the model's reasoning goes to `reasoning_content`: deepseek_r1, qwen3, glm45, "
        "minimax_m2, seed_oss, deepseek_v3 (DeepSeek-V3.1 and later), ernie45, kimi_k2, step3, "
        "mistral (Magistral's [THINK]), granite (Granite 3.x), hunyuan_a13b, olmo3 (think "
        "blocks), openai_gptoss (gpt-oss's harmony channels); minimax_m2_append_think leaves "
        "MiniMax-M2's think block in the content",
    )


def parse_args(argv: list[str] | None = None) -> RouterArgs:
    parser = build_parser()
    ns = parser.parse_args(argv)
    speculative_config = resolve_speculation(parser, ns)
    values = vars(ns)
    values["speculative_config"] = speculative_config
    model_name = values["served_model_name"] or values["model_id"]
    try:
        values["lora_adapters"] = parse_adapters(values["lora_adapters"] or (), model_name)
    except AdapterSpecError as err:
        parser.error(f"argument --lora-adapters: {err}")
    if values["lora_dir"] is not None:
        if not os.path.isdir(values["lora_dir"]):
            parser.error(f"argument --lora-dir: {values['lora_dir']} is not a directory")
        values["lora_dir"] = os.path.realpath(values["lora_dir"])
    if values["enable_lora_runtime_loading"] and values["lora_dir"] is None:
        # Without it any file of the host could be handed to the shards to read.
        parser.error("--enable-lora-runtime-loading needs --lora-dir DIR (where adapters may be)")
    values["enable_auto_tool_choice"] = bool(values["enable_auto_tool_choice"])
    if values["enable_auto_tool_choice"] and values["tool_call_parser"] is None:
        parser.error("--enable-auto-tool-choice needs --tool-call-parser (the model's format)")
    if len(model_name) > MAX_MODEL_NAME_CHARS:  # OpenAI's `model` could not name it
        parser.error(f"the served model name must be at most {MAX_MODEL_NAME_CHARS} characters")
    if values["max_batch_total_tokens"] == 0:
        values["max_batch_total_tokens"] = None
    if values["shard_step_timeout"] == 0:
        values["shard_step_timeout"] = None
    if values["api_key"] is None:
        values["api_key"] = os.environ.get(API_KEY_ENV) or None
    origins = [o.strip() for arg in values["cors_allow_origin"] or [] for o in arg.split(",")]
    values["cors_allow_origin"] = tuple(o for o in origins if o)
    return RouterArgs(**values)
