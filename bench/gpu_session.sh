#!/usr/bin/env bash
# Everything the Triton kernels need measured on a GPU, in one command (a GPU lease is short and
# every start costs minutes): the kernel tests run compiled (attention and the W4A16 GEMM), every
# kernel variant compiled for the device, the kernel benchmark with the tile sweep (attention
# against SDPA, W4A16 against torch.matmul on Llama-2-7B's layers), and the server end to end
# with `--attention triton` on the GPU. Each step logs to its own file under RESULTS and a failing
# step does not stop the next ones; the exit status says whether all passed.
#
#     bash bench/gpu_session.sh [RESULTS]      # RESULTS defaults to $OUT, else bench/results/gpu
#
# Needs python3 with torch (CUDA), triton, pytest, transformers, grpcio, protobuf, aiohttp,
# safetensors. If a `.whl` folder is present (packages the machine lacks or has too old, e.g.
# protobuf older than the one switchyard_pb was generated with), they are installed first.
set -u
cd "$(dirname "$0")/.."
RESULTS=${1:-${OUT:-bench/results/gpu}}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

failed=()
step() {  # step NAME COMMAND...: runs COMMAND, output to RESULTS/NAME.log
    local name=$1
    shift
    echo "== $name: $*"
    if "$@" >"$RESULTS/$name.log" 2>&1; then
        echo "   ok"
    else
        echo "   FAILED (exit $?); last lines:"
        tail -n 15 "$RESULTS/$name.log" | sed 's/^/   | /'
        failed+=("$name")
    fi
}

step device nvidia-smi
step versions "$PY" -c "import torch, triton, google.protobuf as pb, grpc, transformers; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name()); \
print('triton', triton.__version__, 'protobuf', pb.__version__, 'grpcio', grpc.__version__, \
'transformers', transformers.__version__); import switchyard_pb.generate_pb2"
step kernel_tests "$PY" -m pytest -q -p no:cacheprovider tests/kernels
step compile_all "$PY" tests/kernels/gpu_compile.py --all
step kernel_bench "$PY" bench/kernels.py --sweep
step triton_end_to_end "$PY" -m pytest -q -p no:cacheprovider \
    integration-tests/test_triton_attention.py

cat "$RESULTS/kernel_bench.log" 2>/dev/null
if ((${#failed[@]})); then
    echo "failed steps: ${failed[*]} (logs in $RESULTS)"
    exit 1
fi
echo "all steps passed (logs in $RESULTS)"
