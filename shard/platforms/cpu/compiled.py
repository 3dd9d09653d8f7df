"""`--compile`: the model's forward pass through torch.compile (inductor), on the CPU.

Why: an eager CPU decode step of the SmolLM2-135M shape is ~1,600 torch calls (~53 a layer:
norms, rotary, residual adds, SiLU and mul, views, the KV write) at 5-10 us each, as long as
its 121 GEMMs; a 1,024-token prefill step spends as long in bf16 elementwise passes as in its
GEMMs (docs/benchmarks.md). Inductor fuses those chains into C++ loops, and with `freezing` it
packs the (constant) weights for oneDNN itself, as shard/platforms/cpu/matmul.py does in eager mode.

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
- Shapes are dynamic in the token count. torch specialises a size of 1, so one-token steps
  are padded to two rows (the ops skip the pad row) rather than compiled apart.
- GEMMs are autotuned (inductor's `max_autotune`): for each product inductor times oneDNN
  against its own C++ GEMM template (AMX/AVX-512 micro-kernels on the frozen, pre-packed
  weights) and keeps the faster. The template wins at decode sizes (the 30 layers' GEMMs of a
  16-row step 13.2 -> 9.8 ms here, one row 12.2 -> ~8 ms) and oneDNN at a long prefill's, and
  the choice is made at the size a graph is first compiled for, so steps of up to
  `SMALL_STEP_TOKENS` tokens and larger ones run two graphs, each compiled at a size of its
  class. The shard's Warmup compiles both before it reports ready (`warm_up`).

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

from shard.attention import AttentionBackend, StepMetadata, attend
from shard.attention.backend import register_graph_attend


class _Step(threading.local):
    backend: AttentionBackend | None = None
    meta: StepMetadata | None = None


_STEP = _Step()


# Defined through torch.library.Library rather than the @custom_op decorator: the decorator's
# Python dispatch (aliasing checks, the mutated input's bookkeeping) cost ~65 us a call, 30 a
# step (bench/profile_decode.py --compile: the op's own time fell from 154 to 89 us a call).
_LIBRARY = torch.library.Library("switchyard", "DEF")
# window 0: none; softcap 0: none; chunk 0: none (the schema has no optional scalars worth their
# cost here); sinks: gpt-oss's per-head attention sinks, or None; alibi: ALiBi's per-head
# slopes (BLOOM, MPT), or None.
_LIBRARY.define(
    "attend(Tensor q, Tensor k, Tensor v, Tensor(a!) kv_cache, float scale, int window, "
    "float softcap, Tensor? sinks, int chunk, Tensor? alibi) -> Tensor"
)


def _attend_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
    sinks: torch.Tensor | None,
    chunk: int,
    alibi: torch.Tensor | None,
) -> torch.Tensor:
    if _STEP.backend is None or _STEP.meta is None:
        raise RuntimeError("switchyard::attend called outside a compiled forward pass")
    backend, meta, n = _STEP.backend, _STEP.meta, _step_tokens()
    cap = softcap or None
    if kv_cache.shape[0] == 1:  # a one-plane cache (values = keys), as the graph holds it
        kv_cache = kv_cache.expand(2, *kv_cache.shape[1:])
    if q.shape[0] == n:
        return attend(
            backend, q, k, v, kv_cache, meta, scale, window or None, cap, sinks,
            chunk=chunk or None, alibi=alibi,
        )  # fmt: skip
    out = torch.zeros_like(q)  # a padded one-token step: the pad row attends to nothing
    out[:n] = attend(
        backend, q[:n], k[:n], v[:n], kv_cache, meta, scale, window or None, cap, sinks,
        chunk=chunk or None, alibi=alibi,
    )  # fmt: skip
    return out


def _step_tokens() -> int:
    """The step's real token count: the graph's inputs may carry a pad row after them
    (CompiledForward pads one-token steps to two)."""
    assert _STEP.meta is not None
    return _STEP.meta.slot_mapping.shape[0]


_LIBRARY.impl("attend", _attend_impl, "CPU")


@torch.library.register_fake("switchyard::attend")
def _(q, k, v, kv_cache, scale, window, softcap, sinks, chunk, alibi):  # type: ignore[no-untyped-def]
    return torch.empty_like(q)


_attend_op = torch.ops.switchyard.attend.default


def _attend_in_graph(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    scale: float,
    window: int | None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    chunk: int | None = None,
    alibi: torch.Tensor | None = None,
) -> torch.Tensor:
    """What `attend` becomes inside the compiled graph (window, softcap, chunk 0: none)."""
    return _attend_op(
        q, k, v, kv_cache, scale, window or 0, float(softcap or 0.0), sinks, chunk or 0, alibi
    )


register_graph_attend(_attend_in_graph)


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
    n = _step_tokens()
    if x.shape[0] != n:  # a padded one-token step; y[:n] is a view, so the term adds into y
        x, y = x[:n], y[:n]
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
    *,
    world_size: int,
    device: torch.device,
    attention: str,
    quantized: bool,
    experts: bool = False,
    recurrent: bool = False,
    sparse_attention: bool = False,
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
    if experts:
        # the grouped experts' shapes follow each step's routing: a graph per routing
        reasons.append("Mixture-of-Experts models are not supported with it")
    if recurrent:
        # prompt chunks run per sequence from host lengths, and the states update in place
        reasons.append("models with linear attention (Qwen3.5) are not supported with it")
    if sparse_attention:
        # which tokens a layer reads follows each step's lengths and its indexer's scores
        reasons.append("sparse attention (DeepSeek-V3.2's, GLM-5's) is not supported with it")
    if device.type == "cpu" and not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")):
        reasons.append("inductor builds C++ kernels and no C++ compiler is on PATH")
    if reasons:
        raise ValueError("--compile: " + "; ".join(reasons))


# Steps of at most this many tokens (decode, chunked mixed steps) run the graph compiled at a
# decode size; the template chosen there stayed at least as fast as oneDNN up to 512 rows and
# lost to it at 2,048 (measured, this CPU).
SMALL_STEP_TOKENS = 512
# A decode step's typical row count: the size the small-step graph is first compiled at.
DECODE_SIZED_WARMUP_TOKENS = 16


# Two functions, not one: dynamo keeps its graphs per code object, so each size class needs
# its own for its first compilation to happen at a size of that class.
def _small_step(forward: Callable, *args: object) -> torch.Tensor:
    return forward(*args)


def _large_step(forward: Callable, *args: object) -> torch.Tensor:
    return forward(*args)


def _configure_inductor() -> None:
    """Process-wide: torch.compile's `options` did not reach the lazy compilation of the
    first call (measured), and a shard compiles nothing else. Imported here, not at the top:
    inductor takes ~2.5 s to import, which every shard would pay at startup for a flag it
    rarely has (the custom ops above need only torch.library)."""
    import torch._inductor.config
    import torch.fx.experimental._config

    config = torch._inductor.config
    # freezing: weights are constants of the graph, which lets inductor pack them for oneDNN
    # (its weight-prepack pass) and its GEMM template, instead of multiplying unpacked bf16
    # weights (a 16-row decode step 13% slower).
    config.freezing = True
    config.max_autotune = True
    config.max_autotune_gemm_backends = "CPP,ATEN"
    # The timing tables go to stderr for every GEMM: not a shard log's business.
    config.autotune_num_choices_displayed = 0
    config.max_autotune_report_choices_stats = False
    # No "duck sizing": a step whose token count happens to equal a KV cache dimension (the
    # block size, 16 by default, is also the decode-sized warm-up step's) would otherwise
    # compile a graph that assumes the two equal, and the next step would compile another.
    torch.fx.experimental._config.use_duck_shape = False


class CompiledForward:
    """Callable like the model: (input_ids, positions, kv_caches, meta) -> hidden states."""

    def __init__(self, model: torch.nn.Module, backend: AttentionBackend) -> None:
        from shard.layers.quant.unquantized import DenseWeight

        for module in model.modules():
            if isinstance(module, DenseWeight):
                module.unpack()
        self.backend = backend
        _configure_inductor()
        self._model_forward = model.forward
        self._small: Callable = torch.compile(_small_step, dynamic=True)
        self._large: Callable = torch.compile(_large_step, dynamic=True)
        # None until warm_up has compiled the large-step graph: every step runs the small one.
        self._small_step_tokens: int | None = None

    def warm_up(
        self, worst_case: Callable[[], None], first_tokens: Callable[[int], None], worst_tokens: int
    ) -> None:
        """Compiles every graph a step can reach before the shard serves, so that no request
        waits on a compilation: `first_tokens(n)` runs an n-token step, `worst_case()` the
        router's worst-case prefill of `worst_tokens` tokens.

        The small-step graph is compiled first, at a decode step's size, since inductor
        autotunes its GEMMs at that size. When the worst case fits in the small class, steps
        of any size run the small graph (a mixed step's decode rows can take it past the
        class), and the large one is never compiled."""
        self._small_step_tokens = None
        first_tokens(DECODE_SIZED_WARMUP_TOKENS)
        if worst_tokens > SMALL_STEP_TOKENS:
            self._small_step_tokens = SMALL_STEP_TOKENS
        worst_case()

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: StepMetadata,
    ) -> torch.Tensor:
        tokens = input_ids.shape[0]
        if tokens == 1:
            # torch specialises a size of 1, so a one-token step (a lone request decoding)
            # would compile a graph of its own (~45 s more startup for its autotuning); padded
            # to two rows it runs the small-step graph, the ops skipping the pad row.
            input_ids, positions = input_ids.repeat(2), positions.repeat(2)
        _STEP.backend, _STEP.meta = self.backend, meta
        try:
            # meta stays out of the graph (the op reads it from _STEP), so its Python
            # contents never become guards that would recompile per step kind.
            limit = self._small_step_tokens
            step = self._small if limit is None or tokens <= limit else self._large
            # A cache whose values are its keys is a stride-0 view of one plane
            # (shard/models/base.py); a graph input the attend op writes into must not overlap
            # itself, so the graph gets the plane and the op expands it again.
            planes = [c[:1] if c.stride(0) == 0 else c for c in kv_caches]
            return step(self._model_forward, input_ids, positions, planes, None)[:tokens]
        finally:
            _STEP.meta = None
