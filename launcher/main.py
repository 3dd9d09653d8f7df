"""`launcher`: resolve the model, then start and supervise the shards and the router."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

from launcher.adapters import AdapterError, check_served_name, resolve_adapters
from launcher.args import LauncherConfig, parse_args
from launcher.checks import ShardCountError, check_experts, check_num_shard
from launcher.commands import Programs, build_plan, served_model_name
from launcher.default_model import DEFAULT_MODEL_NAME
from launcher.env import LauncherEnv
from launcher.ports import PortUnavailableError, check_ports
from launcher.quant_checks import QuantizationCheckError, check_quantization
from launcher.resolve import ModelResolutionError, resolve_model
from launcher.sockets import SocketPathError, check_socket_paths, private_socket_prefix
from launcher.supervisor import Supervisor, SupervisorSettings

log = logging.getLogger("launcher")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at emit time (pytest and embedders swap it)."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def _configure_logging() -> None:
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s launcher: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


@contextlib.contextmanager
def _stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM request a graceful stop; previous handlers come back afterwards."""
    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in sigs}
    for s in sigs:
        signal.signal(s, lambda _signum, _frame: stop())
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(
    argv: Sequence[str] | None = None,
    *,
    programs: Programs | None = None,
    settings: SupervisorSettings | None = None,
) -> int:
    """Entry point of the `launcher` console script; returns the process exit code.

    `programs` and `settings` let tests run stand-in children with short timeouts.
    """
    _configure_logging()
    env = LauncherEnv.from_environ()
    cfg = parse_args(argv, env)
    with contextlib.ExitStack() as cleanup:
        if cfg.shard_uds_path is None:
            prefix = cleanup.enter_context(private_socket_prefix())
            cfg = dataclasses.replace(cfg, shard_uds_path=prefix)
        if not _preflight(cfg):
            return 1
        return _launch(cfg, env, programs, settings)


def _preflight(cfg: LauncherConfig) -> bool:
    """What would otherwise fail only after the model is resolved and loaded (minutes, for a big
    one): a busy port, another server's shard sockets. Logs one line and returns False."""
    try:
        check_ports(cfg.hostname, cfg.port, cfg.num_shard, cfg.master_addr, cfg.master_port)
        check_socket_paths([Path(cfg.shard_socket(r)) for r in range(cfg.num_shard)])
    except (PortUnavailableError, SocketPathError) as exc:
        log.error("%s", exc)
        return False
    return True


def resolve_draft_model(cfg: LauncherConfig, env: LauncherEnv) -> Path | None:
    """--speculative-config's draft model (method draft_model), resolved as --model-id is (a
    directory, a GGUF file converted once, a hub id), for the shards' --draft-model."""
    spec = cfg.speculative_config
    if spec is None or spec.method != "draft_model":
        return None
    assert spec.model is not None  # the config requires it for this method
    try:
        return resolve_model(spec.model, env)
    except ModelResolutionError as exc:
        raise ModelResolutionError(f"--speculative-config model: {exc}") from exc


def _launch(
    cfg: LauncherConfig,
    env: LauncherEnv,
    programs: Programs | None,
    settings: SupervisorSettings | None,
) -> int:
    try:
        # Adapters first: a bad one is refused at once, not after a model download.
        check_served_name(cfg.lora_adapters, served_model_name(cfg))
        adapters = resolve_adapters(cfg.lora_adapters, env)
        model_dir = resolve_model(cfg.model_id, env)
        draft_dir = resolve_draft_model(cfg, env)
    except (ModelResolutionError, AdapterError) as exc:
        log.error("%s", exc)
        return 1
    except OSError as exc:  # e.g. an unwritable cache while converting the default model
        log.error("could not prepare the model: %s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    try:
        check_num_shard(cfg.num_shard, model_dir, env.cuda_visible_devices)
        check_experts(cfg.expert_parallel, cfg.num_shard, model_dir, cfg.compile)
        check_quantization(cfg.quantize, cfg.num_shard, model_dir, cfg.compile, cfg.expert_parallel)
        if draft_dir is not None:  # sharded over the same ranks; its checkpoint says its format
            check_num_shard(cfg.num_shard, draft_dir, env.cuda_visible_devices)
            check_quantization(None, cfg.num_shard, draft_dir, False)
    except (ShardCountError, QuantizationCheckError) as exc:
        log.error("%s", exc)
        return 1
    model = cfg.model_id or f"(default: {DEFAULT_MODEL_NAME})"
    log.info("model %s -> %s; %d shard(s)", model, model_dir, cfg.num_shard)
    if programs is None:
        default = Programs()
        programs = Programs(
            shard=env.shard_program or default.shard, router=env.router_program or default.router
        )
    if settings is None:
        settings = SupervisorSettings(startup_timeout_s=cfg.shard_startup_timeout)
    if adapters:
        log.info("LoRA adapters: %s", ", ".join(f"{a.name} -> {a.path}" for a in adapters))
    if draft_dir is not None:
        log.info("speculative decoding with the draft model %s", draft_dir)
    supervisor = Supervisor(build_plan(cfg, model_dir, programs, adapters, draft_dir), settings)
    with _stop_on_signals(supervisor.request_stop):
        return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
