"""Weights: slice reads per rank, fused reads, checkpoint formats, consumed-key bookkeeping."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import shard.weights as weights_module
from shard.distributed import Distributed
from shard.weights import Weights, WeightsError

CPU = torch.device("cpu")
TENSORS = {
    "a.weight": torch.arange(24, dtype=torch.float32).reshape(6, 4),
    "b.weight": torch.arange(12, dtype=torch.float32).reshape(4, 3) * -1,
    "fused.weight": torch.arange(40, dtype=torch.float32).reshape(10, 4),
    "ids": torch.arange(4, dtype=torch.int32),
}


def open_weights(path, rank=0, world=1, dtype=torch.float32) -> Weights:
    # Reads never communicate, so a rank of a larger world can be simulated in one process.
    return Weights(path, dtype=dtype, device=CPU, dist=Distributed(rank=rank, world_size=world))


@pytest.fixture
def single(tmp_path):
    save_file(TENSORS, tmp_path / "model.safetensors")
    return tmp_path


@pytest.mark.parametrize("dim", [0, 1])
def test_get_sharded_gives_each_rank_its_block(single, dim):
    parts = [open_weights(single, r, 2).get_sharded("a.weight", dim) for r in range(2)]
    for part, expected in zip(parts, TENSORS["a.weight"].chunk(2, dim), strict=True):
        assert torch.equal(part, expected)


def test_get_sharded_names_tensor_dim_and_world_size_when_indivisible(single):
    with pytest.raises(WeightsError, match=r"b\.weight.*dim 1.*size 3.*world size 2"):
        open_weights(single, 0, 2).get_sharded("b.weight", 1)


@pytest.mark.parametrize("rank", [0, 1])
def test_packed_and_multi_sharded_pack_per_rank(single, rank):
    w = open_weights(single, rank, 2)
    blocks = TENSORS["fused.weight"].split([6, 4])
    packed = w.get_packed_sharded("fused.weight", 0, [6, 4])
    assert torch.equal(packed, torch.cat([blocks[0].chunk(2)[rank], blocks[1].chunk(2)[rank]]))
    multi = w.get_multi_sharded(["a.weight", "fused.weight"], 0)
    expected = torch.cat(
        [TENSORS["a.weight"].chunk(2)[rank], TENSORS["fused.weight"].chunk(2)[rank]]
    )
    assert torch.equal(multi, expected)
    with pytest.raises(WeightsError, match="do not add up"):
        w.get_packed_sharded("fused.weight", 0, [6, 3])


def test_reads_only_through_get_slice(single, monkeypatch):
    real_open = weights_module.safe_open

    class SliceOnly:
        def __init__(self, *args, **kwargs):
            self._f = real_open(*args, **kwargs)

        def keys(self):
            return self._f.keys()

        def get_slice(self, name):
            return self._f.get_slice(name)

        def get_tensor(self, name):
            raise AssertionError(f"read the whole of {name}")

    monkeypatch.setattr(weights_module, "safe_open", SliceOnly)
    w = open_weights(single, 1, 2)
    assert torch.equal(w.get_sharded("a.weight", 0), TENSORS["a.weight"][3:])
    assert torch.equal(w.get_tensor("b.weight"), TENSORS["b.weight"])


def test_floats_take_the_model_dtype_integers_do_not(single):
    w = open_weights(single, dtype=torch.bfloat16)
    assert w.get_tensor("a.weight").dtype == torch.bfloat16
    assert w.get_tensor("ids").dtype == torch.int32


def test_consumed_keys_missing_and_unexpected(single):
    w = open_weights(single)
    with pytest.raises(WeightsError, match=r"missing tensor 'nope\.weight'"):
        w.get_tensor("nope.weight")
    w.get_tensor("a.weight")
    w.get_sharded("b.weight", 0)
    with pytest.raises(WeightsError, match=r"fused\.weight, ids") as err:
        w.check_all_consumed()
    assert "a.weight" not in str(err.value)
    w.get_tensor("fused.weight")
    w.mark_consumed("ids")
    w.check_all_consumed()


def test_rotary_inv_freq_buffers_are_not_unexpected(tmp_path):
    save_file(
        {"x": torch.ones(2), "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(2)},
        tmp_path / "model.safetensors",
    )
    w = open_weights(tmp_path)
    w.get_tensor("x")
    w.check_all_consumed()


def test_sharded_safetensors_follow_the_index(tmp_path):
    save_file({"a.weight": TENSORS["a.weight"]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"b.weight": TENSORS["b.weight"]}, tmp_path / "model-00002-of-00002.safetensors")
    index = {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors",
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    w = open_weights(tmp_path, 1, 2)
    assert torch.equal(w.get_sharded("a.weight", 1), TENSORS["a.weight"][:, 2:])
    assert torch.equal(w.get_sharded("b.weight", 0), TENSORS["b.weight"][2:])
    w.check_all_consumed()


def test_torch_checkpoints_load_with_weights_only(tmp_path):
    torch.save(TENSORS, tmp_path / "pytorch_model.bin")
    w = open_weights(tmp_path, 0, 2)
    assert torch.equal(w.get_sharded("a.weight", 0), TENSORS["a.weight"][:3])


class NotATensor:
    pass


def test_torch_checkpoints_refuse_arbitrary_pickles(tmp_path):
    torch.save({"a.weight": TENSORS["a.weight"], "evil": NotATensor()}, tmp_path / "model.pth")
    with pytest.raises(Exception, match="(?i)weights_only|unsupported global|NotATensor"):
        open_weights(tmp_path)


def test_directory_without_weights_fails(tmp_path):
    with pytest.raises(WeightsError, match="no .safetensors"):
        open_weights(tmp_path)
