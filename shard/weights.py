"""Reads a checkpoint one slice at a time and remembers which tensors the model consumed.

Safetensors files are read with `get_slice`, so a rank only ever reads the rows or columns it
owns. `get_slice` returns a view into the file's mmap, so every read is copied into a tensor of
its own and the file is mapped only for the duration of that read: a parameter that stayed a view
would pin the mapping, and every checkpoint page a rank touched (a row-parallel slice touches the
pages of the whole tensor) would then count in that rank's memory (docs/tensor-parallel.md has
the numbers). `.bin`/`.pth` checkpoints go through `torch.load(weights_only=True)` (never
unpickling arbitrary code); they are memory-mapped where the file format allows.
After the model is built, `check_all_consumed()` turns any tensor nobody asked for into an error,
so a wrong name table cannot silently leave layers at their initial values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from shard.distributed import Distributed
from shard.layers.quant.config import QuantizationConfig

if TYPE_CHECKING:
    from shard.gguf.source import GgufSource

# Elements read through one mapping (16 MiB of float32): bounds the checkpoint pages a rank has
# mapped at any moment, whatever the tensor's size.
READ_CHUNK_ELEMENTS = 1 << 22

# Non-persistent buffers that some old exports still contain; we recompute them.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
KV_CACHE_SCALES = ("self_attn.k_scale", "self_attn.v_scale", "self_attn.kv_scale")
FLOAT8_DTYPES = (
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
)


class WeightsError(RuntimeError):
    pass


class _SafetensorsSource:
    def __init__(self, files: Sequence[Path], weight_map: dict[str, str] | None) -> None:
        self._files = {f.name: f for f in files}
        # Headers only: shapes and where each tensor lives, read once; no data is touched.
        self._shapes: dict[str, list[int]] = {}
        found: dict[str, str] = {}
        for file_name, path in self._files.items():
            handle = safe_open(str(path), framework="pt")
            for key in handle.keys():
                self._shapes[key] = list(handle.get_slice(key).get_shape())
                found[key] = file_name
        self._map = found if weight_map is None else weight_map

    def keys(self) -> Iterable[str]:
        return self._map.keys()

    def shape(self, name: str) -> list[int]:
        if name not in self._shapes:
            raise WeightsError(f"the index maps {name!r} to {self._map[name]}, which lacks it")
        return self._shapes[name]

    @contextmanager
    def view(self, name: str, index: tuple[slice, ...]) -> Iterator[torch.Tensor]:
        """`name[index]`, valid inside the block only. A handle per read (~1 ms): when it and
        the view go, the mapping goes, and the pages this read touched stop counting as ours."""
        self.shape(name)  # a stale index fails with a clear message
        handle = safe_open(str(self._files[self._map[name]]), framework="pt")
        yield handle.get_slice(name)[index]


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

    @contextmanager
    def view(self, name: str, index: tuple[slice, ...]) -> Iterator[torch.Tensor]:
        # The whole file stays mapped until loading ends: .bin is the legacy path.
        yield self._tensors[name][index]


def _open_source(model_dir: Path) -> _SafetensorsSource | _TorchSource | GgufSource:
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
    ggufs = sorted(model_dir.glob("*.gguf"))
    if len(ggufs) == 1:  # the launcher's directory for a GGUF model (shard/gguf/convert.py)
        from shard.gguf.source import GgufSource

        return GgufSource(ggufs[0])
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
    raise WeightsError(f"no .safetensors, .gguf, .bin or .pth weights in {model_dir}")


class Weights:
    """This rank's view of a checkpoint. Floating tensors come back in `dtype` on `device`."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: torch.dtype,
        device: torch.device,
        dist: Distributed,
        quantization: QuantizationConfig | None = None,
        triton: bool = False,
        expert_parallel: bool = False,
    ) -> None:
        self.model_dir = Path(model_dir)
        # How the checkpoint's linears are stored; the TP linears pick their method from it.
        self.quantization = quantization
        # Quantized layers use the Triton kernels (always on CUDA; interpreted on CPU when the
        # shard runs its attention in Triton too, which is how tests run them end to end).
        self.triton = triton
        # Mixture-of-Experts layers: each rank reads whole experts (E/N of them) instead of a
        # slice of every expert (shard/layers/moe.py).
        self.expert_parallel = expert_parallel
        self.dtype = dtype
        self.device = device
        self.dist = dist
        self._source = _open_source(self.model_dir)
        self._keys = set(self._source.keys())
        self.consumed: set[str] = set()
        # 2-D tensors stored [in, out] (GPT-2's Conv1D), read as their transposes
        self._transposed: set[str] = set()

    def read_transposed(self, names: Iterable[str]) -> None:
        """The 2-D tensors `names` (those present) are stored input dimension first (GPT-2's
        Conv1D weights): every read sees their transposes, [out, in] as a Linear's."""
        self._transposed.update(n for n in names if n in self._keys)

    def has(self, name: str) -> bool:
        return name in self._keys

    def has_module(self, prefix: str) -> bool:
        """Whether the checkpoint holds any tensor of module `prefix` (its weight, or a
        quantized format's qweight, scales...)."""
        return any(key.startswith(f"{prefix}.") for key in self._keys)

    def shape(self, name: str) -> list[int]:
        self._require(name)
        shape = self._source.shape(name)
        return shape[::-1] if name in self._transposed else shape

    def mark_consumed(self, name: str) -> None:
        """For tensors deliberately skipped, e.g. a saved lm_head that is tied to the embedding."""
        self._require(name)
        self.consumed.add(name)

    def skip_kv_cache_scales(self) -> bool:
        """An FP8 checkpoint's KV-cache scales (compressed-tensors' `kv_cache_scheme`,
        `self_attn.k_scale` / `v_scale`): for an FP8 KV cache, which this server does not keep
        (its cache stays in the model's dtype, as vLLM's default `--kv-cache-dtype auto` does).
        Deliberately not loaded; whether there were any."""
        found = {k for k in self._keys if k.endswith(KV_CACHE_SCALES)}
        self.consumed.update(found)
        return bool(found)

    def skip_modules(self, prefixes: tuple[str, ...]) -> None:
        """Every tensor under `prefixes` is deliberately not loaded (a vision tower that a
        text-only server never runs)."""
        self.consumed.update(k for k in self._keys if k.startswith(prefixes))

    def skip_named(self, part: str) -> None:
        """Every tensor with `part` in its name is deliberately not loaded (ERNIE 4.5's
        multi-token-prediction modules, which transformers drops by that substring too)."""
        self.consumed.update(k for k in self._keys if part in k)

    def get_tensor(self, name: str, *, stored_dtype: bool = False) -> torch.Tensor:
        """The whole tensor, for replicated parameters (norms)."""
        shape = self.shape(name)
        if shape:
            return self.get_range(name, 0, 0, shape[0], stored_dtype=stored_dtype)
        with self._source.view(name, ()) as view:  # a scalar has no dimension to slice
            dtype = view.dtype if stored_dtype else self._dtype_of(name, view)
            out = view.to(dtype, copy=True).to(self.device)
        self.consumed.add(name)
        return out

    def get_range(
        self, name: str, dim: int, start: int, stop: int, *, stored_dtype: bool = False
    ) -> torch.Tensor:
        """Rows `start:stop` of `name` along `dim`."""
        return self.get_concat([(name, start, stop)], dim, stored_dtype=stored_dtype)

    def get_sharded(self, name: str, dim: int) -> torch.Tensor:
        """This rank's equal 1/world_size block of `name` along `dim`."""
        size = self.shape(name)[dim]
        start, stop = self.shard_bounds(name, dim, size)
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
            start, stop = self.shard_bounds(name, dim, size)
            pieces.append((name, offset + start, offset + stop))
            offset += size
        return self.get_concat(pieces, dim)

    def get_multi_sharded(self, names: Sequence[str], dim: int) -> torch.Tensor:
        """Shards each tensor along `dim` and concatenates this rank's slices (fused layers)."""
        pieces = []
        for name in names:
            start, stop = self.shard_bounds(name, dim, self.shape(name)[dim])
            pieces.append((name, start, stop))
        return self.get_concat(pieces, dim)

    def get_concat(
        self,
        pieces: Sequence[tuple[str, int, int]],
        dim: int,
        size: int | None = None,
        *,
        stored_dtype: bool = False,
    ) -> torch.Tensor:
        """Ranges (name, start, stop) along `dim`, concatenated, zero-padded to `size` along it.
        `stored_dtype` keeps floating tensors in the checkpoint's dtype (quantization scales,
        which rounding to the model's dtype would change).

        Every piece is copied once, straight into its place in the result: fused and padded
        parameters need no torch.cat, so loading never holds a second copy of them.
        """
        if not pieces:
            raise WeightsError("nothing to read")
        shapes = [self.shape(name) for name, _, _ in pieces]
        dim = dim % len(shapes[0])
        filled = 0
        for (name, start, stop), shape in zip(pieces, shapes, strict=True):
            if not 0 <= start <= stop <= shape[dim]:
                raise WeightsError(
                    f"{name}: range {start}:{stop} outside dim {dim} of shape {shape}"
                )
            if [n for d, n in enumerate(shape) if d != dim] != [
                n for d, n in enumerate(shapes[0]) if d != dim
            ]:
                raise WeightsError(f"{name} {shape} cannot join {pieces[0][0]} {shapes[0]}")
            filled += stop - start
        total = filled if size is None else size
        if total < filled:
            raise WeightsError(f"{filled} rows along dim {dim} do not fit in {total}")
        out_shape = list(shapes[0])
        out_shape[dim] = total
        out: torch.Tensor | None = None
        offset = 0
        for (name, start, stop), shape in zip(pieces, shapes, strict=True):
            if name in self._transposed:  # the stored [in, out] slice, transposed whole
                stored = (slice(None), slice(start, stop)) if dim == 0 else (slice(start, stop),)
                with self._source.view(name, stored) as view:
                    if out is None:
                        dtype = view.dtype if stored_dtype else self._dtype_of(name, view)
                        out = torch.empty(out_shape, dtype=dtype, device=self.device)
                    out.narrow(dim, offset, stop - start).copy_(view.t())
                self.consumed.add(name)
                offset += stop - start
                continue
            # Chunks of rows (dim 0), each through its own mapping: a column slice touches the
            # pages of every row, so reading it whole would map the whole tensor at once.
            lo, hi = (start, stop) if dim == 0 else (0, shape[0])
            step = max(1, READ_CHUNK_ELEMENTS // max(1, math.prod(shape[1:])))
            cols = (slice(start, stop),) if dim else ()
            for r0 in range(lo, hi, step):
                r1 = min(r0 + step, hi)
                index = (slice(r0, r1), *(slice(None) for _ in range(1, dim)), *cols)
                with self._source.view(name, index) as view:
                    if out is None:
                        dtype = view.dtype if stored_dtype else self._dtype_of(name, view)
                        out = torch.empty(out_shape, dtype=dtype, device=self.device)
                    dest = out.narrow(dim, offset, stop - start).narrow(0, r0 - lo, r1 - r0)
                    # One pass converts the dtype, gathers a strided slice, crosses devices.
                    dest.copy_(view)
            self.consumed.add(name)
            offset += stop - start
        if out is None:  # every piece was empty
            out = torch.empty(out_shape, dtype=self.dtype, device=self.device)
        out.narrow(dim, filled, total - filled).zero_()
        return out

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

    def shard_bounds(self, name: str, dim: int, size: int) -> tuple[int, int]:
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

    def _dtype_of(self, name: str, view: torch.Tensor) -> torch.dtype:
        if view.dtype in FLOAT8_DTYPES:
            # Converting FP8 values without their scales would load wrong weights silently.
            raise WeightsError(
                f"{name} is stored in {view.dtype}, but the checkpoint's quantization_config "
                "does not describe it as an FP8 weight with scales, so it cannot be loaded"
            )
        return self.dtype if view.is_floating_point() else view.dtype  # ids keep their type
