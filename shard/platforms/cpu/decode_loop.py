"""The decode step on the CPU, eager mode, as a flat loop of native kernel calls over whatever
the shared blocks describe (shard/models/blocks.py: every architecture gets it).

Why: a decode step's kernels are short (a 16-row step of the SmolLM2 shape: ~13 ms for 30
layers), and the module forward wraps each in layers of Python: nn.Module calls, per-call
eligibility checks (dtype, device, strides, storage identity), views and splits, about 150 us
a layer, ~4.5 ms a step. Those checks depend only on the model, so this path makes them once,
when it is built, and keeps for each layer the tensors and kernels its forward ends up calling.
It is to the CPU decode step what a captured CUDA graph is to a GPU one: the same kernels, in
the same order, on the same inputs, without the Python around them.

It computes exactly what DecoderModel.forward computes (tests/shard/test_cpu_decode.py compares
them bit for bit, for every architecture): every sub-step that is not plain here (a quantized or
oneDNN weight, q/k norms, a rotary that is not the whole-head position-only rotation or none
(NoPE), a norm whose weight is not in the model's dtype, a LayerNorm of any kind (Cohere's,
StarCoder2's, Nemotron's 1 + w, OLMo's weightless) or a residual add without a norm, a
gated activation other than SwiGLU, the sandwich norms, a Mixture-of-Experts MLP, DeepSeek's
latent attention, Gated DeltaNet linear attention, each as a whole) calls the module
that owns it. Parallel layers (Cohere's, Phi's, GPT-NeoX's) and OLMo's clamped q/k/v are
the loop's own, as the modules order them. Attention sinks (gpt-oss) are
the native decode kernel's own. It runs decode-only steps;
prefill and chunked steps run the module forward. A step whose tokens use adapters runs a
second copy of the loop whose linears add their LoRA terms, as the modules do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from shard.attention import AttentionMetadata, StepMetadata
from shard.layers.activation import SILU
from shard.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, RowParallelLinear
from shard.layers.lora import LoraStep
from shard.layers.norm import RMSNorm
from shard.layers.quant.unquantized import DenseWeight
from shard.models.blocks import Attention, DecoderLayer, DecoderModel, output_gated
from shard.models.mlp import GatedMLP, UngatedMLP
from shard.models.moe_block import SparseMoeBlock
from shard.platforms.cpu import MAX_NATIVE_HEAD_DIM, matmul_amx
from shard.platforms.cpu.attention import TorchAttentionBackend
from shard.platforms.cpu.native import build as native
from shard.platforms.cpu.native.eager import KERNEL_DTYPES, heads_contiguous

log = logging.getLogger(__name__)

Linear = Callable[[torch.Tensor], torch.Tensor]
Norm = Callable[[torch.Tensor], torch.Tensor]
AddNorm = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Rotate = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], tuple[torch.Tensor, ...]]


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer as the loop calls it."""

    first_norm: Norm  # the input norm of the first layer, whose input is the stream itself
    input_norm: AddNorm  # (hidden, residual) -> (norm(hidden + residual), hidden + residual)
    pre_mlp_norm: AddNorm | None  # None: a parallel layer (Cohere), whose MLP reads the input norm
    post_attention_norm: Norm | None  # the sandwich norms (Gemma), else None
    post_mlp_norm: Norm | None
    residual_scale: float | None  # Granite's residual_multiplier
    qkv: Linear
    o_proj: Linear
    mlp: Linear  # the dense MLP's gate_up and down products, or the MoE block's module
    # q, k, v of the qkv product, rotated: the fused native rotation of q and k's neighbouring
    # heads, or the modules' (split, q/k norms, rotary) where that does not apply.
    rotate: Rotate
    scale: float
    window: int  # 0: full attention
    softcap: float  # 0: none
    sinks: torch.Tensor | None  # gpt-oss's per-head sink logits, float32
    output_gate: Linear | None  # AFMoE's gate on attention's output (Attention.gated), or None
    gate_activation: str  # its function (Attention.gate_activation)
    # the whole attention as its module (DeepSeek's latent attention), in place of the five
    # fields above it; None: the loop's own calls
    attention_module: Callable[..., torch.Tensor] | None = None
    # a parallel layer's own norm of its input for the MLP (GPT-NeoX's), or None: the input norm's
    parallel_mlp_norm: Norm | None = None
    # a parallel layer whose two outputs are summed before the stream is added (Phi, GPT-NeoX)
    parallel_outputs_summed: bool = False
    alibi: torch.Tensor | None = None  # ALiBi's per-head slopes, float32 (BLOOM, MPT)


