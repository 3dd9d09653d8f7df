"""The operations table every platform fills: each returns its kernel's result, or None where the
platform has none for these inputs (the caller then computes the torch reference form)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from shard.platforms import grouped_moe, host_memory

if TYPE_CHECKING:
    from shard.kv_cache import KvCacheSettings


class Platform:
    name = "torch"
    # the collective backend of its process group, and the attention backend a shard takes
    # when --attention is not given
    dist_backend = "gloo"
    default_attention = "torch"
    # The int4 GEMM of shard/layers/quant/int4_linear.py this platform runs: "cpu" (torch's CPU
    # int4 kernel), "triton" (the Triton W4A16 GEMM), "tinygemm+triton" (torch's CUDA int4
    # kernel for decode-sized row counts, Triton beyond), None (dequantize + GEMM); and `--dtype
    # auto` for an int4 checkpoint where that kernel takes one activation dtype only (None: the
    # checkpoint's dtype).
    int4_kernel: str | None = None
    int4_activation_dtype: torch.dtype | None = None
    # The FP8 GEMM of shard/layers/quant/fp8_linear.py: "triton" (the W8A16 GEMM over the FP8
    # weight), None (the weight dequantized at load for the dense GEMM).
    fp8_kernel: str | None = None
    # The kernel of `fused_moe`: "triton" (shard/platforms/cuda/kernels/fused_moe.py, which
    # takes int4 experts stacked, shard/platforms/int4_experts.py), None (grouped GEMMs in torch,
    # which take int4 experts as one int4 linear each).
    moe_kernel: str | None = None
    # Whether a step's work on this device must keep every shape fixed by the batch alone: no
    # row subset chosen by the data (`nonzero`, a boolean index, a loop until a check holds),
    # since choosing one reads the device from the host, which stalls the host on everything
    # queued before it, and a CUDA graph cannot hold it. Where the host is the device, reading
    # it costs nothing and the sampler takes its data-dependent shortcuts.
    static_shapes = False
    # Whether host buffers bound for the device are page-locked, so one copy of a step's
    # inputs runs without the host waiting for it (`upload`).
    pinned_uploads = False
    # Whether the device computes apart from the host, so that queuing the next decode step
    # before the router asks for it overlaps the two (shard/steps_ahead.py): the default of
    # --overlap-schedule.
    overlaps_steps = False

    # -- the process and its memory ------------------------------------------------------

    def bind(self, device: torch.device, local_rank: int) -> torch.device:
        """The device this process computes on, made current where the platform has that."""
        return device

    def threads(self, world_size: int) -> None:
        """Sizes the host's thread pool for `world_size` shards on one machine."""

    def warm(self, attention: str) -> None:
        """Builds (or finds) the kernels a shard needs before it reports ready."""

    def check_alive(self, device: torch.device) -> None:
        """Raises if the device is gone (Health)."""

    def reset_peak_memory(self, device: torch.device) -> None:
        """Starts measuring the peak memory a warmup step takes."""

    def release_cached_memory(self, device: torch.device) -> None:
        """Returns memory the allocator keeps but nothing holds."""

    def kv_cache_budget(
        self, device: torch.device, settings: KvCacheSettings, reserved_bytes: int
    ) -> tuple[float, float]:
        """(bytes the KV cache may take by default, the most it can take at all): host memory,
        a share of what the OS reports available (shard/platforms/host_memory.py says why) or the
        --cpu-kv-cache-gb budget."""
        available = host_memory.available_host_memory()
        if settings.cpu_kv_cache_gb is not None:
            return settings.cpu_kv_cache_gb * host_memory.GIB, available
        share = available * host_memory.CPU_DEFAULT_SHARE
        return min(share, host_memory.CPU_DEFAULT_CAP_BYTES), available

    # -- host <-> device -------------------------------------------------------------------

    def host_buffer(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """An empty host tensor for inputs bound for this device (page-locked where uploads
        are: a pinned buffer is copied without the host waiting, and torch's caching host
        allocator reuses it once that copy is done)."""
        return torch.empty(numel, dtype=dtype, pin_memory=self.pinned_uploads)

    def upload(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        """`host` on `device`: one copy, queued without waiting where it is pinned; the same
        tensor where the device is the host."""
        return host.to(device, non_blocking=self.pinned_uploads)

    # -- operations ----------------------------------------------------------------------

    def prepare_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """`weight` [out, in] in the layout `linear` multiplies fastest here (a new tensor where
        it is repacked, so a weight shared with an embedding keeps its rows)."""
        return weight

    def dense(self, weight: torch.Tensor) -> torch.Tensor:
        """The plain [out, in] tensor behind a weight `prepare_weight` returned."""
        return weight

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x @ weight.T + bias for a weight `prepare_weight` returned."""
        return F.linear(x, weight, bias)

    def gated_linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str
    ) -> torch.Tensor | None:
        """act(gate) * up of a fused gate_up product in one kernel (the activation in its
        epilogue), for a weight `prepare_weight` returned; None where there is none."""
        return None

    def lora_kernel(self) -> Callable[..., None] | None:
        """A kernel adding small steps' LoRA terms, all slots in one call
        (shard/layers/lora.py: LoraStep.native), or None: torch's GEMMs."""
        return None

    def lora_tile_kernel(
        self, weight: torch.Tensor, out_slices: tuple[int, ...]
    ) -> Callable[..., torch.Tensor] | None:
        """A kernel computing a linear's product and its LoRA terms in one call for a weight
        `prepare_weight` returned (shard/layers/lora.py: LoraTerm.linear), or None."""
        return None

    def lora_tiles(self, lora_a: torch.Tensor, lora_b: torch.Tensor, rank: int) -> Any:
        """A term's slots in the layout `lora_tile_kernel`'s kernel reads (with .a, .b, .rank
        and .refill(slot, lora_a, lora_b))."""
        raise NotImplementedError(f"{self.name} has no LoRA tile kernel")

    def fused_moe(
        self,
        x: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        act: str,
        **extras: Any,
    ) -> torch.Tensor:
        """The experts of a Mixture-of-Experts MLP over one step's tokens: for each token t and
        each of its k choices e = topk_ids[t, k] (-1: an expert another rank holds, skipped),
        topk_weights[t, k] * w2[e] @ act(gate) * up, with [gate; up] = w13[e] @ x[t], summed
        over k. x [T, H]; w13 [E, 2I, H] (gate rows first); w2 [E, H, I]; topk_weights [T, K]
        float32; topk_ids [T, K] int32; `act` a name of shard/layers/activation.py's table, or
        CLAMPED_SWIGLU (shard/platforms/activations.py). `extras`, keyword-only: w13_bias
        [E, 2I] and w2_bias [E, H] (added to their products; None: none), swiglu_alpha and
        swiglu_limit (CLAMPED_SWIGLU's parameters), gated (False: ungated experts, Nemotron 3's,
        w13 [E, I, H] the up projection alone and act(up) of MLP_ACTIVATIONS in place of
        act(gate) * up).
        Here: grouped GEMMs, each expert once over the rows routed to it."""
        return grouped_moe.grouped_experts(
            x, w13, w2, topk_weights, topk_ids, act, swiglu=self.swiglu, **extras
        )

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
        """x * rsqrt(mean(x^2) + eps), rounded to x's dtype, times weight (Llama's rounding)."""
        return None

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rms_norm(x + residual), x + residual), the sum rounded to the dtype first."""
        return None

    def silu_and_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of two [T, I] halves."""
        return None

    def swiglu(self, product: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of a fused gate_up product [T, 2I] (gate first)."""
        return None

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        joint: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """q [T, H, D] and k [T, Hkv, D] rotated by the neox tables (whole-head width, or the
        rotated leading dims only) at table rows `rows`; `joint`: q and k as one [T, H + Hkv, D]
        view where k's heads follow q's in the same rows (the fused qkv product), else None."""
        return None

    def truncation_floor(
        self, x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
    ) -> torch.Tensor | None:
        """Each row's smallest logit [R] that top-k, top-p and min-p keep of tempered float32
        logits x [R, V] (top_k [R] int64, 0: off; top_p [R], 1: off; min_p [R], 0: off), as
        shard/sampling/truncation.py: kept_floor computes it by a sort."""
        return None

    def argmax(self, x: torch.Tensor) -> torch.Tensor | None:
        """Row-wise argmax of [N, V] float32 logits, first index on ties, as torch.argmax."""
        return None
