"""Kernel tests run compiled on a GPU when there is one, else in triton's CPU interpreter.

Triton picks compiler or interpreter when a kernel is defined, i.e. when shard.kernels is first
imported, so TRITON_INTERPRET is set here, before any test module imports the kernels.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
