"""Reads a checkpoint one slice at a time and remembers which tensors the model consumed.

Safetensors files are opened once and read with `get_slice`, so a rank only ever reads the rows
or columns it owns. `.bin`/`.pth` checkpoints go through `torch.load(weights_only=True)` (never
unpickling arbitrary code); they are memory-mapped where the file format allows.
After the model is built, `check_all_consumed()` turns any tensor nobody asked for into an error,
so a wrong name table cannot silently leave layers at their initial values.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from shard.distributed import Distributed

# Non-persistent buffers that some old exports still contain; we recompute them.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightsError(RuntimeError):
    pass


class _SafetensorsSource:
    def __init__(self, files: Sequence[Path], weight_map: dict[str, str] | None) -> None:
        self._handles = {f.name: safe_open(str(f), framework="pt") for f in files}
        if weight_map is None:
            weight_map = {k: name for name, h in self._handles.items() for k in h.keys()}
        self._map = weight_map

    def keys(self) -> Iterable[str]:
        return self._map.keys()

    def shape(self, name: str) -> list[int]:
        return list(self._handles[self._map[name]].get_slice(name).get_shape())

    def read(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        return self._handles[self._map[name]].get_slice(name)[index]


class _TorchSource:
    def __init__(self, files: Sequence[Path]) -> None:
        self._tensors: dict[str, torch.Tensor] = {}
        for f in files:
            try:
                state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # legacy (non-zip) format cannot be memory-mapped
                state = torch.load(f, map_location="cpu", weights_only=True)
            self._tensors.update(state)

    def keys(self) -> Iterable[str]:
        return self._tensors.keys()

    def shape(self, name: str) -> list[int]:
        return list(self._tensors[name].shape)

    def read(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        return self._tensors[name][index]


def _open_source(model_dir: Path) -> _SafetensorsSource | _TorchSource:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({model_dir / f for f in weight_map.values()})
        return _SafetensorsSource(files, weight_map)
    # Some repos ship a second copy in another layout (Mistral's consolidated.safetensors).
    single = model_dir / "model.safetensors"
    files = [single] if single.exists() else sorted(model_dir.glob("*.safetensors"))
    if files:
        return _SafetensorsSource(files, None)
    index = model_dir / "pytorch_model.bin.index.json"
    if index.exists():
        names = set(json.loads(index.read_text())["weight_map"].values())
        return _TorchSource(sorted(model_dir / f for f in names))
    files = [
        f
        for f in sorted(model_dir.glob("*.bin")) + sorted(model_dir.glob("*.pth"))
        if not f.name.startswith("training_args")  # trainer state, not weights
    ]
    if files:
        return _TorchSource(files)
    raise WeightsError(f"no .safetensors, .bin or .pth weights in {model_dir}")


class Weights:
    """This rank's view of a checkpoint. Floating tensors come back in `dtype` on `device`."""

    def __init__(
        self, model_dir: str | Path, *, dtype: torch.dtype, device: torch.device, dist: Distributed
    ) -> None:
        self.model_dir = Path(model_dir)
        self.dtype = dtype
        self.device = device
        self.dist = dist
        self._source = _open_source(self.model_dir)
        self._keys = set(self._source.keys())
        self.consumed: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self._keys

    def shape(self, name: str) -> list[int]:
        self._require(name)
        return self._source.shape(name)

    def mark_consumed(self, name: str) -> None:
        """For tensors deliberately skipped, e.g. a saved lm_head that is tied to the embedding."""
        self._require(name)
        self.consumed.add(name)

    def get_tensor(self, name: str) -> torch.Tensor:
        """The whole tensor, for replicated parameters (norms)."""
        return self._read(name, (slice(None),) if self.shape(name) else ())

    def get_range(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Rows `start:stop` of `name` along `dim`; the primitive every sharded read uses."""
        shape = self.shape(name)
        dim = dim % len(shape)
        if not 0 <= start <= stop <= shape[dim]:
            raise WeightsError(f"{name}: range {start}:{stop} outside dim {dim} of shape {shape}")
        index = tuple(slice(None) for _ in range(dim)) + (slice(start, stop),)
        return self._read(name, index)

    def get_sharded(self, name: str, dim: int) -> torch.Tensor:
        """This rank's equal 1/world_size block of `name` along `dim`."""
        size = self.shape(name)[dim]
        start, stop = self._shard_bounds(name, dim, size)
        return self.get_range(name, dim, start, stop)

    def get_packed_sharded(self, name: str, dim: int, block_sizes: Sequence[int]) -> torch.Tensor:
        """For a checkpoint tensor that already fuses several blocks along `dim` (e.g. a saved
        gate_up_proj): shard each block separately and concatenate this rank's pieces, so the
        result is packed per rank as [block0_r, block1_r, ...]."""
        total = self.shape(name)[dim]
        if sum(block_sizes) != total:
            raise WeightsError(
                f"{name}: blocks {list(block_sizes)} do not add up to dim {dim} = {total}"
            )
        pieces, offset = [], 0
        for size in block_sizes:
            start, stop = self._shard_bounds(name, dim, size)
            pieces.append(self.get_range(name, dim, offset + start, offset + stop))
            offset += size
        return torch.cat(pieces, dim=dim)

    def get_multi_sharded(self, names: Sequence[str], dim: int) -> torch.Tensor:
        """Shards each tensor along `dim` and concatenates this rank's slices (fused layers)."""
        return torch.cat([self.get_sharded(n, dim) for n in names], dim=dim)

    def check_all_consumed(self) -> None:
        """Fails naming every checkpoint tensor the model did not load."""
        unexpected = sorted(
            k for k in self._keys - self.consumed if not k.endswith(IGNORED_SUFFIXES)
        )
        if unexpected:
            raise WeightsError(
                f"{len(unexpected)} unexpected tensor(s) in {self.model_dir} that the model does "
                f"not use: {', '.join(unexpected)}"
            )

    def _shard_bounds(self, name: str, dim: int, size: int) -> tuple[int, int]:
        world, rank = self.dist.world_size, self.dist.rank
        if size % world:
            raise WeightsError(
                f"cannot shard {name}: dim {dim} has size {size}, "
                f"not divisible by world size {world}"
            )
        block = size // world
        return rank * block, (rank + 1) * block

    def _require(self, name: str) -> None:
        if name not in self._keys:
            raise WeightsError(f"missing tensor {name!r} in checkpoint {self.model_dir}")

    def _read(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        self._require(name)
        tensor = self._source.read(name, index)
        self.consumed.add(name)
        if tensor.is_floating_point():
            tensor = tensor.to(self.dtype)
        return tensor.contiguous().to(self.device)
