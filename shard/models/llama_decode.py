"""The Llama family's decode step on the CPU, eager mode, as a flat loop of native kernel calls.

Why: a decode step's kernels are short (a 16-row step of the SmolLM2 shape: ~13 ms for 30
layers), and the module forward wraps each in layers of Python: nn.Module calls, per-call
eligibility checks (dtype, device, strides, storage identity), views and splits, about 150 us
a layer, ~4.5 ms a step. Those checks depend only on the model, so this path makes them once,
when it is built, and keeps for each layer the tensors and kernels its forward ends up calling.
It is to the CPU decode step what a captured CUDA graph is to a GPU one: the same kernels, in
the same order, on the same inputs, without the Python around them.

It computes exactly what LlamaForCausalLM.forward computes (tests/shard/test_llama_decode.py
compares them bit for bit): every sub-step that is not plain here (a quantized or oneDNN
weight, Qwen3's q/k norms, a bias) calls the module that owns it. It runs decode-only steps
whose tokens use no adapter; any other step (prefill, chunked, LoRA) runs the module forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from shard.attention import AttentionMetadata, StepMetadata
from shard.attention.torch_backend import TorchAttentionBackend
from shard.distributed import Distributed
from shard.layers import matmul_amx
from shard.layers.linear import ColumnParallelLinear, RowParallelLinear
from shard.layers.lora import LoraStep
from shard.layers.quant.unquantized import DenseWeight
from shard.layers.rotary import MAX_NATIVE_HEAD_DIM
from shard.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from shard.native import build as native
from shard.native.eager import KERNEL_DTYPES, heads_contiguous

log = logging.getLogger(__name__)

Linear = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer as the loop calls it."""

    input_norm: torch.Tensor  # weights of the two RMSNorms
    post_norm: torch.Tensor
    qkv: Linear
    o_proj: Linear
    gate_up_silu: Linear  # silu(gate) * up of the fused gate_up projection
    down_proj: Linear
    # q, k, v of the qkv product, rotated: the fused native rotation of q and k's neighbouring
    # heads, or the modules' (split, Qwen3's norms, rotary) where that does not apply.
    rotate: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]
    scale: float
    window: int  # 0: full attention


class LlamaDecodePath:
    """Callable as the model is (input_ids, positions, kv_caches, meta) -> final hidden
    states, for the steps `applies` accepts."""

    def __init__(self, model: LlamaForCausalLM, lora: LoraStep | None) -> None:
        self.model = model
        self.lora = lora
        self.eps = model.norm.eps
        self.add_rms_norm = native.add_rms_norm_kernel()
        self.rms_norm = native.rms_norm_kernel()
        self.store_kv = native.store_kv_kernel()
        self.paged_decode = native.paged_decode_kernel()
        self.layers = [self._layer(layer, model) for layer in model.layers]

    @classmethod
    def build(
        cls, model: torch.nn.Module, dist: Distributed, lora: LoraStep | None
    ) -> LlamaDecodePath | None:
        """The path for `model`, or None (and why, logged) where it cannot run."""
        reason = cls._unsupported(model)
        if reason is not None:
            log.info("decode steps run the module forward: %s", reason)
            return None
        assert isinstance(model, LlamaForCausalLM)
        return cls(model, lora)

    @staticmethod
    def _unsupported(model: torch.nn.Module) -> str | None:
        if not isinstance(model, LlamaForCausalLM):
            return f"{type(model).__name__} is not of the Llama family"
        if model.device.type != "cpu":
            return f"the model is on {model.device.type}, not the CPU"
        if model.dtype not in KERNEL_DTYPES:
            return f"no native kernels for {model.dtype}"
        if native.unavailable_reason() is not None or native.paged_decode_kernel() is None:
            return f"the native kernels are not built ({native.unavailable_reason() or 'failed'})"
        if not model.layers:
            return "the model has no layers"
        norms = [model.norm] + [
            norm
            for layer in model.layers
            for norm in (layer.input_layernorm, layer.post_attention_layernorm)
        ]
        if any(norm.weight.dtype != model.dtype for norm in norms):
            return "a norm's weight is not in the model's dtype"
        attention = model.layers[0].self_attn
        if not (isinstance(attention.backend, TorchAttentionBackend) and attention.backend.native):
            return "the attention backend is not the native torch one"
        if attention.qkv_proj.head_dim > MAX_NATIVE_HEAD_DIM:
            return f"head_dim {attention.qkv_proj.head_dim} is above {MAX_NATIVE_HEAD_DIM}"
        return None

    def applies(self, meta: StepMetadata) -> bool:
        """A decode-only step whose tokens use no adapter, of fewer rows than the tile kernel
        hands to oneDNN (a decode step of thousands of rows is the module forward's)."""
        return (
            isinstance(meta, AttentionMetadata)
            and not meta.is_prefill
            and len(meta.slot_mapping) < matmul_amx.ONEDNN_ROWS
            and (self.lora is None or self.lora.token_slots is None)
        )

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        add_rms_norm, store_kv, paged_decode, eps = (
            self.add_rms_norm, self.store_kv, self.paged_decode, self.eps
        )  # fmt: skip
        positions = positions.to(torch.int64).contiguous()  # what the rotary kernel reads
        slots, tables, lens = meta.slot_mapping, meta.block_tables, meta.context_lens
        residual = self.model.embed_tokens(input_ids)
        hidden = None
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            if hidden is None:  # the first layer: its input is the stream itself
                x = self.rms_norm(residual, layer.input_norm, eps)
            else:
                x, residual = add_rms_norm(hidden, residual, layer.input_norm, eps)
            q, k, v = layer.rotate(layer.qkv(x), positions)
            store_kv(k, v, kv, slots)
            out = paged_decode(q, kv[0], kv[1], tables, lens, layer.scale, layer.window)
            x, residual = add_rms_norm(layer.o_proj(out.flatten(1)), residual, layer.post_norm, eps)
            hidden = layer.down_proj(layer.gate_up_silu(x))
        if hidden is None:
            return self.model.norm(residual)
        return add_rms_norm(hidden, residual, self.model.norm.weight, eps)[0]

    # -- building ------------------------------------------------------------------------

    def _layer(self, layer: LlamaDecoderLayer, model: LlamaForCausalLM) -> _Layer:
        attention, mlp = layer.self_attn, layer.mlp
        return _Layer(
            input_norm=layer.input_layernorm.weight,
            post_norm=layer.post_attention_layernorm.weight,
            qkv=_linear(attention.qkv_proj),
            o_proj=_linear(attention.o_proj),
            gate_up_silu=_gate_up_silu(mlp.gate_up_proj),
            down_proj=_linear(mlp.down_proj),
            rotate=_rotation(attention),
            scale=attention.scale,
            window=attention.window or 0,
        )


