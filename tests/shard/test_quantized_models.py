"""Int4 checkpoints made by AutoAWQ, GPTQModel and compressed-tensors, served by our loaders,
against the same models dequantized by those libraries and run by transformers in float32."""

from __future__ import annotations

import pytest
import torch
from paged_helpers import assert_equals_reference, run_paged
from quant_fixtures import (
    CPU,
    SERVED,
    fixture,
    quant_config,
    reference_weights,
    splits_gate_up,
    weights_at,
)
from transformers import AutoModelForCausalLM

from shard.distributed import Distributed
from shard.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from shard.layers.quant.base import Piece
from shard.layers.quant.int4_dequant import DequantizingInt4
from shard.layers.quant.select import linear_method
from shard.models import load_config, load_model
from shard.models.names import LLAMA_NAMES
from shard.models.phi3 import PHI3_NAMES, Phi3ForCausalLM
from shard.weights import Weights, WeightsError

STEPS = 4
ATOL = 1e-4
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32  # every fixture's shape (tests/quant_fixtures/build.py)
ATTN, MLP = "model.layers.{i}.self_attn", "model.layers.{i}.mlp"
# gptqmodel 7.7.0 writes Phi-3 with qkv_proj fused but gate_up_proj split into gate_proj and
# up_proj (shard/models/phi3.py reads either layout).
SPLIT_GATE_UP = [n for n in SERVED if splits_gate_up(n)]


def prompts(vocab_size: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab_size, (n,), generator=gen) for n in (19, 33)]


def _matches_transformers(ours, name: str) -> None:
    assert all(isinstance(layer.mlp.down_proj.weight, DequantizingInt4) for layer in ours.layers)
    ref = AutoModelForCausalLM.from_pretrained(fixture(name) / "reference", dtype=torch.float32)
    batch = prompts(ours.vocab_size)
    logits, tokens = run_paged(ours, batch, STEPS, seed=3)
    assert_equals_reference(ref, batch, logits, tokens, ATOL)


@pytest.mark.parametrize("name", SERVED)
def test_logits_and_greedy_ids_match_transformers_on_the_library_dequantized_model(name):
    ours = load_model(fixture(name), dtype=torch.float32, device=CPU, dist=Distributed())
    _matches_transformers(ours, name)


@pytest.mark.parametrize("name", SPLIT_GATE_UP)
def test_phi3_reads_the_layout_its_quantizer_wrote(name):
    """gptqmodel's Phi-3 (one packed qkv_proj, gate/up split) loads by the names it has."""
    path = fixture(name)
    weights = Weights(path, dtype=torch.float32, device=CPU, dist=Distributed(),
                      quantization=load_config(path).quantization)  # fmt: skip
    assert Phi3ForCausalLM.names_for(weights)["gate_up_proj"] == LLAMA_NAMES["gate_up_proj"]
    assert Phi3ForCausalLM.names_for(weights)["qkv_proj"] == PHI3_NAMES["qkv_proj"]


def _fused_or_split(has, fused: str, split: list[str]) -> list[str]:
    return [fused] if has(fused) else split


def _layers(weights, layer: int):
    names = {k: v.format(i=layer) for k, v in {"attn": ATTN, "mlp": MLP}.items()}
    attn, mlp = names["attn"], names["mlp"]

    def has(prefix: str) -> bool:  # a linear of the checkpoint, in any format
        return any(weights.has(f"{prefix}.{t}") for t in ("weight", "qweight", "weight_packed"))

    qkv_prefixes = _fused_or_split(has, f"{attn}.qkv_proj", [f"{attn}.{p}_proj" for p in "qkv"])
    qkv = QKVParallelLinear.load_qkv(
        weights,
        qkv_prefixes,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        bias=weights.has(f"{qkv_prefixes[0]}.bias"),
    )
    gate_up = MergedColumnParallelLinear.load_merged(
        weights,
        _fused_or_split(has, f"{mlp}.gate_up_proj", [f"{mlp}.gate_proj", f"{mlp}.up_proj"]),
        bias=False,
        num_blocks=2,
    )
    o = RowParallelLinear.load(weights, f"{names['attn']}.o_proj", bias=False)
    down = RowParallelLinear.load(weights, f"{names['mlp']}.down_proj", bias=False)
    return {"qkv": qkv, "gate_up": gate_up, "o": o, "down": down}


