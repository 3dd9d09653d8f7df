"""What a rank keeps after loading: its own copy of its slice, and no mapping of the checkpoint.

safetensors' get_slice returns a view into the file's mmap. A parameter left as such a view
would pin the mapping, and every checkpoint page the rank touched would stay in its RSS
(bench/load_memory.py measures it; docs/tensor-parallel.md has the numbers).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import shard.weights as weights_module
from shard.distributed import Distributed
from shard.models import load_model
from shard.weights import Weights

CPU = torch.device("cpu")
GEN = torch.Generator().manual_seed(0)
TENSORS = {
    "mat": torch.randn(6, 10, generator=GEN),
    "cube": torch.randn(4, 6, 8, generator=GEN),
    "other": torch.randn(3, 10, generator=GEN),
    "wide": torch.randn(6, 4, generator=GEN),
    "vec": torch.randn(10, generator=GEN),
}


def open_weights(path: Path, rank: int = 0, world: int = 1) -> Weights:
    return Weights(path, dtype=torch.float32, device=CPU, dist=Distributed(rank, world))


def mapped_files() -> str:
    return Path("/proc/self/maps").read_text()


def owns_its_memory(t: torch.Tensor) -> bool:
    if t.is_mkldnn:  # packed for the CPU GEMM (shard/platforms/cpu/matmul.py): a new oneDNN buffer
        return True
    return t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()


@pytest.fixture
def ckpt(tmp_path):
    save_file(TENSORS, tmp_path / "model.safetensors")
    return tmp_path


def test_reads_own_their_memory_and_leave_nothing_mapped(ckpt):
    w = open_weights(ckpt, 1, 2)
    reads = [
        w.get_sharded("mat", 0),
        w.get_sharded("mat", 1),  # a strided column slice
        w.get_tensor("vec"),
        w.get_multi_sharded(["mat", "wide"], 1),
    ]
    assert all(owns_its_memory(t) for t in reads)
    if Path("/proc/self/maps").exists():
        assert str(ckpt / "model.safetensors") not in mapped_files()


# Elements per mapping: one row at a time, a few rows, everything at once.
@pytest.mark.parametrize("chunk", [1, 7, 1 << 22])
def test_chunked_reads_equal_plain_slicing(ckpt, monkeypatch, chunk):
    monkeypatch.setattr(weights_module, "READ_CHUNK_ELEMENTS", chunk)
    w = open_weights(ckpt)
    mat, cube = TENSORS["mat"], TENSORS["cube"]
    assert torch.equal(w.get_range("mat", 0, 1, 5), mat[1:5])
    assert torch.equal(w.get_range("mat", 1, 3, 9), mat[:, 3:9])
    assert torch.equal(w.get_range("cube", 1, 2, 5), cube[:, 2:5])
    assert torch.equal(w.get_range("cube", 2, 4, 8), cube[:, :, 4:8])
    assert torch.equal(w.get_tensor("vec"), TENSORS["vec"])
    pieces = [("mat", 4, 6), ("other", 0, 3), ("mat", 0, 1)]
    joined = torch.cat([mat[4:6], TENSORS["other"], mat[:1]])
    assert torch.equal(w.get_concat(pieces, 0), joined)
    padded = w.get_concat(pieces, 0, size=9)  # vocab padding: zero rows after the pieces
    assert torch.equal(padded, torch.cat([joined, torch.zeros(3, 10)]))
    columns = torch.cat([mat[:, 2:4], TENSORS["wide"][:, 1:3]], 1)  # fused along dim 1
    assert torch.equal(w.get_concat([("mat", 2, 4), ("wide", 1, 3)], 1), columns)


def test_a_loaded_model_keeps_only_its_own_copies(tmp_path):
    from launcher.tiny_models import build_model

    path = build_model(tmp_path / "m", num_key_value_heads=1, vocab_size=509)
    # Loading never communicates, so rank 1 of 2 can be built without a process group.
    model = load_model(path, dtype=torch.float32, device=CPU, dist=Distributed(1, 2))
    assert all(owns_its_memory(p) for p in model.parameters())
    if Path("/proc/self/maps").exists():
        assert str(path / "model.safetensors") not in mapped_files()