class CpuDecodePath:
    """Callable as the model is (input_ids, positions, kv_caches, meta) -> final hidden
    states, for the steps `applies` accepts."""

    def __init__(self, model: DecoderModel, lora: LoraStep | None) -> None:
        self.model = model
        self.lora = lora
        self.store_kv = native.store_kv_kernel()
        self.paged_decode = native.paged_decode_kernel()
        self.final_norm = _add_norm(model.norm, model.dtype)
        dtype = model.dtype
        self.layers = [self._layer(layer, dtype, lora=False) for layer in model.layers]
        self.lora_layers = self.layers
        if lora is not None:
            self.lora_layers = [self._layer(layer, dtype, lora=True) for layer in model.layers]

    @classmethod
    def build(cls, model: torch.nn.Module, lora: LoraStep | None) -> CpuDecodePath | None:
        """The path for `model`, or None (and why, logged) where it cannot run."""
        reason = cls._unsupported(model)
        if reason is not None:
            log.info("decode steps run the module forward: %s", reason)
            return None
        assert isinstance(model, DecoderModel)
        return cls(model, lora)

    @staticmethod
    def _unsupported(model: torch.nn.Module) -> str | None:
        if not isinstance(model, DecoderModel):
            return f"{type(model).__name__} is not composed of the shared decoder blocks"
        if model.device.type != "cpu":
            return f"the model is on {model.device.type}, not the CPU"
        if model.dtype not in KERNEL_DTYPES:
            return f"no native kernels for {model.dtype}"
        if native.unavailable_reason() is not None or native.paged_decode_kernel() is None:
            return f"the native kernels are not built ({native.unavailable_reason() or 'failed'})"
        if not model.layers:
            return "the model has no layers"
        if any(type(layer) is not DecoderLayer for layer in model.layers):
            return "its layers are not the shared DecoderLayer (the loop restates that one)"
        # (layers whose values are normed, or whose keys and values are another's: Gemma 4's)
        if any(
            isinstance(m, Attention) and (m.value_norm is not None or m.reads is not None)
            for m in model.mixers
        ):
            return "some layer norms its values or reads another layer's keys and values"
        if any(
            isinstance(m, Attention)
            and (m.value_scale is not None or m.qkv_proj.value_head_dim != m.qkv_proj.head_dim)
            for m in model.mixers
        ):
            return "some layer's values are scaled or narrower than its keys (MiMo-V2-Flash's)"
        if any(isinstance(m, Attention) and m.chunk is not None for m in model.mixers):
            return "some layer attends in chunks (Llama 4's), which the native kernel has not"
        # (linear-attention layers have no backend: the first that attends says which)
        attending = [m for m in model.mixers if hasattr(m, "backend")]
        if not attending:
            return "no layer attends over a paged cache"
        attention = attending[0]
        if not (isinstance(attention.backend, TorchAttentionBackend) and attention.backend.native):
            return "the attention backend is not the native torch one"
        if isinstance(attention, Attention) and attention.qkv_proj.head_dim > MAX_NATIVE_HEAD_DIM:
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
        store_kv, paged_decode = self.store_kv, self.paged_decode
        positions = positions.to(torch.int64).contiguous()  # what the rotary kernel reads
        slots, tables, lens = meta.slot_mapping, meta.block_tables, meta.context_lens
        adapters = self.lora is not None and self.lora.token_slots is not None
        residual = self.model.embed(input_ids, positions)
        hidden = None
        for layer, kv in zip(self.lora_layers if adapters else self.layers, kv_caches, strict=True):
            if hidden is None:  # the first layer: its input is the stream itself
                x = layer.first_norm(residual)
            else:
                x, residual = layer.input_norm(hidden, residual)
            normed = x
            if layer.attention_module is not None:
                x = layer.attention_module(x, positions, kv, meta)
            else:
                q, k, v = layer.rotate(layer.qkv(x), positions, meta)
                store_kv(k, v, kv, slots)
                out = paged_decode(
                    q, kv[0], kv[1], tables, lens, layer.scale, layer.window, layer.softcap,
                    layer.sinks, layer.alibi,
                )  # fmt: skip
                flat = out.flatten(1)
                if layer.output_gate is not None:
                    flat = output_gated(flat, layer.output_gate(normed), layer.gate_activation)
                x = layer.o_proj(flat)
            if layer.pre_mlp_norm is None:  # parallel, as DecoderLayer.forward adds them
                if layer.parallel_mlp_norm is not None:
                    normed = layer.parallel_mlp_norm(residual)
                if layer.parallel_outputs_summed:
                    hidden = x + layer.mlp(normed)
                else:  # attention's output joins the stream first
                    residual = residual + x
                    hidden = layer.mlp(normed)
                continue
            if layer.post_attention_norm is not None:
                x = layer.post_attention_norm(x)
            if layer.residual_scale is not None:
                x = x * layer.residual_scale
            x, residual = layer.pre_mlp_norm(x, residual)
            hidden = layer.mlp(x)
            if layer.post_mlp_norm is not None:
                hidden = layer.post_mlp_norm(hidden)
            if layer.residual_scale is not None:
                hidden = hidden * layer.residual_scale
        # a model without layers gets no loop (`_unsupported`)
        return self.final_norm(hidden, residual)[0]  # type: ignore[arg-type]

    # -- building ------------------------------------------------------------------------

    @staticmethod
    def _layer(layer: DecoderLayer, dtype: torch.dtype, *, lora: bool) -> _Layer:
        """The layer's loop entry; with `lora`, its linears add their LoRA terms."""
        attention, mlp = layer.self_attn, layer.mlp
        post_attention, post_mlp = layer.post_attention_norm, layer.post_mlp_norm
        common = dict(
            first_norm=_norm(layer.input_layernorm, dtype),
            input_norm=_add_norm(layer.input_layernorm, dtype),
            pre_mlp_norm=None if layer.parallel else _add_norm(layer.pre_mlp_layernorm, dtype),
            post_attention_norm=None if post_attention is None else _norm(post_attention, dtype),
            post_mlp_norm=None if post_mlp is None else _norm(post_mlp, dtype),
            residual_scale=layer.residual_scale,
            mlp=_mlp(mlp, lora),
            parallel_mlp_norm=layer.parallel_mlp_norm,
            parallel_outputs_summed=layer.parallel_outputs_summed,
        )
        if not isinstance(attention, Attention):  # its module stores and reads its own cache
            return _Layer(
                **common, qkv=_not_called, o_proj=_not_called, rotate=_not_called, scale=0.0,
                window=0, softcap=0.0, sinks=None, output_gate=None, gate_activation="sigmoid",
                attention_module=attention,
            )  # fmt: skip
        return _Layer(
            **common,
            qkv=_clipped(attention, _linear(attention.qkv_proj, lora)),
            o_proj=_linear(attention.o_proj, lora),
            rotate=_rotation(attention),
            scale=attention.scale,
            window=attention.window or 0,
            softcap=attention.softcap or 0.0,
            sinks=attention.sinks,
            alibi=attention.alibi,
            output_gate=_optional_linear(attention.output_gate, lora),
            gate_activation=attention.gate_activation,
        )


