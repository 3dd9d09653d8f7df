"""A GGUF file as a weight source for shard/weights.py: HF names, HF shapes, and slices that
are dequantized (through the gguf library) only for the rows a read asks for.

Quantized GGUF blocks never cross a row (llama.cpp quantizes along the input features), so a
row range dequantizes on its own: a column-parallel rank dequantizes only its rows, and the
loader's row-chunked reads (16 MiB at a time) bound the float copy of any one tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from shard.gguf.names import (
    SKIPPED,
    expert_names,
    hf_name,
    one_row,
    rope_head_count_key,
    stored_plus_one,
)


class GgufSource:
    def __init__(self, path: Path) -> None:
        import gguf

        self._reader = gguf.GGUFReader(str(path))
        self._tensors = {}
        # HF row r of a rope-permuted tensor lives in GGUF row self._row_order[name][r].
        self._row_order: dict[str, np.ndarray] = {}
        # Per-expert names of a stacked [E, rows, cols] tensor: the expert each one reads.
        self._expert: dict[str, int] = {}
        self._one_row: set[str] = set()  # vectors read as [1, n]
        arch = self._reader.get_field("general.architecture").contents()
        self._arch = arch
        for tensor in self._reader.tensors:
            if tensor.name in SKIPPED:
                continue
            per_expert = expert_names(tensor.name, int(tensor.shape[-1]), arch)
            if per_expert is not None:
                for e, name in enumerate(per_expert):
                    self._tensors[name] = tensor
                    self._expert[name] = e
                continue
            name = hf_name(tensor.name, arch)
            if one_row(tensor.name):
                self._one_row.add(name)
            self._tensors[name] = tensor
            key = rope_head_count_key(tensor.name) if arch == "llama" else None
            if key is not None:
                heads = self._reader.get_field(f"{arch}.attention.{key}").contents()
                self._row_order[name] = _unpermute_order(int(tensor.shape[-1]), heads)

    def keys(self) -> Iterable[str]:
        return self._tensors.keys()

    def shape(self, name: str) -> list[int]:
        # GGUF lists dimensions innermost first (ggml's ne); torch's order is the reverse.
        shape = [int(n) for n in reversed(self._tensors[name].shape)]
        if name in self._expert:
            return shape[1:]
        return [1, *shape] if name in self._one_row else shape

    @contextmanager
    def view(self, name: str, index: tuple[slice, ...]) -> Iterator[torch.Tensor]:
        from gguf.quants import dequantize

        tensor = self._tensors[name]
        if name in self._one_row:  # [1, n]: the one row is the whole vector
            index = index[1:]
        rows = index[0] if index else slice(None)
        data = tensor.data  # the file's mmap: [rows, bytes per row] when quantized
        if name in self._expert:
            data = data[self._expert[name]]  # [E, rows, bytes per row]: this expert's matrix
        order = self._row_order.get(name)
        # Fancy indexing copies just these rows out of the mapping.
        picked = data[order[rows]] if order is not None else np.asarray(data[rows])
        values = dequantize(picked, tensor.tensor_type)
        if stored_plus_one(self._arch, name):
            values = values - 1  # a new array: the mapping stays untouched
        elif not values.flags.writeable:  # F32 comes back as a view of the read-only mapping
            values = values.copy()
        out = torch.from_numpy(np.ascontiguousarray(values))[(slice(None), *index[1:])]
        yield out[None] if name in self._one_row else out


def _unpermute_order(rows: int, heads: int) -> np.ndarray:
    """llama.cpp stores each head's rows as pairs (i, i + head_dim/2) interleaved; HF keeps the
    two halves apart. order[r] is the GGUF row that holds HF row r."""
    head_dim = rows // heads
    return np.arange(rows).reshape(heads, head_dim // 2, 2).swapaxes(1, 2).reshape(-1)
