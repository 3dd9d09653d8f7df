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
weight, Qwen3's q/k norms) calls the module that owns it. It runs decode-only steps; prefill
and chunked steps run the module forward. A step whose tokens use adapters runs a second copy
of the loop whose linears add their LoRA terms, as the modules do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from shard.attention import AttentionMetadata, StepMetadata
from shard.attention.torch_backend import TorchAttentionBackend
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
    input_eps: float
    post_eps: float
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
        self.add_rms_norm = native.add_rms_norm_kernel()
        self.rms_norm = native.rms_norm_kernel()
        self.store_kv = native.store_kv_kernel()
        self.paged_decode = native.paged_decode_kernel()
        self.layers = [self._layer(layer, lora=False) for layer in model.layers]
        self.lora_layers = self.layers
        if lora is not None:
            self.lora_layers = [self._layer(layer, lora=True) for layer in model.layers]

    @classmethod
    def build(cls, model: torch.nn.Module, lora: LoraStep | None) -> LlamaDecodePath | None:
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
        """A decode-only step of fewer rows than the tile kernel hands to oneDNN (a decode step
        of thousands of rows is the module forward's)."""
        return (
            isinstance(meta, AttentionMetadata)
            and not meta.is_prefill
            and len(meta.slot_mapping) < matmul_amx.ONEDNN_ROWS
        )

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        add_rms_norm, store_kv, paged_decode = self.add_rms_norm, self.store_kv, self.paged_decode
        positions = positions.to(torch.int64).contiguous()  # what the rotary kernel reads
        slots, tables, lens = meta.slot_mapping, meta.block_tables, meta.context_lens
        adapters = self.lora is not None and self.lora.token_slots is not None
        residual = self.model.embed_tokens(input_ids)
        hidden = None
        for layer, kv in zip(self.lora_layers if adapters else self.layers, kv_caches, strict=True):
            if hidden is None:  # the first layer: its input is the stream itself
                x = self.rms_norm(residual, layer.input_norm, layer.input_eps)
            else:
                x, residual = add_rms_norm(hidden, residual, layer.input_norm, layer.input_eps)
            q, k, v = layer.rotate(layer.qkv(x), positions)
            store_kv(k, v, kv, slots)
            out = paged_decode(q, kv[0], kv[1], tables, lens, layer.scale, layer.window)
            x, residual = add_rms_norm(
                layer.o_proj(out.flatten(1)), residual, layer.post_norm, layer.post_eps
            )
            hidden = layer.down_proj(layer.gate_up_silu(x))
        norm = self.model.norm  # a model without layers gets no loop (`_unsupported`)
        return add_rms_norm(hidden, residual, norm.weight, norm.eps)[0]

    # -- building ------------------------------------------------------------------------

    @staticmethod
    def _layer(layer: LlamaDecoderLayer, *, lora: bool) -> _Layer:
        """The layer's loop entry; with `lora`, its linears add their LoRA terms."""
        attention, mlp = layer.self_attn, layer.mlp
        return _Layer(
            input_norm=layer.input_layernorm.weight,
            post_norm=layer.post_attention_layernorm.weight,
            input_eps=layer.input_layernorm.eps,
            post_eps=layer.post_attention_layernorm.eps,
            qkv=_linear(attention.qkv_proj, lora),
            o_proj=_linear(attention.o_proj, lora),
            gate_up_silu=_gate_up_silu(mlp.gate_up_proj, lora),
            down_proj=_linear(mlp.down_proj, lora),
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


def _bias(linear: ColumnParallelLinear | RowParallelLinear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.data


def _linear(linear: ColumnParallelLinear | RowParallelLinear, lora: bool) -> Linear:
    """x -> the layer's output (summed over ranks for a row layer): the tile kernel straight
    on the packed weight, or with `lora` the layer's LoRA term's product (the base and its
    term, before the sum, as the module computes it); or the module."""
    packed, kernel = _tile_weight(linear), native.amx_linear_kernel()
    if packed is None or kernel is None:
        return linear
    bias = _bias(linear)
    term, weight = linear.lora if lora else None, linear.weight
    reduce = None
    if isinstance(linear, RowParallelLinear) and linear.dist.world_size > 1:
        reduce = linear.dist.all_reduce
    if term is None and reduce is None:
        return lambda x: kernel(x, packed, bias)

    def call(x: torch.Tensor) -> torch.Tensor:
        y = kernel(x, packed, bias) if term is None else term.linear(weight, x, bias)
        return y if reduce is None else reduce(y)

    return call


def _gate_up_silu(linear: ColumnParallelLinear, lora: bool) -> Linear:
    """x -> silu(gate) * up: SwiGLU in the tile kernel's epilogue, or after the product and its
    LoRA term (with `lora`, as the module computes it), or the module."""
    packed, kernel = _tile_weight(linear), native.amx_linear_silu_mul_kernel()
    if packed is None or kernel is None or packed.shape[0] % 2:
        return linear.silu_and_mul  # type: ignore[attr-defined]
    bias, term, weight = _bias(linear), linear.lora, linear.weight
    if lora and term is not None:
        return lambda x: term.linear(weight, x, bias, gated=True)
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
