"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5) beyond the whole-model comparisons with
transformers (test_models_vs_transformers.py, and test_chunked_prefill.py, test_tensor_parallel.py,
test_cpu_decode.py, test_cuda_graphs.py, tests/kernels/test_models_triton.py): that those
comparisons exercise the choice, the cache rows that carry the indexer's keys, the dense
kernels and the chosen-rows path agreeing where every position is chosen, long prompts worked
through in chunks, and configs refused by field."""

from __future__ import annotations

import json

import pytest
import torch
from config_edits import assert_refused
from paged_helpers import assert_every_step_equals_reference, run_paged
from transformers import AutoModelForCausalLM

import shard.attention.sparse as sparse
import shard.models.sparse_attention as sparse_attention
from launcher.tiny_models import build_model
from shard.distributed import Distributed
from shard.models import load_model
from shard.platforms.cpu.compiled import check_supported
from tests.shard.tiny_model_cases import MOE_MODELS

CPU = torch.device("cpu")
V32 = "deepseek_v32_sparse_attention"
GLM5 = "glm_moe_dsa_shared_choice"
ML4 = "mistral_large4_sparse_nope"


def _load(path, dtype=torch.float32):
    return load_model(path, dtype=dtype, device=CPU, dist=Distributed())


def _prompts(vocab: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return [torch.randint(3, vocab, (n,), generator=gen) for n in (21, 37)]


@pytest.mark.parametrize("name", [V32, GLM5, ML4])
def test_the_choice_changes_what_the_model_computes(tiny_model, name):
    """The test prompts run past top_k: attending over every position instead of the chosen
    ones moves the logits far beyond the comparisons' tolerance, so equality with transformers
    there is equality of the choice."""
    model = _load(tiny_model(name))
    batch = _prompts(model.vocab_size)
    sparse_logits, _ = run_paged(model, batch, 2, seed=4)
    for layer in model.layers:
        layer.self_attn.top_k = 10_000
    dense_logits, _ = run_paged(model, batch, 2, seed=4)
    assert (sparse_logits[0] - dense_logits[0]).abs().max() > 0.1


def test_cache_rows_carry_the_indexer_keys_on_layers_with_an_indexer(tiny_model):
    """kv_lora_rank + qk_rope_head_dim + index_head_dim a token on the layers that run an
    indexer, the latent alone on GLM-5's shared layers; stored once (values are the keys)."""
    path = tiny_model(GLM5)
    config = json.loads((path / "config.json").read_text())
    model = _load(path, torch.bfloat16)
    latent = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    widths = [latent + config["index_head_dim"], latent, latent + config["index_head_dim"]]
    caches = model.allocate_kv_cache(3, 16)
    assert [c.shape for c in caches] == [(2, 3, 16, 1, w) for w in widths]
    assert all(c[0].data_ptr() == c[1].data_ptr() for c in caches)
    assert model.kv_cache_bytes_per_token() == sum(widths) * 2


@pytest.mark.parametrize("attention", ["torch", "triton"])
@pytest.mark.parametrize("name", [V32, GLM5, ML4])
def test_dense_kernels_equal_the_chosen_rows_where_every_position_is_chosen(
    tiny_model, monkeypatch, name, attention
):
    """With top_k past every context, the dense kernels (queries padded with zeros against the
    indexer's keys) and the decode kernel over the chosen rows (all of them, best first) give
    the same logits, with either backend's kernels (Triton's interpreted)."""
    model = load_model(
        tiny_model(name), dtype=torch.float32, device=CPU, dist=Distributed(), attention=attention
    )
    for layer in model.layers:
        layer.self_attn.top_k = 10_000
    batch = _prompts(model.vocab_size)
    dense, dense_tokens = run_paged(model, batch, 3, seed=4)
    monkeypatch.setattr(sparse_attention, "every_position_chosen", lambda *args: False)
    chosen, chosen_tokens = run_paged(model, batch, 3, seed=4)
    assert chosen_tokens == dense_tokens
    for a, b in zip(chosen, dense, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_long_prompts_are_chosen_and_attended_in_chunks(tiny_model, monkeypatch):
    """A byte budget of a few tokens' work splits the choice and the attention into many chunks:
    the same logits as in one."""
    model = _load(tiny_model(V32))
    batch = _prompts(model.vocab_size)
    whole, tokens = run_paged(model, batch, 2, seed=4)
    monkeypatch.setattr(sparse, "CHUNK_BYTES", 4096)
    chunked, chunked_tokens = run_paged(model, batch, 2, seed=4)
    assert chunked_tokens == tokens
    for a, b in zip(chunked, whole, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "name, change",
    [
        (V32, {"index_topk": 30}),  # the 21-token prompt within it, the 37-token one past it
        (V32, {"index_head_dim": 8}),  # the rotary's 8 dims and nothing past them
        (GLM5, {"indexer_types": None, "index_topk_pattern": "FSS"}),
    ],
)
def test_indexer_shapes_and_patterns_are_served_as_transformers_computes_them(
    tiny_model, tmp_path, name, change
):
    architecture, overrides = MOE_MODELS[name]
    path = build_model(tmp_path, architecture, **{**overrides, **change})
    ours = _load(path)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    batch = _prompts(ours.vocab_size)
    logits, tokens = run_paged(ours, batch, 3, seed=4)
    assert_every_step_equals_reference(ref, batch, logits, tokens, atol=1e-4)


@pytest.mark.parametrize(
    "name, change, field",
    [
        (V32, {"index_head_dim": 4}, "index_head_dim"),  # narrower than the 8 rotary dims
        (V32, {"index_topk": 0}, "index_topk"),
        (GLM5, {"indexer_types": ["shared", "full", "full"]}, "indexer_types"),
        (GLM5, {"indexer_types": ["full", "full"]}, "indexer_types"),
    ],
)
def test_configs_it_cannot_serve_are_refused_naming_the_field(
    tiny_model, tmp_path, name, change, field
):
    assert_refused(tiny_model(name), tmp_path / "bad", change, field)


def test_compile_refuses_sparse_attention():
    with pytest.raises(ValueError, match="--compile: .*sparse attention"):
        check_supported(
            world_size=1, device=CPU, attention="torch", quantized=False, sparse_attention=True
        )