def _clipped(attention: Attention, qkv: Linear) -> Linear:
    """The q/k/v product clamped as Attention.clipped does (OLMo's clip_qkv), or as it is."""
    if attention.clip_qkv is None:
        return qkv
    return lambda x: attention.clipped(qkv(x))


def _optional_linear(linear: ColumnParallelLinear | None, lora: bool) -> Linear | None:
    return None if linear is None else _linear(linear, lora)


def _not_called(*args: object) -> tuple[torch.Tensor, ...]:
    raise AssertionError("a layer whose attention is its module calls no sub-step of it")


def _native_weight(norm: torch.nn.Module, dtype: torch.dtype) -> bool:
    """Whether the native norm kernels compute what `norm` does: an RMSNorm (not OLMo 2's
    plain residual add), scaling in the dtype."""
    return isinstance(norm, RMSNorm) and norm.weight.dtype == dtype


def _norm(norm: torch.nn.Module, dtype: torch.dtype) -> Norm:
    kernel = native.rms_norm_kernel()
    if kernel is None or not _native_weight(norm, dtype):
        return norm  # type: ignore[return-value]
    weight, eps = norm.weight, norm.eps
    return lambda x: kernel(x, weight, eps)


def _add_norm(norm: torch.nn.Module, dtype: torch.dtype) -> AddNorm:
    kernel = native.add_rms_norm_kernel()
    if kernel is None or not _native_weight(norm, dtype):
        return norm  # type: ignore[return-value]
    weight, eps = norm.weight, norm.eps
    return lambda x, residual: kernel(x, residual, weight, eps)


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


