"""gpt-oss's experts as its checkpoints store them, read into FusedMoE's layout (w13 [E, 2I, H]
gate rows first, w2 [E, H, I]) with their biases.

- transformers' layout (and the bf16 exports): `experts.gate_up_proj` [E, H, 2I], its columns
  gate and up interleaved (column 2j is gate j, 2j + 1 up j), `experts.down_proj` [E, I, H],
  each transposed against ours; `gate_up_proj_bias` [E, 2I] interleaved, `down_proj_bias` [E, H].
- the Hub's release: the two weights in MXFP4 (`<name>_blocks`, `<name>_scales`,
  shard/layers/quant/mxfp4.py), output dimension first, the gate_up rows interleaved alike;
  the biases as above. Dequantized at load.

Tensor parallel: rank r reads intermediate columns [s, e) of every expert (gate_up's 2s..2e, the
interleave keeping each gate beside its up); expert parallel: its experts whole. The down bias
is added once per expert's output: by rank 0 under tensor parallelism (the ranks' outputs are
partial sums the caller all-reduces), by the expert's own rank under expert parallelism."""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

import torch

from shard.layers.quant.mxfp4 import BLOCK, dequantize_mxfp4
from shard.weights import Weights, WeightsError

log = logging.getLogger(__name__)

ExpertTensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


def read_interleaved(
    weights: Weights,
    gate_up: str,
    down: str,
    experts: range,
    cols: tuple[int, int],
    intermediate_size: int,
) -> ExpertTensors:
    """(w13 [E_r, 2 I_r, H], w2 [E_r, H, I_r], w13 bias [E_r, 2 I_r], w2 bias [E_r, H] or None
    on the ranks that do not add it) of the experts `experts`, intermediate columns `cols`."""
    whole = len(experts) != _num_experts(weights, gate_up)  # expert parallel
    start, stop = cols
    if weights.has(f"{gate_up}_blocks"):
        _say_dequantized(weights.model_dir, weights.dtype)
        w13 = _mxfp4(weights, gate_up, experts, (2 * start, 2 * stop), rows=True, whole=whole)
        w2 = _mxfp4(weights, down, experts, cols, rows=False, whole=whole)
    elif weights.has(gate_up):
        w13 = _float(weights, gate_up, experts, (2 * start, 2 * stop), 2, whole).transpose(1, 2)
        w2 = _float(weights, down, experts, cols, 1, whole).transpose(1, 2).contiguous()
    else:
        method = weights.quantization.method if weights.quantization else "this checkpoint's"
        raise WeightsError(
            f"{gate_up}: neither the floating-point tensor nor MXFP4 blocks are in the "
            f"checkpoint; {method} experts are not supported (gpt-oss is served from its "
            "MXFP4 release or a floating-point export)"
        )
    if w13.shape[1] != 2 * (stop - start) or w2.shape[2] != stop - start:
        raise WeightsError(
            f"{gate_up}, {down}: expert shapes {list(w13.shape)} and {list(w2.shape)} do not "
            f"hold intermediate size {intermediate_size}"
        )
    b13 = _float(weights, f"{gate_up}_bias", experts, (2 * start, 2 * stop), 1, whole)
    b2: torch.Tensor | None = None
    if whole or weights.dist.rank == 0:
        b2 = weights.get_range(f"{down}_bias", 0, experts.start, experts.stop)
    else:
        weights.mark_consumed(f"{down}_bias")  # rank 0's to add
    return _gate_first(w13), w2, _gate_first(b13), b2


@cache
def _say_dequantized(model_dir: Path, dtype: torch.dtype) -> None:
    """Once a checkpoint: what serving MXFP4 experts here costs."""
    log.warning(
        "%s: MXFP4 experts are dequantized to %s at load (there is no MXFP4 kernel here): they "
        "take the unquantized model's memory",
        model_dir,
        str(dtype).removeprefix("torch."),
    )


def _num_experts(weights: Weights, gate_up: str) -> int:
    name = f"{gate_up}_blocks" if weights.has(f"{gate_up}_blocks") else gate_up
    return weights.shape(name)[0] if weights.has(name) else 0


def _float(
    weights: Weights, name: str, experts: range, cols: tuple[int, int], dim: int, whole: bool
) -> torch.Tensor:
    """The experts' tensor: its experts' rows (expert parallel) or columns `cols` along `dim`."""
    if whole:
        return weights.get_range(name, 0, experts.start, experts.stop)
    return weights.get_range(name, dim, *cols)


def _mxfp4(
    weights: Weights, name: str, experts: range, span: tuple[int, int], *, rows: bool, whole: bool
) -> torch.Tensor:
    """An MXFP4 weight [E, out, in] dequantized: its experts (expert parallel), or its outputs
    `span` (`rows`: gate_up's) or its inputs `span` (down's, read by whole 32-wide blocks)."""
    blocks, scales = f"{name}_blocks", f"{name}_scales"
    if whole:
        b = weights.get_range(blocks, 0, experts.start, experts.stop)
        s = weights.get_range(scales, 0, experts.start, experts.stop)
        return dequantize_mxfp4(b, s, weights.dtype)
    if rows:
        b = weights.get_range(blocks, 1, *span)
        s = weights.get_range(scales, 1, *span)
        return dequantize_mxfp4(b, s, weights.dtype)
    start, stop = span
    first, last = start // BLOCK, -(-stop // BLOCK)
    b = weights.get_range(blocks, 2, first, last)
    s = weights.get_range(scales, 2, first, last)
    offset = first * BLOCK
    return dequantize_mxfp4(b, s, weights.dtype)[..., start - offset : stop - offset].contiguous()


def _gate_first(interleaved: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] rows gate 0, up 0, gate 1, ... -> gate rows first, then up rows."""
    return torch.cat([interleaved[:, 0::2], interleaved[:, 1::2]], dim=1).contiguous()
