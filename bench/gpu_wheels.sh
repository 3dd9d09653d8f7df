#!/usr/bin/env bash
# Fetches, on a machine with a package registry, the wheels that bench/gpu_session.sh needs on
# the lent GPU machine, which has no registry: its image (python 3.12, torch, triton,
# transformers, peft, pytest-xdist) lacks the router's packages or has them too old for the
# committed stubs. They land in .whl/ (git-ignored: add `/.whl/` to .git/info/exclude), which
# the session script installs first; name `.whl` in the device tool's `carry`.
#
#     bash bench/gpu_wheels.sh        # ~13 MB; the first GPU session used exactly this list
#
# Versions of the packages the stubs check (grpcio, protobuf) and of pydantic with its core
# follow this checkout's environment (.venv) where it has them, so both sides run the same.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEST=.whl
mkdir -p "$DEST"

pinned() {  # pinned NAME: NAME==the version installed here, or NAME alone
    local version
    version=$("$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p')
    if [ -n "$version" ]; then echo "$1==$version"; else echo "$1"; fi
}

packages=(
    "$(pinned grpcio)" "$(pinned protobuf)" "$(pinned pydantic)" "$(pinned pydantic_core)"
    annotated-types typing-inspection "typing_extensions>=4.15" gguf llguidance
    # The openai client of the LoRA end-to-end test: 2.x needs httpx, which the image has
    # (3.x needs httpx2, which it does not).
    "openai<3" jiter distro sniffio
    # transformers and peft of this checkout (the image's are older: the tests' tiny models
    # follow this version's configs), and `transformers serve`'s web stack, the serving peer.
    "$(pinned transformers)" "$(pinned peft)" fastapi starlette uvicorn opentelemetry-api
)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
    manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
for package in "${packages[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${platforms[@]}" -d "$DEST" "$package"
done
# gemlite (issue 50's int4 kernels at M = 16-64, `bench/int4_kernels_gpu.py --gemlite`) is pure
# Python and Triton, published as a source archive only: built into a wheel here. Its own
# requirements (numpy, tqdm, triton >= 3.6) are on the device image.
python3 -m pip wheel -q --no-deps -w "$DEST" "gemlite==0.6.0.post2"
# The checkout (~42 MB) and these wheels (~31 MB) together pass the 64 MiB the device tool
# carries: the wheels are unpacked and packed again with xz (~15 MB), which gpu_session.sh
# unpacks onto PYTHONPATH (wheels are zip archives; none of these needs an install step).
site=$(mktemp -d)
for wheel in "$DEST"/*.whl; do unzip -q -o "$wheel" -d "$site"; done
tar -cJf "$DEST/site.tar.xz" -C "$site" . && rm -rf "$site" "$DEST"/*.whl
du -sh "$DEST"
