"""`python -m shard serve ...`: load this rank's slice of the model and serve it over gRPC."""

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from shard.cuda_graph_buckets import CudaGraphsError, parse_buckets
from shard.layers.quant.config import METHODS as QUANTIZE_METHODS
from shard.lora.names import AdapterListError, check_adapter_names, split_adapter_list
from shard.rank_env import DistributedEnv
from shard.settings import OVERLAP_CHOICES, ShardSettings
from shard.sockets import shard_socket

# The shard stopped serving on its own (shard/server.py: ShardStopped); the launcher stops the pod.
EXIT_STOPPED = 3


def parse_args(argv: list[str]) -> ShardSettings:
    parser = argparse.ArgumentParser(prog="python -m shard")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve one shard over gRPC on a unix socket")
    serve.add_argument("--model-id", required=True, help="local model directory")
    serve.add_argument("--uds-path", required=True, help="socket path prefix; rank r uses P-r")
    serve.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"]
    )
    serve.add_argument(
        "--quantize",
        default=None,
        choices=QUANTIZE_METHODS,
        help="must match the checkpoint (fp8 on a float one: quantized at load)",
    )
    serve.add_argument("--attention", default=None, choices=["torch", "triton"])
    serve.add_argument("--block-size", type=int, default=16)
    serve.add_argument("--cuda-memory-fraction", type=float, default=0.9)
    serve.add_argument("--cpu-kv-cache-gb", type=float, default=None)
    serve.add_argument(
        "--lora-adapters", default="", help="NAME=DIR[,NAME=DIR...]: PEFT adapters to serve"
    )
    serve.add_argument(
        "--enable-lora",
        action="store_true",
        help="build the LoRA slots even without --lora-adapters, so that adapters can be loaded "
        "at runtime (LoadAdapter); implied by --lora-adapters",
    )
    serve.add_argument("--max-loras", type=int, default=4, help="adapter slots on the device")
    serve.add_argument("--max-cpu-loras", type=int, default=None, help="host LRU cache size")
    serve.add_argument("--max-lora-rank", type=int, default=64)
    serve.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the forward pass at warmup (CPU, one shard, dense weights, no LoRA)",
    )
    serve.add_argument(
        "--expert-parallel",
        action="store_true",
        help="Mixture-of-Experts models: hold E/world_size whole experts instead of a slice of "
        "every expert (tensor parallel, the default)",
    )
    serve.add_argument(
        "--cuda-graphs",
        default="",
        help="batch sizes whose decode steps are captured as CUDA graphs, e.g. 1,2,4,8 (0: none; "
        "default 1,2,4,...,128 on a GPU)",
    )
    serve.add_argument(
        "--overlap-schedule",
        choices=OVERLAP_CHOICES,
        default="auto",
        help="queue each decode step's successor on the device before the router asks for it "
        "(auto: on a GPU, off on a CPU, where it would delay every answer by a step)",
    )
    serve.add_argument(
        "--draft-model",
        default=None,
        help="speculative decoding: a local model directory with the model's vocabulary whose "
        "greedy guesses the router proposes (steps ask for them with draft_tokens)",
    )
    args = parser.parse_args(argv)
    try:
        cuda_graphs = parse_buckets(args.cuda_graphs)
    except CudaGraphsError as err:
        parser.error(str(err))
    if args.block_size < 1:
        parser.error(f"--block-size must be at least 1, got {args.block_size}")
    if not 0 < args.cuda_memory_fraction <= 1:
        parser.error(f"--cuda-memory-fraction must be in (0, 1], got {args.cuda_memory_fraction}")
    if args.cpu_kv_cache_gb is not None and args.cpu_kv_cache_gb <= 0:
        parser.error(f"--cpu-kv-cache-gb must be positive, got {args.cpu_kv_cache_gb}")
    if not Path(args.model_id).is_dir():
        parser.error(f"--model-id {args.model_id} is not a directory")
    if args.draft_model is not None:
        if not Path(args.draft_model).is_dir():
            parser.error(f"--draft-model {args.draft_model} is not a directory")
        if args.overlap_schedule == "on":
            parser.error("--overlap-schedule on cannot be used with --draft-model")
    try:
        adapters = split_adapter_list([args.lora_adapters])
        check_adapter_names([name for name, _ in adapters])
    except AdapterListError as err:
        parser.error(f"--lora-adapters: {err}")
    for flag in ("max_loras", "max_lora_rank"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    return ShardSettings(
        model_id=args.model_id,
        uds_path=args.uds_path,
        dtype=args.dtype,
        quantize=args.quantize,
        attention=args.attention,
        block_size=args.block_size,
        cuda_memory_fraction=args.cuda_memory_fraction,
        cpu_kv_cache_gb=args.cpu_kv_cache_gb,
        lora_adapters=tuple(adapters),
        enable_lora=args.enable_lora or bool(adapters),
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        max_lora_rank=args.max_lora_rank,
        compile=args.compile,
        expert_parallel=args.expert_parallel,
        cuda_graphs=cuda_graphs,
        overlap_schedule=args.overlap_schedule,
        draft_model=args.draft_model,
    )


def _operator_errors() -> tuple[type[Exception], ...]:
    """What the operator gave that the shard cannot serve (a checkpoint, a flag, an adapter):
    logged as one line, not a traceback; anything else is a bug and keeps its traceback."""
    from shard.cuda_graph_buckets import CudaGraphsError
    from shard.gguf.checks import GgufError
    from shard.gguf.names import GgufNameError
    from shard.kv_cache import KvCacheTooLargeError
    from shard.layers.quant.config import QuantizationConfigError
    from shard.lora.adapter import AdapterError
    from shard.lora.names import AdapterListError
    from shard.models.config import UnsupportedArchitectureError
    from shard.weights import WeightsError

    return (
        AdapterError, AdapterListError, CudaGraphsError, GgufError, GgufNameError,
        KvCacheTooLargeError, QuantizationConfigError, UnsupportedArchitectureError, WeightsError,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(sys.argv[1:] if argv is None else argv)
    rank = DistributedEnv.from_env().rank
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"),
        format=f"%(asctime)s %(levelname)s shard{rank} %(name)s: %(message)s",
    )
    from shard.server import ShardStopped, serve
    from shard.startup import build_service

    try:
        service = build_service(settings)
    except _operator_errors() as exc:  # the message names the flag, file or adapter at fault
        logging.getLogger(__name__).error("cannot start: %s", exc)
        return 1
    socket_path = Path(shard_socket(settings.uds_path, rank))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(serve(service, rank))
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            logging.getLogger(__name__).info("shard %d shutting down", rank)

    try:
        asyncio.run(run())
    except ShardStopped as exc:
        logging.getLogger(__name__).error("stopping: %s", exc)
        socket_path.unlink(missing_ok=True)
        logging.shutdown()
        # Not a normal exit: the torch thread may be stuck in a collective with a failed peer,
        # and the interpreter would wait for it forever.
        os._exit(EXIT_STOPPED)
    finally:
        socket_path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
