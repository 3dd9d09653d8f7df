"""Which arithmetic the native attention kernels run (shard/platforms/cpu/native/): AVX-512 where
the build targets it, AVX2 on other x86-64 CPUs with it (attention_avx2.cpp), scalar loops
elsewhere. The decode and prefill tests run the path this CPU has; with SWITCHYARD_CPU_AVX2=0
an AVX2 CPU takes the scalar path instead, so its tests run here again in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paged_helpers import needs_native_kernel

from shard.platforms.cpu.native import build

HERE = Path(__file__).parent


def _cpu_has_avx2() -> bool:
    return {"avx2", "fma", "f16c"} <= build._cpu_flags()


@needs_native_kernel
def test_the_kernels_take_the_widest_path_this_cpu_and_build_have():
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        want = "avx512"
    elif _cpu_has_avx2():
        want = "avx2"
    else:
        want = "scalar"
    assert build.attention_path() == want


@needs_native_kernel
@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability().startswith("AVX512") or not _cpu_has_avx2(),
    # The same on a GPU machine: the switch matters only where the CPU's build is the AVX2 one.
    reason="only an AVX2 build has a scalar path behind the switch; this CPU's tests ran its own",
)
def test_the_scalar_path_of_cpus_without_avx2():
    env = {**os.environ, build.AVX2_ENV: "0"}
    probe = subprocess.run(
        [sys.executable, "-c", "from shard.platforms.cpu.native import build; "
         "print(build.attention_path(), build.rows_linear_kernel())"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert probe.stdout.split() == ["scalar", "None"], probe.stdout + probe.stderr[-2000:]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(HERE / "test_cpu_paged_decode.py"), str(HERE / "test_cpu_paged_prefill.py"),
         "-k", "float64 and not float16"],
        env=env, capture_output=True, text=True, timeout=600, cwd=HERE.parent.parent,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout.splitlines()[-1], run.stdout[-2000:]
