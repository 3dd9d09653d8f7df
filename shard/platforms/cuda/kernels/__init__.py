"""Triton kernels for attention: KV-cache write, varlen prefill, paged decode (+ split-K reduce).

Importing a kernel module imports triton, and triton decides between compiling and its CPU
interpreter when a kernel is *defined*: TRITON_INTERPRET=1 must be in the environment before the
first import of any module here.
"""

from __future__ import annotations

import torch
import triton


def interpreting() -> bool:
    """True when triton runs kernels in its numpy interpreter (TRITON_INTERPRET=1)."""
    return bool(triton.knobs.runtime.interpret)


def check_device(*tensors: torch.Tensor) -> None:
    """Compiled kernels need CUDA tensors and the interpreter needs CPU ones; mixing them fails
    deep inside triton with an unhelpful message, so say it here instead."""
    want = "cpu" if interpreting() else "cuda"
    for t in tensors:
        if t.device.type != want:
            hint = (
                "TRITON_INTERPRET=1 runs kernels on CPU tensors only"
                if interpreting()
                else "without TRITON_INTERPRET=1 triton kernels need CUDA tensors"
            )
            raise ValueError(f"tensor on {t.device} given to a triton kernel: {hint}")


def head_block(head_dim: int) -> int:
    """Head dims that are not a power of two (80, 96) are padded to the next one and masked;
    tl.dot wants at least 16 along every dimension."""
    return max(16, triton.next_power_of_2(head_dim))


def dot_options(dtype: torch.dtype) -> dict[str, object]:
    """Compile-time options for the tl.dot calls of the attention kernels, for inputs of `dtype`.

    DOT_PRECISION: fp32 models are served in fp32 to match a fp32 reference; TF32 (triton's
    default for fp32 on NVIDIA) would quietly drop both matmuls to a 10-bit mantissa. None, the
    backend's default, for 16-bit inputs, where the option does not apply.
    DOT_UPCAST: the interpreter's tl.dot multiplies the raw uint16 bit patterns of bfloat16
    operands (triton-lang/triton#11584, not supported upstream), so under the interpreter bf16
    tiles are widened to fp32 just for the matmuls. They are rounded to bf16 first, so the
    products are the exact bf16 products a tensor core forms; on a GPU this is always off.
    """
    return {
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else None,
        "DOT_UPCAST": interpreting() and dtype == torch.bfloat16,
    }
