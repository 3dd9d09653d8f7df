"""The command lines and environments of the shard and router processes (docs/architecture.md)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from launcher.adapters import LoraAdapter, flag_value
from launcher.args import ROUTER_INT_FLAGS, LauncherConfig
from launcher.default_model import DEFAULT_MODEL_NAME

# The router reads its API key from here (router/args.py); a plain constant, so the launcher
# does not import the router (and its dependencies) just to start it.
API_KEY_ENV = "SWITCHYARD_API_KEY"


@dataclass(frozen=True)
class Programs:
    """What runs a shard and the router; swapped for wrappers or stand-ins, never for flags."""

    shard: tuple[str, ...] = (sys.executable, "-m", "shard")
    router: tuple[str, ...] = (sys.executable, "-m", "router")


@dataclass(frozen=True)
class ChildSpec:
    name: str  # used as the log prefix and in every error about this child
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # added on top of the launcher's env


@dataclass(frozen=True)
class LaunchPlan:
    shards: tuple[ChildSpec, ...]
    shard_sockets: tuple[Path, ...]  # shard_sockets[r] is where rank r listens
    router: ChildSpec


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def served_model_name(cfg: LauncherConfig) -> str:
    # The API reports what the user asked for, not a cache path the launcher resolved it to.
    return cfg.served_model_name or cfg.model_id or DEFAULT_MODEL_NAME


def _lora_flags(cfg: LauncherConfig, adapters: tuple[LoraAdapter, ...]) -> list[str]:
    """The shards' LoRA flags; none without adapters or runtime loading (the shards then build
    no LoRA state). With runtime loading they build their slots even with no adapter yet."""
    if not adapters and not cfg.enable_lora_runtime_loading:
        return []
    argv = ["--lora-adapters", flag_value(adapters)] if adapters else []
    if cfg.enable_lora_runtime_loading:
        argv.append("--enable-lora")
    for name in ("max_loras", "max_cpu_loras", "max_lora_rank"):
        argv += [_flag(name), str(getattr(cfg, name))]
    return argv


def shard_spec(
    cfg: LauncherConfig,
    model_dir: Path,
    rank: int,
    program: tuple[str, ...],
    adapters: tuple[LoraAdapter, ...] = (),
    draft_model_dir: Path | None = None,
) -> ChildSpec:
    argv = [
        *program,
        "serve",
        "--model-id",
        str(model_dir),
        "--uds-path",
        cfg.shard_uds_path,
        "--dtype",
        cfg.dtype,
        "--block-size",
        str(cfg.block_size),
    ]
    forwarded = (
        "quantize", "attention", "cuda_memory_fraction", "cpu_kv_cache_gb", "cuda_graphs",
        "overlap_schedule",
    )  # fmt: skip
    for name in forwarded:
        value = getattr(cfg, name)
        if value is not None:
            argv += [_flag(name), str(value)]
    if cfg.compile:
        argv.append("--compile")
    if cfg.expert_parallel:
        argv.append("--expert-parallel")
    argv += _lora_flags(cfg, adapters)
    if draft_model_dir is not None:  # speculative decoding's draft model (shard/draft.py)
        argv += ["--draft-model", str(draft_model_dir)]
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(cfg.num_shard),
        # One node: the local rank picks the GPU.
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": cfg.master_addr,
        "MASTER_PORT": str(cfg.master_port),
    }
    return ChildSpec(name=f"shard {rank}", argv=tuple(argv), env=env)


def router_spec(
    cfg: LauncherConfig,
    model_dir: Path,
    program: tuple[str, ...],
    adapters: tuple[LoraAdapter, ...] = (),
) -> ChildSpec:
    served_name = served_model_name(cfg)
    argv = [
        *program,
        "--model-id",
        str(model_dir),
        "--shard-uds-path",
        cfg.shard_uds_path,
        "--hostname",
        cfg.hostname,
        "--port",
        str(cfg.port),
        "--served-model-name",
        served_name,
        # started beside the shards, the router waits for them as long as the launcher does
        "--shard-connect-timeout",
        str(cfg.shard_startup_timeout),
    ]
    for name in (
        *ROUTER_INT_FLAGS,
        "waiting_served_ratio",
        "shard_step_timeout",
        "max_top_n_tokens",
    ):
        value = getattr(cfg, name)
        if value is not None:
            argv += [_flag(name), str(value)]
    if cfg.prefill_chunking is not None:
        argv.append("--prefill-chunking" if cfg.prefill_chunking else "--no-prefill-chunking")
    if cfg.prefix_caching is not None:
        argv.append("--prefix-caching" if cfg.prefix_caching else "--no-prefix-caching")
    for name in ("tool_call_parser", "reasoning_parser"):
        if getattr(cfg, name) is not None:
            argv += [_flag(name), getattr(cfg, name)]
    if cfg.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    if cfg.speculative_config is not None:
        # One form whichever flag was given (--speculate N is its shorthand).
        argv += ["--speculative-config", cfg.speculative_config.to_json()]
    for origin in cfg.cors_allow_origin or ():
        argv += ["--cors-allow-origin", origin]
    if adapters:
        # Names and paths for validation and /v1/models.
        argv += ["--lora-adapters", flag_value(adapters)]
    if adapters or cfg.enable_lora_runtime_loading:
        argv += ["--max-loras", str(cfg.max_loras)]  # for admission
    if cfg.enable_lora_runtime_loading:
        assert cfg.lora_dir is not None  # launcher/args.py refuses the flag without it
        argv += ["--enable-lora-runtime-loading", "--lora-dir", cfg.lora_dir]
    # The key stays out of argv: `ps` and the launcher's "started router" log line show argv.
    env = {API_KEY_ENV: cfg.api_key} if cfg.api_key else {}
    return ChildSpec(name="router", argv=tuple(argv), env=env)


def build_plan(
    cfg: LauncherConfig,
    model_dir: Path,
    programs: Programs,
    adapters: tuple[LoraAdapter, ...] = (),
    draft_model_dir: Path | None = None,
) -> LaunchPlan:
    if cfg.shard_uds_path is None:
        # launcher.main gives every launcher its own directory first (launcher/sockets.py).
        raise ValueError("the shards' socket prefix must be chosen before building the plan")
    return LaunchPlan(
        shards=tuple(
            shard_spec(cfg, model_dir, r, programs.shard, adapters, draft_model_dir)
            for r in range(cfg.num_shard)
        ),
        shard_sockets=tuple(Path(cfg.shard_socket(r)) for r in range(cfg.num_shard)),
        router=router_spec(cfg, model_dir, programs.router, adapters),
    )
