"""checkov's Kubernetes and Dockerfile policies hold for deploy/ and the Dockerfile: no check
fails, and each one skipped is skipped where the file says so, with its reason (a
`checkov.io/skipN: CKV_...=reason` annotation), and is still a check that applies."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.deploy import checkov_env
from tests.deploy.manifests import ROOT, yaml_files

SKIP = re.compile(r"checkov\.io/skip\d+:\s*(CKV2?_\w+)=(.+)")


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    """One checkov run over every file, by framework (`kubernetes`, `dockerfile`)."""
    files = [str(p.relative_to(ROOT)) for p in [ROOT / "Dockerfile", *yaml_files()]]
    out = subprocess.run(
        # --skip-download: nothing from Prisma Cloud (its policy names, a network call).
        [str(checkov_env.ensure()), "-m", "checkov.main", "--framework", "kubernetes",
         "dockerfile", "--skip-download", "--output", "json", "--file", *files],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert out.stdout.startswith(("[", "{")), out.stderr[-3000:]
    found = json.loads(out.stdout)
    return {r["check_type"]: r for r in (found if isinstance(found, list) else [found])}


def test_both_frameworks_scanned_something(reports):
    assert set(reports) == {"kubernetes", "dockerfile"}
    assert all(r["summary"]["resource_count"] > 0 for r in reports.values())
    assert all(r["summary"]["parsing_errors"] == 0 for r in reports.values())


def test_no_check_fails(reports):
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}"
        for r in reports.values()
        for c in r["results"]["failed_checks"]
    ]
    assert failed == []


def test_every_skip_is_justified_and_used(reports):
    annotated = {
        (f"/{p.relative_to(ROOT)}", check): reason.strip()
        for p in yaml_files()
        for check, reason in SKIP.findall(p.read_text())
    }
    assert all(len(reason) > 20 for reason in annotated.values()), annotated
    skipped = {
        (c["file_path"], c["check_id"])
        for r in reports.values()
        for c in r["results"]["skipped_checks"]
    }
    # A skip that no longer matches a check hides nothing and only misleads: drop it.
    assert skipped == set(annotated)
