# CPU image by default. For NVIDIA GPUs pick a CUDA build of torch, e.g.
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t switchyard:cuda .
# (the wheels bring the CUDA runtime; the host needs the NVIDIA driver and container toolkit).
# deploy/ runs switchyard:cuda; README ("Container image") shows how to run either.
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# Every cache the server writes is under /data (the rest goes to /tmp), so that the root
# filesystem can be read-only (deploy/).
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/data/huggingface \
    SWITCHYARD_CACHE=/data/switchyard \
    TORCH_EXTENSIONS_DIR=/data/torch_extensions \
    TRITON_CACHE_DIR=/data/triton

# A compiler at runtime: Triton builds a small C helper on GPUs; on CPUs the shard builds its
# native kernels once (shard/platforms/cpu/native/build.py, kept under
# TORCH_EXTENSIONS_DIR on the volume) and `--compile` (inductor) builds C++ kernels. Unpinned: the base image's Debian release fixes their versions.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends g++ libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# torch first and alone: its layer is the big one and changes least often.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY switchyard_pb ./switchyard_pb
COPY launcher ./launcher
COPY router ./router
COPY shard ./shard
RUN pip install . && useradd --create-home --uid 1000 switchyard \
    && mkdir -p /data && chown switchyard /data

# By uid: Kubernetes' runAsNonRoot can only check a numeric user.
USER 1000
VOLUME /data
EXPOSE 3000
# For `docker run` (Kubernetes uses deploy/'s probes): healthy once every shard answers. The
# start period covers a first download. It asks port 3000: a `--port` given to `docker run`
# leaves it failing.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30m \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:3000/health', timeout=4)"]
ENTRYPOINT ["launcher", "--hostname", "0.0.0.0", "--port", "3000"]