def _tile_weight(linear: ColumnParallelLinear | RowParallelLinear) -> torch.Tensor | None:
    """The linear's weight where the AMX tile kernel multiplies it, else None."""
    weight = linear.weight
    if isinstance(weight, DenseWeight) and matmul_amx.is_packed(weight.weight):
        return weight.weight
    return None


def _linear(linear: ColumnParallelLinear | RowParallelLinear) -> Linear:
    """x -> the layer's output (summed over ranks for a row layer): the tile kernel straight
    on the packed weight, or the module. LoRA terms need no call: steps with adapter tokens
    never come here."""
    packed, kernel = _tile_weight(linear), native.amx_linear_kernel()
    if packed is None or kernel is None:
        return linear
    bias = None if linear.bias is None else linear.bias.data
    if isinstance(linear, RowParallelLinear) and linear.dist.world_size > 1:
        all_reduce = linear.dist.all_reduce
        return lambda x: all_reduce(kernel(x, packed, bias))
    return lambda x: kernel(x, packed, bias)


def _gate_up_silu(linear: ColumnParallelLinear) -> Linear:
    packed, kernel = _tile_weight(linear), native.amx_linear_silu_mul_kernel()
    if packed is None or kernel is None or packed.shape[0] % 2:
        return linear.silu_and_mul  # type: ignore[attr-defined]
    bias = None if linear.bias is None else linear.bias.data
    return lambda x: kernel(x, packed, bias)


def _rotation(attention) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:  # type: ignore[no-untyped-def]
    """(qkv product, positions) -> q, k (rotated) and v, each [T, heads, D]."""
    proj, rotary = attention.qkv_proj, attention.rotary
    heads, kv_heads, d = proj.num_heads, proj.num_kv_heads, proj.head_dim
    if attention.q_norm is not None:  # Qwen3: the modules, norms between split and rotary

        def modules(qkv: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
            q, k, v = proj.split(qkv)
            q, k = rotary(positions, attention.q_norm(q), attention.k_norm(k))
            return q if heads_contiguous(q) else q.contiguous(), k, v

        return modules
    kernel, cos, sin = native.rotary_kernel(), rotary.cos, rotary.sin
    qk_cols, joint = (heads + kv_heads) * d, heads + kv_heads

    def fused(qkv: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # q's and k's heads are neighbours in each row of the fused product: one rotation
        rows = qkv.shape[0]
        rotated = kernel(qkv[:, :qk_cols].view(rows, joint, d), cos, sin, positions)
        v = qkv[:, qk_cols:].view(rows, kv_heads, d)
        return rotated[:, :heads], rotated[:, heads:], v

    return fused
