"""deploy/'s Kubernetes objects: as written (every YAML file) and as kustomize builds them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# What `kubectl apply -k` is documented for (README, "Kubernetes").
KUSTOMIZATIONS = ("deploy", "deploy/cpu", "deploy/monitoring")
# YAML in deploy/ that is not a Kubernetes object: kustomize's own files and a Helm values file.
NOT_OBJECTS = {"kustomization.yaml", "prometheus-adapter-values.yaml"}

Obj = dict[str, Any]


def yaml_files() -> list[Path]:
    return sorted(DEPLOY.rglob("*.yaml"))


def object_files() -> list[Path]:
    return [p for p in yaml_files() if p.name not in NOT_OBJECTS]


def objects(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def written(kind: str, directory: str = "deploy/base") -> Obj:
    """The one object of this kind among a directory's files."""
    (found,) = [
        obj
        for p in object_files()
        if p.parent == ROOT / directory
        for obj in objects(p)
        if obj["kind"] == kind
    ]
    return found


def build(kustomization: str) -> list[Obj]:
    """`kubectl kustomize DIR`: what `kubectl apply -k DIR` would send. kubectl is not a
    Python package; where it is missing, the tests of what kustomize builds are skipped."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (its built-in kustomize) is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / kustomization)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc is not None]


def container(deployment: Obj) -> Obj:
    (found,) = deployment["spec"]["template"]["spec"]["containers"]
    return found
