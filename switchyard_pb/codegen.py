"""Regenerates the stubs from proto/generate.proto with grpcio-tools.

protoc names the import in the gRPC stub after the path under its include root, so the proto is
compiled from a temporary root where it sits at `switchyard_pb/generate.proto`: the stubs then
import each other as `switchyard_pb.generate_pb2`, never as a top-level `proto` package.
"""

import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE = "switchyard_pb"
REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_SOURCE = REPO_ROOT / "proto" / "generate.proto"
GENERATED = ("generate_pb2.py", "generate_pb2.pyi", "generate_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Writes the generated files into out_dir and returns their paths."""
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / PACKAGE).mkdir()
        shutil.copy(PROTO_SOURCE, root / PACKAGE / "generate.proto")
        with tempfile.TemporaryDirectory() as gen:
            args = [
                "grpc_tools.protoc",
                f"-I{root}",
                f"--python_out={gen}",
                f"--pyi_out={gen}",
                f"--grpc_python_out={gen}",
                f"{root / PACKAGE / 'generate.proto'}",
            ]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed on {PROTO_SOURCE}")
            paths = []
            for name in GENERATED:
                target = out_dir / name
                shutil.copy(Path(gen) / PACKAGE / name, target)
                paths.append(target)
    return paths


if __name__ == "__main__":
    written = generate(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT / PACKAGE)
    print("\n".join(str(p) for p in written))
