"""Which int4 GEMM a layer gets (shard/layers/quant/int4_linear.py int4_weight): the platform's,
and the Triton GEMM for the Triton attention backend only where the platform's is not Triton's.

A GPU's default attention backend is Triton, so a choice keyed on the backend alone gave every
GPU model the Triton GEMM and never tinygemm, its decode kernel: a 7B AWQ model decoded at
0.52x its bf16 model on the H200 (docs/benchmarks.md, the fourth GPU session)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import shard.layers.quant.int4_linear as int4_linear


@pytest.fixture
def chosen(monkeypatch):
    """int4_weight(platform kernel, triton) -> the class it built, by name."""

    def choose(platform_kernel: str, triton: bool) -> str:
        platform = SimpleNamespace(int4_kernel=platform_kernel)
        monkeypatch.setattr(int4_linear, "platform_of", lambda device: platform)
        for name in ("CudaInt4", "TritonInt4", "CpuInt4", "DequantizingInt4"):
            monkeypatch.setattr(int4_linear, name, lambda *args, name=name: name)
        monkeypatch.setattr(int4_linear.tinygemm, "group_size", lambda qw: 128)
        qw = SimpleNamespace(qweight=torch.zeros(1, dtype=torch.int32))
        return int4_linear.int4_weight(qw, torch.bfloat16, triton)

    return choose


def test_a_gpu_keeps_tinygemm_under_either_attention_backend(chosen):
    assert chosen("tinygemm+triton", triton=True) == "CudaInt4"
    assert chosen("tinygemm+triton", triton=False) == "CudaInt4"


def test_the_cpu_runs_the_triton_gemm_only_for_the_triton_backend(chosen):
    assert chosen("cpu", triton=True) == "TritonInt4"
    assert chosen("cpu", triton=False) == "CpuInt4"
