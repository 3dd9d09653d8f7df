"""The committed gRPC stubs must be exactly what proto/generate.proto generates today."""

import subprocess
import sys
from pathlib import Path

import pytest

from switchyard_pb import codegen

STUB_DIR = Path(codegen.__file__).parent


def test_committed_stubs_match_the_proto(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools is a dev dependency")
    stale = [
        path.name
        for path in codegen.generate(tmp_path)
        if path.read_text() != (STUB_DIR / path.name).read_text()
    ]
    assert not stale, (
        f"switchyard_pb/{', switchyard_pb/'.join(stale)} out of date with proto/generate.proto; "
        "run `python -m switchyard_pb.codegen` and commit the result"
    )


def test_stubs_import_each_other_through_their_package():
    for name in codegen.GENERATED:
        text = (STUB_DIR / name).read_text()
        assert "from proto " not in text and "import proto." not in text, name
    from switchyard_pb import generate_pb2_grpc

    assert (
        generate_pb2_grpc.switchyard__pb_dot_generate__pb2.__name__ == "switchyard_pb.generate_pb2"
    )


def test_stubs_are_not_a_top_level_proto_package():
    # `proto` belongs to proto-plus. The repository's proto/ folder holds only the .proto source,
    # so no Python module may live there.
    proto_dir = Path(codegen.PROTO_SOURCE).parent
    assert sorted(p.name for p in proto_dir.glob("*.py")) == []
    # A fresh interpreter: in this one grpc_tools (imported by the test above) installs an import
    # hook that compiles any .proto on sys.path on demand, which would blur the check.
    probe = (
        "import importlib, sys\n"
        "import switchyard_pb.generate_pb2_grpc\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'proto']\n"
        "for name in ('proto.generate_pb2', 'proto.generate_pb2_grpc', 'generate_pb2'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    sys.exit(f'{name} is importable')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=codegen.REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_declared_protobuf_range_admits_only_runtimes_the_stubs_accept():
    """protobuf refuses a runtime older than the stubs' gencode, or of another major version, at
    import: pyproject's range must not let an install pick such a runtime."""
    import re

    stub = (STUB_DIR / "generate_pb2.py").read_text()
    gencode = tuple(
        int(x) for x in re.search(r"Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", stub).groups()
    )
    pyproject = (STUB_DIR.parent / "pyproject.toml").read_text()
    (spec,) = re.findall(r'^\s*"(protobuf[^"]*)"', pyproject, flags=re.MULTILINE)
    lower = re.search(r">=\s*([\d.]+)", spec)
    upper = re.search(r"<\s*(\d+)(?:[,\s]|$)", spec)
    assert lower and upper, f"{spec!r} needs a lower bound and an exclusive major upper bound"
    assert tuple(int(x) for x in lower.group(1).split(".")) >= gencode, spec
    assert int(upper.group(1)) == gencode[0] + 1, spec
