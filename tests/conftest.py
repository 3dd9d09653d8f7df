"""Kernel tests run compiled on a GPU when there is one, else in triton's CPU interpreter.

Triton picks compiler or interpreter when a function is defined, its own standard library
(`tl.zeros`...) included, i.e. when triton is first imported. So TRITON_INTERPRET is set here,
in the conftest pytest loads before collecting any test under tests/: a test module collected
before tests/kernels/ that imports triton would otherwise fix it to the compiler.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
