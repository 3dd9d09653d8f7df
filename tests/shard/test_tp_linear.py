"""Column, fused and row linears against plain nn.Linear, for every rank of a simulated world."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from shard.distributed import Distributed
from shard.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    head_range,
)
from shard.platforms.cpu.matmul import dense
from shard.weights import Weights, WeightsError

CPU = torch.device("cpu")
HIDDEN, HEADS, KV_HEADS, D = 16, 4, 2, 4


def weights_at(path, rank=0, world=1) -> Weights:
    # Column layers never communicate, so any rank can be simulated in one process.
    return Weights(
        path, dtype=torch.float32, device=CPU, dist=Distributed(rank=rank, world_size=world)
    )


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    t = {
        "q.weight": torch.randn(HEADS * D, HIDDEN),
        "q.bias": torch.randn(HEADS * D),
        "k.weight": torch.randn(KV_HEADS * D, HIDDEN),
        "k.bias": torch.randn(KV_HEADS * D),
        "v.weight": torch.randn(KV_HEADS * D, HIDDEN),
        "v.bias": torch.randn(KV_HEADS * D),
        "gate.weight": torch.randn(24, HIDDEN),
        "up.weight": torch.randn(24, HIDDEN),
        "down.weight": torch.randn(HIDDEN, 24),
        "down.bias": torch.randn(HIDDEN),
    }
    # The same projections as checkpoints that already fuse them (e.g. Phi-3 style exports).
    t["qkv.weight"] = torch.cat([t["q.weight"], t["k.weight"], t["v.weight"]])
    t["qkv.bias"] = torch.cat([t["q.bias"], t["k.bias"], t["v.bias"]])
    t["gate_up.weight"] = torch.cat([t["gate.weight"], t["up.weight"]])
    path = tmp_path_factory.mktemp("linear")
    save_file(t, path / "model.safetensors")
    return path, t


@pytest.mark.parametrize("world", [1, 2, 4])
def test_column_parallel_ranks_concatenate_to_the_full_output(ckpt, world):
    path, t = ckpt
    x = torch.randn(5, HIDDEN)
    outs = [
        ColumnParallelLinear.load(weights_at(path, r, world), "q", bias=True)(x)
        for r in range(world)
    ]
    torch.testing.assert_close(torch.cat(outs, -1), x @ t["q.weight"].T + t["q.bias"])


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("world", [1, 2])
def test_gate_up_packs_gate_and_up_per_rank(ckpt, world, fused):
    path, t = ckpt
    prefixes = ["gate_up"] if fused else ["gate", "up"]
    x = torch.randn(3, HIDDEN)
    for r in range(world):
        layer = MergedColumnParallelLinear.load_merged(
            weights_at(path, r, world), prefixes, bias=False, num_blocks=2
        )
        gate, up = layer.split(layer(x))
        torch.testing.assert_close(gate, (x @ t["gate.weight"].T).chunk(world, -1)[r])
        torch.testing.assert_close(up, (x @ t["up.weight"].T).chunk(world, -1)[r])


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("world", [1, 2, 4])  # 4 ranks > 2 KV heads: each KV head on 2 ranks
def test_qkv_gives_each_rank_its_query_heads_and_their_kv_heads(ckpt, world, fused):
    path, t = ckpt
    x = torch.randn(3, HIDDEN)
    full = {n: (x @ t[f"{n}.weight"].T + t[f"{n}.bias"]).view(3, -1, D) for n in "qkv"}
    prefixes = ["qkv"] if fused else ["q", "k", "v"]
    group = HEADS // KV_HEADS
    for r in range(world):
        layer = QKVParallelLinear.load_qkv(
            weights_at(path, r, world),
            prefixes,
            num_heads=HEADS,
            num_kv_heads=KV_HEADS,
            head_dim=D,
            bias=True,
        )
        q, k, v = layer.split(layer(x))
        q_heads = list(range(r * HEADS // world, (r + 1) * HEADS // world))
        kv_heads = sorted({h // group for h in q_heads})  # the KV heads these queries attend to
        assert (layer.num_heads, layer.num_kv_heads) == (len(q_heads), len(kv_heads))
        torch.testing.assert_close(q, full["q"][:, q_heads])
        torch.testing.assert_close(k, full["k"][:, kv_heads])
        torch.testing.assert_close(v, full["v"][:, kv_heads])


@pytest.mark.parametrize("fused", [False, True])
def test_qkv_names_the_tensor_its_dim_and_the_world_size_when_heads_do_not_split(ckpt, fused):
    path, _ = ckpt
    name = "qkv" if fused else "q"
    with pytest.raises(WeightsError, match=rf"{name}\.weight along dim 0: 4 heads .* size 3"):
        QKVParallelLinear.load_qkv(
            weights_at(path, 0, 3),
            ["qkv"] if fused else ["q", "k", "v"],
            num_heads=HEADS,
            num_kv_heads=KV_HEADS,
            head_dim=D,
            bias=False,
        )


def test_head_range_refuses_uneven_splits():
    assert head_range(2, 3, 4, replicate=True) == (1, 2)
    with pytest.raises(WeightsError, match="3 heads cannot be split across world size 2"):
        head_range(3, 0, 2, replicate=True)
    with pytest.raises(WeightsError, match="2 heads"):
        head_range(2, 0, 4, replicate=False)


def test_row_parallel_at_world_size_one_is_a_linear(ckpt):
    path, t = ckpt
    x = torch.randn(3, 24)
    layer = RowParallelLinear.load(weights_at(path), "down", bias=True)
    torch.testing.assert_close(layer(x), x @ t["down.weight"].T + t["down.bias"])


@pytest.mark.parametrize("rank", [0, 1])
def test_row_parallel_reads_its_input_columns_and_only_rank0_the_bias(ckpt, rank):
    path, t = ckpt
    w = weights_at(path, rank, 2)
    layer = RowParallelLinear.load(w, "down", bias=True)
    assert torch.equal(dense(layer.weight.weight), t["down.weight"][:, 12 * rank : 12 * (rank + 1)])
    if rank == 0:
        assert torch.equal(layer.bias, t["down.bias"])
    else:  # summed over ranks, a bias on every rank would count world_size times
        assert layer.bias is None
    assert {"down.weight", "down.bias"} <= w.consumed
