"""`--compile`: the model's forward pass through torch.compile (inductor), on the CPU.

Why: an eager CPU decode step of the SmolLM2-135M shape is ~1,600 torch calls (~53 a layer:
norms, rotary, residual adds, SiLU and mul, views, the KV write) at 5-10 us each, as long as
its 121 GEMMs; a 1,024-token prefill step spends as long in bf16 elementwise passes as in its
GEMMs (docs/benchmarks.md). Inductor fuses those chains into C++ loops, and with `freezing` it
packs the (constant) weights for oneDNN itself, as shard/layers/matmul.py does in eager mode.

How the forward pass becomes one graph with no model file changing:
- Attention (store K/V, then the backend's prefill/decode/mixed path, which depends on the
  step's metadata: Python lists, per-sequence loops) runs as one opaque custom op,
  `switchyard::attend`, that reads the step's metadata from `_STEP`, set around each call.
  The graph's inputs are only the token ids, positions and KV caches, so prefill, decode and
  mixed steps of any size share one graph. `shard.attention.backend.attend` switches to the op
  while compiling.
- A linear's LoRA term (shard/layers/lora.py) is another opaque op, `switchyard::lora`, that
  calls the term itself: the adapters' slots, filled and refilled at runtime, and the step's
  token -> slot mapping stay outside the graph (a frozen graph would keep the slots it first
  saw), so adapters come and go without a recompilation.
- Dense linears hand inductor plain weights (`DenseWeight.unpack`), which `matmul.linear`
  multiplies with F.linear while compiling; rotary skips its eager-only shortcuts
  (shard/layers/rotary.py).
- Shapes are dynamic in the token count. torch specialises a size of 1, so one-token steps get
  a second graph: `warm_up` compiles both before the shard reports ready.

Scope: one shard (no collective in the graph), dense weights, the torch attention backend,
the CPU. Anything else is refused at startup with a message naming the flag
(`check_supported`); a feature we cannot honour is an error, not a silent eager fallback.
"""

from __future__ import annotations

import itertools
import shutil
import threading
import weakref
from collections.abc import Callable

import torch
import torch._inductor.config

from shard.attention import AttentionBackend, StepMetadata


class _Step(threading.local):
    backend: AttentionBackend | None = None
    meta: StepMetadata | None = None


_STEP = _Step()


# Defined through torch.library.Library rather than the @custom_op decorator: the decorator's
# Python dispatch (aliasing checks, the mutated input's bookkeeping) cost ~65 us a call, 30 a
# step (bench/profile_decode.py --compile: the op's own time fell from 154 to 89 us a call).
_LIBRARY = torch.library.Library("switchyard", "DEF")
_LIBRARY.define(
    "attend(Tensor q, Tensor k, Tensor v, Tensor(a!) kv_cache, float scale, int window) -> Tensor"
)


def _attend_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    scale: float,
    window: int,
) -> torch.Tensor:
    from shard.attention.backend import attend

    if _STEP.backend is None or _STEP.meta is None:
        raise RuntimeError("switchyard::attend called outside a compiled forward pass")
    return attend(_STEP.backend, q, k, v, kv_cache, _STEP.meta, scale, window or None)


_LIBRARY.impl("attend", _attend_impl, "CPU")


@torch.library.register_fake("switchyard::attend")
def _(q, k, v, kv_cache, scale, window):  # type: ignore[no-untyped-def]
    return torch.empty_like(q)


_attend_op = torch.ops.switchyard.attend.default


def attend_in_graph(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """What `attend` becomes inside the compiled graph (window 0: none)."""
    return _attend_op(q, k, v, kv_cache, scale, window or 0)


_LIBRARY.define("lora(Tensor x, Tensor(a!) y, int term) -> ()")
# The LoRA terms the op can name, by the id each got at construction: the graph holds ints,
# not the terms, and a shard that is gone leaves no term alive here.
_LORA_TERMS: weakref.WeakValueDictionary[int, Callable] = weakref.WeakValueDictionary()
_LORA_IDS = itertools.count()


def register_lora_term(term: Callable) -> int:
    """An id under which `lora_in_graph` reaches `term` (called as term(x, y))."""
    term_id = next(_LORA_IDS)
    _LORA_TERMS[term_id] = term
    return term_id


def _lora_impl(x: torch.Tensor, y: torch.Tensor, term: int) -> None:
    _LORA_TERMS[term](x, y)  # eager here: the term's own torch path, on this step's slots


_LIBRARY.impl("lora", _lora_impl, "CPU")


@torch.library.register_fake("switchyard::lora")
def _(x, y, term):  # type: ignore[no-untyped-def]
    return None


_lora_op = torch.ops.switchyard.lora.default


def lora_in_graph(x: torch.Tensor, y: torch.Tensor, term: int) -> None:
    """What a LoRA term becomes inside the compiled graph: y += the term, in place."""
    _lora_op(x, y, term)


def check_supported(
    *, world_size: int, device: torch.device, attention: str, quantized: bool
) -> None:
    """Raises ValueError naming --compile and the reason when this shard cannot compile."""
    reasons = []
    if device.type != "cpu":
        reasons.append(f"it is implemented for the CPU only (device {device.type})")
    if world_size > 1:
        reasons.append(f"it runs one shard only (--num-shard {world_size})")
    if attention != "torch":
        reasons.append(f"it needs the torch attention backend (--attention {attention})")
    if quantized:
        reasons.append("quantized checkpoints are not supported with it")
    if device.type == "cpu" and not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
        reasons.append("inductor builds C++ kernels and no C++ compiler is on PATH")
    if reasons:
        raise ValueError("--compile: " + "; ".join(reasons))


class CompiledForward:
    """Callable like the model: (input_ids, positions, kv_caches, meta) -> hidden states."""

    def __init__(self, model: torch.nn.Module, backend: AttentionBackend) -> None:
        from shard.layers.quant.unquantized import DenseWeight

        for module in model.modules():
            if isinstance(module, DenseWeight):
                module.unpack()
        self.backend = backend
        # freezing: weights are constants of the graph, which lets inductor pack them for
        # oneDNN (its weight-prepack pass) instead of multiplying unpacked bf16 weights (a
        # 16-row decode step 13% slower). Set process-wide: torch.compile's `options` did not
        # reach the lazy compilation of the first call (measured), and a shard compiles only this.
        torch._inductor.config.freezing = True
        self._forward: Callable = torch.compile(model.forward, dynamic=True)

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: StepMetadata,
    ) -> torch.Tensor:
        _STEP.backend, _STEP.meta = self.backend, meta
        try:
            # meta stays out of the graph (the op reads it from _STEP), so its Python
            # contents never become guards that would recompile per step kind.
            return self._forward(input_ids, positions, kv_caches, None)
        finally:
            _STEP.meta = None