def _expected(ref: dict[str, torch.Tensor], layer: int) -> dict[str, torch.Tensor]:
    """The whole fused weights, [q; k; v] and [gate; up], from reference/ (fused or not)."""
    attn, mlp = ATTN.format(i=layer), MLP.format(i=layer)
    has = {k.removesuffix(".weight") for k in ref}.__contains__
    qkv = _fused_or_split(has, f"{attn}.qkv_proj", [f"{attn}.{p}_proj" for p in "qkv"])
    gate_up = _fused_or_split(has, f"{mlp}.gate_up_proj", [f"{mlp}.gate_proj", f"{mlp}.up_proj"])
    return {
        "qkv": torch.cat([ref[f"{p}.weight"] for p in qkv]),
        "gate_up": torch.cat([ref[f"{p}.weight"] for p in gate_up]),
        "o": ref[f"{attn}.o_proj.weight"],
        "down": ref[f"{mlp}.down_proj.weight"],
    }


def _dense(layer) -> torch.Tensor:
    """The layer's weight, dequantized: its matmul applied to the identity."""
    eye = torch.eye(layer.weight.in_features)
    return layer.weight(eye).T


@pytest.mark.parametrize("name", SERVED)
def test_loaded_int4_layers_equal_the_library_dequantized_weights_exactly(name):
    ref = reference_weights(name)
    for i in range(2):
        layers, want = _layers(weights_at(fixture(name)), i), _expected(ref, i)
        for key, layer in layers.items():
            assert torch.equal(_dense(layer), want[key].float()), f"layer {i} {key}"


@pytest.mark.parametrize("name", [n for n in SERVED if quant_config(n).get("group_size") != 128])
def test_each_rank_of_two_holds_exactly_its_slice(name):
    """Column layers: each rank holds its slice of every fused block ([q_r, k_r, v_r],
    [gate_r, up_r]); row layers: the input columns of its half, on group boundaries."""
    want = _expected(reference_weights(name), 1)
    ranks = [_layers(weights_at(fixture(name), r, 2), 1) for r in range(2)]
    for key in ("o", "down"):
        halves = [_dense(r[key]) for r in ranks]
        assert torch.equal(torch.cat(halves, dim=1), want[key].float()), key
    q, k, v = want["qkv"].split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM])
    gate, up = want["gate_up"].chunk(2)
    for rank, r in enumerate(ranks):
        qkv = torch.cat([t.chunk(2)[rank] for t in (q, k, v)])
        assert torch.equal(_dense(r["qkv"]), qkv.float()), f"rank {rank} qkv"
        gate_up = torch.cat([gate.chunk(2)[rank], up.chunk(2)[rank]])
        assert torch.equal(_dense(r["gate_up"]), gate_up.float()), f"rank {rank} gate_up"


def _weight_bytes(layers) -> int:
    return sum(b.numel() * b.element_size() for layer in layers.values() for b in layer.buffers())


@pytest.mark.parametrize(
    "name", ["awq_gemm_g64_llama", "ct_w4a16_group64_sym_llama", "gptq_g32_sym_phi3"]
)
def test_a_rank_of_two_holds_half_of_the_packed_weights(name):
    whole = _weight_bytes(_layers(weights_at(fixture(name)), 0))
    for rank in range(2):
        half = _weight_bytes(_layers(weights_at(fixture(name), rank, 2), 0))
        # KV heads split, groups split: exactly half, give or take nothing.
        assert half * 2 == whole, (rank, half, whole)


PHI3 = "gptq_g32_sym_phi3"
PHI3_QKV = "model.layers.0.self_attn.qkv_proj"


def test_word_aligned_column_pieces_of_a_fused_packed_tensor_are_exact():
    """Pieces of gptqmodel's one qkv_proj tensor at any multiple of 8 output features (a word of
    qzeros), not only on head boundaries, hold exactly those rows of the library's weight."""
    weights = weights_at(fixture(PHI3))
    want = reference_weights(PHI3)[f"{PHI3_QKV}.weight"]
    spans = [(8, 40), (136, 144), (200, 256)]  # inside q, inside k, across v's start to its end
    layer = linear_method(weights, [PHI3_QKV]).load_columns(
        weights, [Piece(PHI3_QKV, a, b) for a, b in spans]
    )
    expected = torch.cat([want[a:b] for a, b in spans])
    assert torch.equal(layer(torch.eye(layer.in_features)).T, expected)


@pytest.mark.parametrize(
    ("name", "prefix", "span", "tensor"),
    [
        # AWQ packs 8 output features into each word of qweight (and qzeros)
        ("awq_gemm_g64_llama", "model.layers.0.mlp.up_proj", (4, 132), "qweight"),
        # GPTQ's qweight packs inputs, but qzeros packs 8 output features into each word
        (PHI3, PHI3_QKV, (132, 196), "qzeros"),
    ],
)
def test_a_column_piece_that_cuts_a_packed_word_is_refused_naming_the_tensor(
    name, prefix, span, tensor
):
    weights = weights_at(fixture(name))
    method = linear_method(weights, [prefix])
    with pytest.raises(WeightsError, match=rf"{prefix}\.{tensor}: features {span[0]}:{span[1]} "):
        method.load_columns(weights, [Piece(prefix, *span)])
