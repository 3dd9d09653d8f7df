#!/usr/bin/env bash
# Everything the Triton kernels and the GPU serving path need measured on a GPU, in one command
# (a lease is short and every start costs minutes): the kernel tests run compiled (attention,
# W4A16 GEMM, LoRA shrink/expand), the kernel benchmark (LoRA against the base GEMM at batch
# 1-256; attention against SDPA and W4A16 against torch.matmul, with the tile sweep), and the
# server end to end on the GPU against transformers (triton attention), peft (LoRA) and the
# int4 libraries' dequantized models (W4A16).
#
#     bash bench/gpu_session.sh [RESULTS]      # RESULTS defaults to $OUT, else bench/results/gpu
#     ONLY=graph_tests,decode_graphs bash bench/gpu_session.sh    # just those steps
#
# Steps run in order of importance under one deadline (BUDGET_S, default 500 s): each gets at
# most its own limit and what is left, so a slow step costs the later ones, never the whole
# record. Each logs to its own file under RESULTS (at most 8: what the device tool brings back);
# a failing step does not stop the next; the exit status says whether all passed.
#
# Needs python3 with torch (CUDA), triton, pytest, pytest-xdist, transformers, peft. If a `.whl`
# folder is present (packages the machine lacks or has too old: grpcio and protobuf of the
# stubs' versions, pydantic, gguf, llguidance, openai), they are installed first.
set -u
cd "$(dirname "$0")/.."
RESULTS=${1:-${OUT:-bench/results/gpu}}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DEADLINE=$((SECONDS + ${BUDGET_S:-500}))

if [[ -f .whl/site.tar.xz ]]; then  # the wheels unpacked and packed again (bench/gpu_wheels.sh)
    mkdir -p /tmp/site && tar -xJf .whl/site.tar.xz -C /tmp/site &&
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
elif compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

failed=()
step() {  # step NAME LIMIT_S COMMAND...: runs COMMAND, output to RESULTS/NAME.log
    local name=$1 limit=$2
    shift 2
    if [[ -n ${ONLY:-} && ",$ONLY," != *",$name,"* ]]; then
        return
    fi
    local left=$((DEADLINE - SECONDS))
    ((left < limit)) && limit=$left
    if ((limit < 10)); then
        echo "== $name: skipped, the deadline is past"
        failed+=("$name")
        return
    fi
    echo "== $name (at most ${limit}s): $*"
    local start=$SECONDS
    # -k: a step's server processes get TERM with it, then KILL, so none holds the GPU after.
    if timeout -k 10 "$limit" "$@" >"$RESULTS/$name.log" 2>&1; then
        echo "   ok in $((SECONDS - start))s"
    else
        echo "   FAILED (exit $?) after $((SECONDS - start))s; last lines:"
        tail -n 15 "$RESULTS/$name.log" | sed 's/^/   | /'
        failed+=("$name")
    fi
}

PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rfE --durations=8)
# Every test that takes a GPU path (compiled Triton, CUDA graphs, torch's sync debug mode,
# tinygemm), the steps below in one run over the machine's cores: issue 50's, the seam's and
# MoE's (45, 46), speculation's (49), the quantized GEMMs', the hybrids' recurrent layers'.
GPU_TESTS=(tests/shard/test_step_host_syncs.py tests/shard/test_steps_ahead.py
    tests/shard/test_sampling_static.py tests/shard/test_cuda_graphs.py
    tests/shard/test_server_steps.py tests/shard/test_graph_sampling_heads.py
    tests/kernels/test_int4_tinygemm.py tests/kernels/test_int4_dense_path.py
    tests/shard/test_speculative_verify.py tests/shard/test_draft_model.py
    tests/shard/test_speculative_lora.py tests/kernels/test_fused_moe.py
    tests/kernels/test_fused_moe_int4.py tests/kernels/test_models_triton.py
    tests/shard/test_attention_softcap.py tests/shard/test_rotary_partial_longrope.py
    tests/kernels/test_attention_sinks.py tests/kernels/test_quantized_triton.py
    tests/kernels/test_fp8_matmul.py tests/shard/test_gated_delta.py tests/shard/test_ssd.py
    tests/shard/test_quantized_moe.py tests/kernels/test_gpu_compile.py
    tests/kernels/test_kernel_decode.py tests/kernels/test_elementwise_kernels.py
    tests/kernels/test_truncation_floor.py)
step gpu_tests 200 "${PYTEST[@]}" -vv -n 12 --timeout 150 "${GPU_TESTS[@]}"
step env 30 bash -c "nvidia-smi; $PY -c \"import torch, triton, google.protobuf as pb, grpc, \
transformers, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name()); print('triton', triton.__version__, 'protobuf', pb.__version__, \
'grpcio', grpc.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__); \
import switchyard_pb.generate_pb2\""
# Issue 50 first: no synchronisation in a step's launch (torch's sync debug mode, eager and
# replayed), steps queued ahead equal steps on request, the static-shape sampler, tinygemm for
# decode rows, the dense path for many rows; which int4 GEMM per M (tinygemm, our Triton,
# dequantize + cuBLAS, gemlite, and the one the server picks) against dense cuBLAS;
# the decode step against its roofline.
step issue50_tests 170 "${PYTEST[@]}" -n 4 tests/shard/test_step_host_syncs.py \
    tests/shard/test_steps_ahead.py tests/shard/test_sampling_static.py \
    tests/shard/test_cuda_graphs.py tests/shard/test_server_steps.py \
    tests/shard/test_graph_sampling_heads.py tests/kernels/test_int4_tinygemm.py \
    tests/kernels/test_int4_dense_path.py
