"""A batch's sampling parameters as per-row tensors, and what the sampler derives from them.

Which rows sample, which truncate, and the flags that let sample() skip stages no row uses
are the host's to know: they decide which ops run and at what shapes. They change only with
the batch's composition (Prefill, FilterBatch, concatenation), and deriving them from device
tensors would make the host wait for the device each time (and a step whose shapes the host
fixes ahead, as a captured CUDA graph, could not hold it). So every SamplingTensors keeps the
CPU tensors its rows were built from (the same tensors where the device is the CPU), derives
everything from those, and uploads the results in one copy.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from shard.platforms import platform_of
from shard.ragged import cat_padded, pad_rows
from shard.sampling import random_hash
from shard.sampling.params import SamplingParams

# Every column starts at a multiple of this many bytes in the packed upload, so that each
# dtype can view its slice of the one buffer.
_ALIGN = 8


# Where the host copy of every instance lives: the host, whatever device computes.
HOST = torch.device("cpu")


@dataclass(frozen=True)
class SamplingFlags:
    """Host-side summary of a batch, so that sample() skips unused stages without a sync.

    Warper flags count do_sample rows only: greedy rows never see the warpers.
    """

    any_temperature: bool = False
    any_top_k: bool = False
    any_top_p: bool = False
    any_typical: bool = False
    any_min_p: bool = False
    any_repetition: bool = False
    any_frequency: bool = False
    any_presence: bool = False
    any_logit_bias: bool = False
    max_top_k: int = 0

    @property
    def any_penalty(self) -> bool:
        return self.any_repetition or self.any_frequency or self.any_presence

    @classmethod
    def of_rows(cls, rows: dict[str, Tensor]) -> SamplingFlags:
        """Flags of per-row CPU tensors (a read of device tensors would wait for the device)."""
        sample = rows["do_sample"]
        if sample.numel() == 0:
            return cls()
        top_k = torch.where(sample, rows["top_k"], 0)
        *stats, max_top_k = torch.stack(
            [
                (sample & (rows["temperature"] != 1)).any(),
                (top_k > 0).any(),
                (sample & (rows["top_p"] < 1)).any(),
                (sample & (rows["typical_p"] < 1)).any(),
                (sample & (rows["min_p"] > 0)).any(),
                (rows["repetition_penalty"] != 1).any(),
                (rows["frequency_penalty"] != 0).any(),
                (rows["presence_penalty"] != 0).any(),
                (rows["bias_values"] != 0).any(),
                top_k.max(),
            ]
        ).tolist()
        return cls(*(bool(s) for s in stats), max_top_k=max_top_k)

    def merge(self, other: SamplingFlags) -> SamplingFlags:
        """Flags of the concatenation of two batches."""
        merged = {
            f.name: getattr(self, f.name) or getattr(other, f.name)
            for f in fields(self)
            if f.name != "max_top_k"
        }
        return SamplingFlags(**merged, max_top_k=max(self.max_top_k, other.max_top_k))


def _truncates(rows: dict[str, Tensor]) -> Tensor:
    """Rows whose sampled distribution is cut by top-k, top-p, min-p or typical-p."""
    cut = (rows["top_k"] > 0) | (rows["top_p"] < 1) | (rows["typical_p"] < 1) | (rows["min_p"] > 0)
    return rows["do_sample"] & cut


@dataclass(frozen=True)
class SamplingTensors:
    """Per-request parameters as [B] tensors, built once per batch composition.

    The rows are also split by how they are sampled: "dense" rows (greedy, or sampling from
    the whole vocabulary) and "truncated" rows (sampling after top-k/top-p/typical-p).
    """

    # `_host`, the same rows on the CPU, is a slot rather than a field: the fields are what
    # the sampler reads on the device, and what fields() and __dict__ list.
    __slots__ = ("__dict__", "_host")

    temperature: Tensor  # float32
    top_k: Tensor  # int64, 0 = off
    top_p: Tensor  # float32
    typical_p: Tensor  # float32
    min_p: Tensor  # float32, 0 = off
    do_sample: Tensor  # bool
    seed_lo: Tensor  # int64, low 32 bits of the seed
    seed_hi: Tensor  # int64, high 32 bits (seeds are taken modulo 2**64)
    repetition_penalty: Tensor  # float32
    frequency_penalty: Tensor  # float32
    presence_penalty: Tensor  # float32
    # int64: the history position of each row's first generated id (its prompt length), where
    # the frequency and presence penalties start counting.
    output_start: Tensor
    # [B, K]: each row's logit_bias, padded with (token 0, bias 0.0), which adds nothing.
    bias_ids: Tensor  # int64
    bias_values: Tensor  # float32
    dense_rows: Tensor  # int64 row indices, ascending
    dense_sampled: Tensor  # int64 positions in dense_rows of the do_sample rows
    truncated_rows: Tensor  # int64 row indices, ascending
    flags: SamplingFlags

    def __post_init__(self) -> None:
        if self.device == HOST:
            object.__setattr__(self, "_host", self)  # `to` sets it on other devices

    @classmethod
    def from_params(
        cls, params: list[SamplingParams], prompt_lens: list[int], device: torch.device | str
    ) -> SamplingTensors:
        seeds = [random_hash.split_seed(p.seed) for p in params]

        def column(values: list, dtype: torch.dtype) -> Tensor:
            return torch.tensor(values, dtype=dtype)

        # The flags come from the float32 values the kernels see (a top_p of 1 - 1e-9
        # rounds to 1.0).
        rows = {
            "temperature": column([p.temperature for p in params], torch.float32),
            "top_k": column([p.top_k for p in params], torch.int64),
            "top_p": column([p.top_p for p in params], torch.float32),
            "typical_p": column([p.typical_p for p in params], torch.float32),
            "min_p": column([p.min_p for p in params], torch.float32),
            "do_sample": column([p.do_sample for p in params], torch.bool),
            "seed_lo": column([lo for lo, _ in seeds], torch.int64),
            "seed_hi": column([hi for _, hi in seeds], torch.int64),
            "repetition_penalty": column([p.repetition_penalty for p in params], torch.float32),
            "frequency_penalty": column([p.frequency_penalty for p in params], torch.float32),
            "presence_penalty": column([p.presence_penalty for p in params], torch.float32),
            "output_start": column(list(prompt_lens), torch.int64),
            "bias_ids": pad_rows([[i for i, _ in p.logit_bias] for p in params], torch.int64),
            "bias_values": pad_rows([[b for _, b in p.logit_bias] for p in params], torch.float32),
        }
        return cls._of_rows(rows).to(device)

    @classmethod
    def _of_rows(cls, rows: dict[str, Tensor]) -> SamplingTensors:
        """From CPU tensors: nonzero and the flags read them, which costs nothing there."""
        truncated = _truncates(rows)
        dense_rows = (~truncated).nonzero().squeeze(1)
        return cls(
            **rows,
            dense_rows=dense_rows,
            dense_sampled=rows["do_sample"][dense_rows].nonzero().squeeze(1),
            truncated_rows=truncated.nonzero().squeeze(1),
            flags=SamplingFlags.of_rows(rows),
        )

    def _rows(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _DERIVED}

    def __len__(self) -> int:
        return self.do_sample.shape[0]

    @property
    def device(self) -> torch.device:
        return self.do_sample.device

    @property
    def draws(self) -> int:
        """Rows that draw at random (do_sample): the others choose greedily."""
        return self.dense_sampled.shape[0] + self.truncated_rows.shape[0]

    @property
    def host(self) -> SamplingTensors:
        """The same rows, derived rows and flags on the CPU (self where the device is the CPU)."""
        return self._host

    def to(self, device: torch.device | str) -> SamplingTensors:
        """These rows on `device`, uploaded from the host copy, which the result keeps."""
        device = torch.device(device)
        if device == HOST:
            return self._host
        if device == self.device:
            return self
        host = self._host
        tensors = {f.name: getattr(host, f.name) for f in fields(host) if f.name != "flags"}
        moved = SamplingTensors(**_upload(tensors, device), flags=host.flags)
        object.__setattr__(moved, "_host", host)
        return moved

    def index(self, keep: Tensor) -> SamplingTensors:
        """The rows selected by keep (int64 indices or a bool mask), e.g. for FilterBatch.

        keep belongs on the CPU: one on the device is read back, which waits for it."""
        if keep.device != HOST:
            keep = keep.cpu()
        host = self._host
        kept = SamplingTensors._of_rows({name: t[keep] for name, t in host._rows().items()})
        return kept.to(self.device)

    @classmethod
    def concat(cls, parts: list[SamplingTensors]) -> SamplingTensors:
        """The rows of every part, in order, e.g. when Decode receives several batches."""
        if not parts:
            raise ValueError("concat needs at least one part")
        if len(parts) == 1:
            return parts[0]
        hosts = [p.host for p in parts]
        names = hosts[0]._rows().keys()
        rows = {name: _cat_rows([getattr(h, name) for h in hosts]) for name in names}
        dense_rows, dense_sampled, truncated_rows = [], [], []
        row_offset, dense_offset, flags = 0, 0, SamplingFlags()
        for part in hosts:
            dense_rows.append(part.dense_rows + row_offset)
            dense_sampled.append(part.dense_sampled + dense_offset)
            truncated_rows.append(part.truncated_rows + row_offset)
            row_offset += len(part)
            dense_offset += part.dense_rows.shape[0]
            flags = flags.merge(part.flags)
        joined = cls(
            **rows,
            dense_rows=torch.cat(dense_rows),
            dense_sampled=torch.cat(dense_sampled),
            truncated_rows=torch.cat(truncated_rows),
            flags=flags,
        )
        return joined.to(parts[0].device)


_DERIVED = frozenset({"dense_rows", "dense_sampled", "truncated_rows", "flags"})


def _cat_rows(tensors: list[Tensor]) -> Tensor:
    """Concatenates rows; [B_i, K_i] parts are zero-padded to the widest first."""
    return torch.cat(tensors) if tensors[0].dim() == 1 else cat_padded(tensors)


def _upload(tensors: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """CPU tensors on `device`, from one copy: their bytes packed into one host buffer (the
    platform's, page-locked where that lets the copy run without the host waiting), each
    result a view of its slice of the one device buffer."""
    platform = platform_of(device)
    spans, total = {}, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        spans[name] = (total, size)
        total += -(-size // _ALIGN) * _ALIGN
    packed = platform.host_buffer(total, torch.uint8)
    for name, t in tensors.items():
        start, size = spans[name]
        packed[start : start + size] = t.contiguous().view(-1).view(torch.uint8)
    on_device = platform.upload(packed, device)
    return {
        name: on_device[start : start + size].view(t.dtype).view(t.shape)
        for (name, t), (start, size) in zip(tensors.items(), spans.values(), strict=True)
    }
