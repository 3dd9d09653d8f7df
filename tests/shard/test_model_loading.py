"""load_model: architecture dispatch, checkpoint formats, and loud failures on bad checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from shard.distributed import Distributed
from shard.models import CausalLM, UnsupportedArchitectureError, load_model
from shard.platforms.cpu.matmul import dense
from shard.weights import WeightsError

CPU = torch.device("cpu")


def load(path, dtype=torch.float32) -> CausalLM:
    return load_model(path, dtype=dtype, device=CPU, dist=Distributed())


def copy_with_tensors(src, dst, edit) -> None:
    """Copies a model dir, passing its state dict through `edit` (single safetensors file)."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})


def test_unsupported_architecture_names_it_and_the_supported_ones(tiny_model, tmp_path):
    dst = tmp_path / "gpt"
    shutil.copytree(tiny_model("llama_gqa_llama3"), dst)
    config = json.loads((dst / "config.json").read_text())
    config["architectures"] = ["DeepseekV4ForCausalLM"]
    (dst / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError) as err:
        load(dst)
    message = str(err.value)
    assert "DeepseekV4ForCausalLM" in message
    assert all(a in message for a in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"))


def test_missing_weight_fails_naming_it(tiny_model, tmp_path):
    missing = "model.layers.1.mlp.down_proj.weight"
    copy_with_tensors(tiny_model("llama_gqa_llama3"), tmp_path / "m", lambda t: t.pop(missing))
    with pytest.raises(WeightsError, match=missing.replace(".", r"\.")):
        load(tmp_path / "m")


def test_unexpected_weight_fails_naming_it(tiny_model, tmp_path):
    extra = "model.layers.0.self_attn.q_norm.weight"

    def add(t):
        t[extra] = torch.ones(16)
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # tolerated

    copy_with_tensors(tiny_model("llama_gqa_llama3"), tmp_path / "u", add)
    with pytest.raises(WeightsError, match=extra.replace(".", r"\.")) as err:
        load(tmp_path / "u")
    assert "inv_freq" not in str(err.value)


def test_tied_checkpoint_may_carry_its_lm_head_copy(tiny_model, tmp_path):
    def add(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()

    copy_with_tensors(tiny_model("llama_tied_linear_bias"), tmp_path / "t", add)
    model = load(tmp_path / "t")
    # The head is the embedding's weight (a packed copy where the CPU GEMM packs weights).
    assert torch.equal(dense(model.lm_head.weight), model.embed_tokens.weight)


def test_sharded_and_torch_checkpoints_give_the_same_model(tiny_model, tmp_path):
    src = tiny_model("qwen2_bias")
    tensors = load_file(src / "model.safetensors")
    names = sorted(tensors)
    sharded, pickled = tmp_path / "sharded", tmp_path / "bin"
    for dst in (sharded, pickled):
        shutil.copytree(src, dst)
        (dst / "model.safetensors").unlink()
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, sharded / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    torch.save(tensors, pickled / "pytorch_model.bin")

    reference = load(src)
    expected = dict(reference.named_parameters())
    for path in (sharded, pickled):
        params = dict(load(path).named_parameters())
        assert params.keys() == expected.keys()
        for name, param in params.items():
            assert torch.equal(dense(param), dense(expected[name])), f"{path.name}: {name}"


def test_model_reports_its_shape_and_sizes_its_kv_cache(tiny_model):
    model = load(tiny_model("mistral_mqa"), dtype=torch.bfloat16)
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (2, 1, 16)
    assert model.vocab_size == 512
    assert model.max_position_embeddings == 131072
    assert model.eos_token_ids == [2]
    caches = model.allocate_kv_cache(num_blocks=5, block_size=16)
    assert len(caches) == 2
    assert all(c.shape == (2, 5, 16, 1, 16) and c.dtype == torch.bfloat16 for c in caches)
    assert model.kv_cache_bytes_per_token() == 2 * 2 * 1 * 16 * 2
    assert (
        sum(c.numel() * c.element_size() for c in caches)
        == 5 * 16 * model.kv_cache_bytes_per_token()
    )


def test_layer_windows_follow_the_config():
    from shard.models.config import ModelConfig

    base = {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
    }

    def windows(**extra) -> tuple:
        config = ModelConfig.from_dict(
            {**base, **extra}, architecture="MistralForCausalLM", eos_token_ids=[]
        )
        return config.layer_windows

    assert windows() == (None, None, None)
    assert windows(sliding_window=5) == (5, 5, 5)
    mixed = ["full_attention", "sliding_attention", "full_attention"]
    assert windows(sliding_window=5, layer_types=mixed) == (None, 5, None)
    assert windows(sliding_window=5, use_sliding_window=False) == (None, None, None)
    with pytest.raises(ValueError, match="layer_types names 2 layers, not 3"):
        windows(sliding_window=5, layer_types=mixed[:2])
    with pytest.raises(ValueError, match="sliding_window must be at least 1"):
        windows(sliding_window=0)
