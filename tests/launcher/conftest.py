"""Shared fixtures for the launcher tests: stand-in programs, short socket paths, a model dir."""

import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.commands import Programs
from tests.launcher.launcher_process import REPO_ROOT, STANDINS


@pytest.fixture(autouse=True)
def _machine_ports_do_not_matter(monkeypatch):
    """Tests that call launcher.main.main in-process leave --port at 3000, which a developer's own
    server may hold: there the port check is a no-op. test_launcher_ports checks it, and so does
    every launcher run as a subprocess."""
    monkeypatch.setattr("launcher.main.check_ports", lambda *_args, **_kwargs: None)


@pytest.fixture
def standin_programs() -> Programs:
    return Programs(
        shard=(sys.executable, str(STANDINS / "fake_shard.py")),
        router=(sys.executable, str(STANDINS / "fake_router.py")),
    )


@pytest.fixture
def sock_prefix() -> Iterator[Path]:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer than that.
    d = Path(tempfile.mkdtemp(prefix="sy-", dir="/tmp"))
    yield d / "shard"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return d


@pytest.fixture
def standin_env(tmp_path: Path, standin_programs: Programs) -> dict[str, str]:
    """Environment for a launcher subprocess that starts the stand-ins instead of real children."""
    records = tmp_path / "records"
    records.mkdir()
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        "SWITCHYARD_SHARD_COMMAND": shlex.join(standin_programs.shard),
        "SWITCHYARD_ROUTER_COMMAND": shlex.join(standin_programs.router),
        "FAKE_PID_DIR": str(records),
        "PYTHONUNBUFFERED": "1",
    }