step int4_kernels 100 "$PY" bench/int4_kernels_gpu.py
# FP8 checkpoints' W8A16 GEMM against dense bf16 and torch's FP8 tensor-core GEMM, per M.
step fp8_kernels 80 "$PY" bench/fp8_kernels_gpu.py
# Issue 50's end-to-end int4 goal: a 7B-shaped AWQ model's graphed batch-1 step >= 1.8x bf16's.
step awq_decode 150 "$PY" -m bench.decode_graphs --shapes 7b,7b-awq --batches 1,16 \
    --sampling greedy --out "$RESULTS"
# gemlite autotunes each (shape, M) on first use: its own step, so it cannot eat the others.
step int4_gemlite 120 "$PY" bench/int4_kernels_gpu.py --gemlite --tokens 1,4,16,32,64
# Greedy and top-p steps, sampled inside the graphs (shard/sampling/graph_heads.py).
step decode_graphs_50 150 "$PY" -m bench.decode_graphs --batches 1,8,64 \
    --sampling greedy,top-p --out "$RESULTS"
# Serving on the device with steps queued ahead and without (issue 50, 2 and 3): the
# SmolLM2-135M shape, random weights, at concurrency 1 and 16 (prepared, not yet run).
step serve_overlap 260 bash -c "for o in off on; do \
    \"$PY\" -m bench.serve --servers switchyard --baseline switchyard --random-weights \
    --ignore-eos --concurrency 1 16 --switchyard-args \"--overlap-schedule \$o\" \
    --out \"$RESULTS/serve_\$o\" | tail -6; done"
# Issue 50, 3: Switchyard against `transformers serve --continuous-batching` at its own
# defaults on the device, a 1B-shaped model (random weights), concurrency 1-32; fixed lengths
# only: transformers takes 30-40 s a level there (the fourth GPU session's run, 254 s, did not
# reach its random-length levels at 16 and 32).
step serve_peer 300 "$PY" -m bench.serve --servers switchyard,transformers --random-weights \
    --random-shape 1b --ignore-eos --concurrency 1 16 32 --datasets fixed \
    --out "$RESULTS/serve_peer"
# Where a 1B step's device time goes, kernel by kernel (issue 50's roofline goal), greedy and
# top-p (the truncate head's sort-free kept floor), batch 1.
step decode_profile 120 "$PY" -m bench.decode_graphs --shapes 1b --batches 1 \
    --sampling greedy,top-p --profile --steps 16 --out "$RESULTS/profile"
# Speculative decoding on the device (issue 49): verify steps (k + 1 decode rows a row, in the
# decode graphs' buckets and their sampling heads) and the draft model's phase (its own
# decode graphs) equal the plain steps, with LoRA too.
step speculation_tests 150 "${PYTEST[@]}" tests/shard/test_speculative_verify.py \
    tests/shard/test_draft_model.py tests/shard/test_speculative_lora.py
# Its benchmark on the device (issue 49, 5): n-gram speculation against none, one run. The
# real demo model cannot be carried (over the 64 MiB the device tool brings), so this is the
# random-weight SmolLM2 shape: its ratios show what a verify step costs against a plain one,
# not the acceptance of real text.
step speculative_bench 200 "$PY" -m bench.speculative --random-weights --concurrency 1 4 \
    --workloads grounded chat --num-prompts 4 --max-tokens 128 --out "$RESULTS"
# The model seam's and MoE's GPU points first (issues 45 and 46): soft-capped prefill/decode,
# partial/longrope rotary, whole new-architecture models with Triton (gpt-oss's sinks and
# biased experts too), the fused MoE kernel compiled and captured in a CUDA graph, MoE models in
# decode graphs; then its benchmark.
step seam_moe_tests 150 "${PYTEST[@]}" tests/kernels/test_fused_moe.py \
    tests/kernels/test_fused_moe_int4.py tests/kernels/test_models_triton.py tests/shard/test_attention_softcap.py \
    tests/shard/test_rotary_partial_longrope.py tests/shard/test_cuda_graphs.py \
    tests/kernels/test_attention_sinks.py -k "not adapter"
step moe_bench 90 "$PY" bench/moe_kernel_gpu.py
step graph_tests 120 "${PYTEST[@]}" tests/shard/test_cuda_graphs.py \
    tests/kernels/test_elementwise_kernels.py tests/kernels/test_kernel_decode.py \
    -k "graphs or per_sequence or elementwise"
step decode_graphs 200 "$PY" -m bench.decode_graphs --out "$RESULTS"
step kernel_tests 150 "${PYTEST[@]}" -n 4 tests/kernels
step kernel_bench_lora 60 "$PY" bench/kernels.py --only lora
step kernel_bench 110 "$PY" bench/kernels.py --sweep --only decode,prefill,kv_write,w4a16
step triton_end_to_end 80 "${PYTEST[@]}" integration-tests/test_triton_attention.py
step lora_end_to_end 120 "${PYTEST[@]}" integration-tests/test_lora_serving.py
# Quantized checkpoints through the Triton GEMMs on the device: int4 and FP8 (real e4m3
# conversions on sm_89+), whole models and kernel shapes.
step quant_triton 80 "${PYTEST[@]}" tests/kernels/test_quantized_triton.py \
    tests/kernels/test_fp8_matmul.py

if ((${#failed[@]})); then
    echo "failed steps: ${failed[*]} (logs in $RESULTS)"
    exit 1
fi
echo "all steps passed (logs in $RESULTS)"
