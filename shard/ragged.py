"""Per-request lists of different lengths as padded [B, W] tensors, and their concatenation:
what a batch's block tables, slots and histories, and its requests' logit biases, are kept as."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_rows(
    rows: Sequence[Sequence[int | float]], dtype: torch.dtype, min_width: int = 0
) -> torch.Tensor:
    """[B, max(longest, min_width)] on the CPU, zeros after each row's values."""
    width = max(max((len(r) for r in rows), default=0), min_width)
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def cat_padded(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenates [B_i, W_i] tensors along rows, zero-padding the narrower ones."""
    width = max(t.shape[1] for t in tensors)
    padded = [torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors]
    return torch.cat(padded, dim=0)