def _mlp(mlp: GatedMLP | UngatedMLP | SparseMoeBlock, lora: bool) -> Linear:
    """x -> the MLP's output: a gated one's two products as below; an ungated one's module (its
    two linears, LoRA terms included), a Mixture-of-Experts block's module (its router, its
    grouped experts, its all_reduce)."""
    if not isinstance(mlp, GatedMLP):
        return mlp
    gate_up, down = _gate_up(mlp.gate_up_proj, mlp.act, lora), _linear(mlp.down_proj, lora)
    return lambda x: down(gate_up(x))


def _gate_up(linear: MergedColumnParallelLinear, act: str, lora: bool) -> Linear:
    """x -> act(gate) * up: SwiGLU in the tile kernel's epilogue, or after the product and its
    LoRA term (with `lora`, as the module computes it), or the module."""
    packed, kernel = _tile_weight(linear), native.amx_linear_silu_mul_kernel()
    if act != SILU or packed is None or kernel is None or packed.shape[0] % 2:
        return lambda x: linear.act_and_mul(x, act)
    bias, term, weight = _bias(linear), linear.lora, linear.weight
    if lora and term is not None:
        return lambda x: term.linear(weight, x, bias, gated=act)
    return lambda x: kernel(x, packed, bias)


def _rotation(attention: Attention) -> Rotate:
    """(qkv product, positions, meta) -> q, k (rotated) and v, each [T, heads, D]; the queries
    scaled by position where the model says so (Attention.scale_queries)."""
    rotate = _rotation_only(attention)
    if attention.position_scale is None:
        return rotate

    def scaled(
        qkv: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, ...]:
        q, k, v = rotate(qkv, positions, meta)
        return attention.scale_queries(q, positions), k, v

    return scaled


def _rotation_only(attention: Attention) -> Rotate:
    proj, rotary = attention.qkv_proj, attention.rotary
    heads, kv_heads, d = proj.num_heads, proj.num_kv_heads, proj.head_dim
    kernel = native.rotary_kernel()
    if attention.qk_norm is not None or not rotary.plain or kernel is None:
        # the module's: q/k norms around the rotary, or a rotation the kernel lacks

        def modules(
            qkv: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
        ) -> tuple[torch.Tensor, ...]:
            q, k, v = proj.split(qkv)
            q, k = attention.position(q, k, positions, meta)
            return q if heads_contiguous(q) else q.contiguous(), k, v

        return modules
    qk_cols, joint = (heads + kv_heads) * d, heads + kv_heads

    def fused(
        qkv: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, ...]:
        # q's and k's heads are neighbours in each row of the fused product: one rotation
        rows = qkv.shape[0]
        # (the tables read at each call: a shard's warmup sizes them after this is built)
        rotated = kernel(qkv[:, :qk_cols].view(rows, joint, d), rotary.cos, rotary.sin, positions)
        v = qkv[:, qk_cols:].view(rows, kv_heads, d)
        return rotated[:, :heads], rotated[:, heads:], v

    return fused
