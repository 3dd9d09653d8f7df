"""checkov in a virtual environment of its own, beside the project's (.venv/checkov).

checkov pins packaging<24 and networkx<2.7: in the project's environment pip would downgrade
packaging below what pytest 9 requires and networkx below what torch is tested with, so it
cannot be one of the `dev` extra's packages. `make install` builds this environment
(`python -m tests.deploy.checkov_env`); the checkov test builds it too where it is missing or
holds another version, so a plain `pytest` works after `pip install -e .[dev]` alone.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

REQUIREMENT = "checkov==3.3.30"
# Beside the project's own environment, so that `make clean` takes it too.
_IN_VENV = sys.prefix != sys.base_prefix
HOME = (Path(sys.prefix) if _IN_VENV else Path.home() / ".cache" / "switchyard") / "checkov"
PYTHON = HOME / "bin" / "python"
_STAMP = HOME / "installed"


def ensure() -> Path:
    """The environment's python, built once per version; concurrent callers wait for one build."""
    HOME.parent.mkdir(parents=True, exist_ok=True)
    with open(HOME.parent / ".checkov.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (_STAMP.is_file() and _STAMP.read_text() == REQUIREMENT):
            shutil.rmtree(HOME, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(HOME)], check=True)
            pip = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run([*pip, REQUIREMENT], check=True)
            _STAMP.write_text(REQUIREMENT)
    return PYTHON


if __name__ == "__main__":
    print(ensure())
