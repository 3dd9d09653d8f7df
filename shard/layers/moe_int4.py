"""Int4 experts (AWQ, GPTQ and compressed-tensors checkpoints that quantize the routed experts:
Qwen3-MoE's and Mixtral's `-AWQ`, `-GPTQ-Int4` and W4A16 releases), kept int4.

Each expert's modules are read by the checkpoint format's own reader into the one internal int4
layout (shard/layers/quant/int4.py), this rank's part only: gate and up rows start:stop side by
side (their output features), down's input features start:stop (tensor parallel), or the whole
expert (expert parallel). Then, by where the experts run:
- the Triton fused MoE kernel (the Triton backend, and a platform whose `fused_moe` is that
  kernel: CUDA's, whatever --attention says; interpreted on a CPU in tests): one `Int4Experts` stack
  per kind, dequantized tile by tile in registers (shard/platforms/cuda/kernels/moe_int4.py);
- elsewhere (the CPU's grouped GEMMs): each expert an int4 linear weight of the platform
  (shard/layers/quant/int4_linear.py: torch's CPU int4 kernel for bf16, else dequantizing a
  slice at a time), which the grouped GEMMs call for the rows routed to it.
Either way the experts take half a byte an element, as the checkpoint does."""

from __future__ import annotations

import torch
from torch import nn

from shard.layers.quant.awq import AwqReader
from shard.layers.quant.base import Piece
from shard.layers.quant.compressed_tensors import CompressedTensorsReader
from shard.layers.quant.gptq import GptqReader
from shard.layers.quant.int4 import QuantizedWeight
from shard.layers.quant.int4_linear import Int4Method, int4_weight
from shard.layers.quant.select import linear_method
from shard.platforms import platform_of
from shard.platforms.int4_experts import Int4Experts
from shard.weights import Weights, WeightsError

# A layer's int4 experts of one kind: the kernel's stack, or one linear weight per expert
Int4Layer = Int4Experts | nn.ModuleList
# Every int4 format's tensors of a module (another rank's experts are marked read by them)
INT4_TENSORS = tuple(
    dict.fromkeys(GptqReader.tensors + AwqReader.tensors + CompressedTensorsReader.tensors)
)


def is_int4_expert(weights: Weights, module: str) -> bool:
    """Whether an expert module is stored in an int4 format (packed tensors, no `.weight`)."""
    config = weights.quantization
    return (
        config is not None
        and config.int4_linears
        and config.quantizes(module)
        and not weights.has(f"{module}.weight")
    )


def read_int4_expert(
    weights: Weights, modules: list[str], start: int, stop: int, intermediate_size: int
) -> tuple[QuantizedWeight, QuantizedWeight]:
    """(gate rows start:stop then up's, down's input features start:stop) of one expert's
    modules [gate, up, down] ([up, down]: an ungated expert's), in the internal int4 layout."""
    *firsts, down = modules
    method = linear_method(weights, modules)
    if not isinstance(method, Int4Method):
        raise WeightsError(f"{', '.join(modules)}: not all int4, so not one expert's GEMMs")
    for name, size in ((firsts[0], method.out_features(weights, firsts[0])),
                       (down, method.in_features(weights, down))):  # fmt: skip
        if size != intermediate_size:
            raise WeightsError(
                f"{name}: {size} intermediate features, not the config's expert intermediate "
                f"size {intermediate_size}"
            )
    w13 = method.read_columns(weights, [Piece(m, start, stop) for m in firsts])
    return w13, method.read_rows(weights, Piece(down, start, stop))


def int4_layer(experts: list[QuantizedWeight], weights: Weights, name: str) -> Int4Layer:
    """This rank's experts of one kind, as the experts' GEMMs will take them (module doc)."""
    if weights.triton or platform_of(weights.device).moe_kernel == "triton":
        return _stack(experts, name)
    return nn.ModuleList(int4_weight(qw, weights.dtype, triton=False) for qw in experts)


def _stack(experts: list[QuantizedWeight], name: str) -> Int4Experts:
    first = experts[0]
    if any(qw.group_size != first.group_size for qw in experts):
        raise WeightsError(f"{name}: the experts' int4 group sizes differ from one another")
    # act-order: every expert's own g_idx (one whose rows happen to run in order has none)
    act_order = any(qw.g_idx is not None for qw in experts)
    return Int4Experts(
        torch.stack([qw.qweight for qw in experts]),
        torch.stack([qw.zeros for qw in experts]),
        torch.stack([qw.scales for qw in experts]),
        first.group_size,
        torch.stack([qw.groups().int() for qw in experts]) if act_order else None,
    )
