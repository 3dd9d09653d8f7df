"""The LayerNorm architectures' configs (StarCoder2, Phi, StableLM, Nemotron, OLMo, GPT-NeoX):
what the blocks cannot serve is refused by name, and the options reach the blocks (the logits
against transformers: the vs-transformers, CPU-decode, chunked-prefill and tensor-parallel
tests' cases)."""

from __future__ import annotations

import torch
from config_edits import assert_refused
from safetensors.torch import load_file

from shard.distributed import Distributed
from shard.layers.norm import BiasLayerNorm, LayerNorm1P, WeightlessLayerNorm
from shard.layers.qk_norm import PerHeadLayerNorm
from shard.models import load_model

CPU = torch.device("cpu")


def _load(path, dtype=torch.bfloat16):
    return load_model(path, dtype=dtype, device=CPU, dist=Distributed())


def test_olmo_clip_qkv_must_be_positive(tiny_model, tmp_path):
    assert_refused(tiny_model("olmo_weightless_norms_clip"), tmp_path / "o", {"clip_qkv": -1.0},
                   "clip_qkv")  # fmt: skip


def test_phi_qk_layernorm_needs_heads_of_hidden_over_heads(tiny_model, tmp_path):
    # transformers sizes Phi's q/k LayerNorms hidden_size / heads wide, whatever head_dim says
    assert_refused(tiny_model("phi_qk_layernorm_tied"), tmp_path / "p", {"head_dim": 32},
                   "qk_layernorm")  # fmt: skip


def test_nemotron_norms_keep_one_plus_w_rounded_to_the_dtype(tiny_model):
    path = tiny_model("nemotron_layernorm1p_relu2")
    model = _load(path)
    stored = load_file(path / "model.safetensors")["model.layers.0.input_layernorm.weight"]
    norm = model.layers[0].input_layernorm
    assert isinstance(norm, LayerNorm1P) and norm.bias is not None
    assert torch.equal(norm.weight, stored.to(torch.bfloat16) + 1.0)


def test_olmo_norms_read_nothing_and_clip_reaches_attention(tiny_model):
    model = _load(tiny_model("olmo_weightless_norms_clip"))
    assert isinstance(model.norm, WeightlessLayerNorm) and not list(model.norm.parameters())
    assert all(layer.self_attn.clip_qkv == 0.3 for layer in model.layers)


def test_phi_layers_are_parallel_with_a_biased_head(tiny_model):
    model = _load(tiny_model("phi_qk_layernorm_tied"))
    layer = model.layers[0]
    assert layer.parallel and layer.parallel_outputs_summed and layer.parallel_mlp_norm is None
    assert isinstance(model.norm, BiasLayerNorm) and model.norm.weight.dtype == torch.bfloat16
    assert model.lm_head.bias is not None and model.lm_head.bias.shape == (model.vocab_size,)
    assert model.config.tie_word_embeddings  # the weight tied, the bias its own


def test_gpt_neox_mlp_reads_its_own_norm_and_stablelm_norms_per_head(tiny_model):
    neox = _load(tiny_model("gpt_neox_parallel_two_norms")).layers[0]
    assert neox.parallel and isinstance(neox.parallel_mlp_norm, BiasLayerNorm)
    stablelm = _load(tiny_model("stablelm2_parallel_qk_layernorm")).layers[0]
    q_norm = stablelm.self_attn.qk_norm.q_norm
    assert isinstance(q_norm, PerHeadLayerNorm) and q_norm.weight.shape == (4, 16)
    assert not stablelm.parallel_outputs_summed  # attention's output joins the stream first
