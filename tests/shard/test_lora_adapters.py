"""Adapters we cannot apply exactly are refused at load, naming the adapter and the reason; the
shard does not start serving with part of an adapter silently dropped."""

from __future__ import annotations

import json

import pytest
import torch
from lora_fixtures import make_adapter

from shard.distributed import Distributed
from shard.lora.adapter import AdapterError, read_adapter
from shard.lora.manager import LoraManager, LoraSettings
from shard.models import load_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def base(tiny_model):
    return tiny_model("llama_gqa_llama3")


@pytest.fixture(scope="module")
def model(base):
    return load_model(base, dtype=torch.float32, device=CPU, dist=Distributed())


def manager(model, path, **kw) -> LoraManager:
    return LoraManager(model, LoraSettings(adapters={"ad": path}, **kw))


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (dict(r=4, target_modules=["q_proj"], use_dora=True), "DoRA adapters are not supported"),
        (dict(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]), "modules_to_save"),
        (dict(r=4, target_modules=["embed_tokens"]), r"target_modules \['embed_tokens'\]"),
        (dict(r=4, target_modules=["q_proj"], bias="lora_only"), "trained biases"),
        (dict(r=4, target_modules=["q_proj"], lora_bias=True), "lora_bias"),
        (dict(r=4, target_modules=["q_proj"], layer_replication=[[0, 2], [1, 2]]), "replication"),
        (dict(r=4, target_modules=["q_proj"], alora_invocation_tokens=[5, 6]), "aLoRA"),
        (
            dict(r=4, target_modules=["q_proj"], trainable_token_indices=[1, 2]),
            "trainable token embeddings",
        ),
    ],
)
def test_what_we_cannot_apply_is_refused_by_name(base, model, tmp_path, config, reason):
    path = make_adapter(base, tmp_path / "ad", seed=0, **config)
    with pytest.raises(AdapterError, match=rf"adapter 'ad': .*{reason}"):
        manager(model, path)


# Variants PEFT can only build on special bases (GPTQ, several experts, tensor parallelism),
# and malformed values: the field set in adapter_config.json of an otherwise plain adapter.
@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("use_qalora", True, "QALoRA"),
        ("use_bdlora", {"lora_a_is_blockdiagonal": ["q_proj"]}, "block-diagonal"),
        ("arrow_config", {"top_k": 2}, "Arrow"),
        ("kasa_config", {"tau": 1.0}, "KaSA"),
        ("target_parameters", ["mlp.experts.gate_up_proj"], "target_parameters"),
        ("peft_type", "ADALORA", "not LoRA"),
        ("lora_alpha", "16", "lora_alpha = '16' is not a number"),
        ("alpha_pattern", {"q_proj": None}, "alpha_pattern .* is not a map to numbers"),
        ("rank_pattern", {"q_proj": 0}, "rank_pattern .* non-positive rank"),
        ("init_lora_weights", "pissa_niter_4", "path_initial_model_for_weight_conversion"),
        ("init_lora_weights", "olora", "residual of the base weights"),
    ],
)
def test_config_fields_we_cannot_apply_are_refused_by_name(
    base, model, tmp_path, field, value, reason
):
    path = make_adapter(base, tmp_path / "ad", seed=0, r=4, target_modules=["q_proj"])
    config = json.loads((path / "adapter_config.json").read_text())
    assert field in config  # PEFT writes the field: it is the one we read
    config[field] = value
    (path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError, match=rf"adapter 'ad': .*{reason}"):
        manager(model, path)


def test_target_modules_the_model_lacks_are_ignored_as_peft_ignores_them(base, model, tmp_path):
    """One target list for several architectures: PEFT wraps what exists, saves only those
    weights, and loads the adapter; so do we (vLLM too), with the same modules as an adapter
    that names only those. Weights for a module we cannot apply are still refused."""
    targets = ["q_proj", "v_proj", "c_attn", "query_key_value", "W_pack"]
    path = make_adapter(base, tmp_path / "ad", seed=0, r=4, target_modules=targets)
    assert sorted(json.loads((path / "adapter_config.json").read_text())["target_modules"]) == (
        sorted(targets)
    )
    shapes = manager(model, path).module_shapes  # the manager loads it at start: no refusal
    loaded = read_adapter("ad", path, max_rank=8, module_shapes=shapes)
    leaves = {module.rsplit(".", 1)[-1] for module in loaded.modules}
    assert leaves == {"q_proj", "v_proj"} and len(loaded.modules) == 2 * 2  # 2 layers
    only = make_adapter(base, tmp_path / "only", seed=0, r=4, target_modules=["q_proj", "v_proj"])
    same = read_adapter("only", only, max_rank=8, module_shapes=shapes)
    for module, (a, b) in loaded.modules.items():
        assert torch.equal(a, same.modules[module][0]) and torch.equal(b, same.modules[module][1])


def test_a_rank_pattern_above_the_limit_names_the_flag(base, model, tmp_path):
    path = make_adapter(
        base, tmp_path / "ad", seed=0, r=4, target_modules=["q_proj", "v_proj"],
        rank_pattern={"v_proj": 16},
    )  # fmt: skip
    with pytest.raises(AdapterError, match="rank 16 exceeds --max-lora-rank 8"):
        manager(model, path, max_rank=8)


def test_weights_whose_rank_disagrees_with_the_config_are_refused(base, model, tmp_path):
    path = make_adapter(base, tmp_path / "ad", seed=0, r=4, target_modules=["q_proj"])
    config = json.loads((path / "adapter_config.json").read_text())
    config["rank_pattern"] = {"q_proj": 2}
    (path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError, match="q_proj has rank 4 .* gives it rank 2"):
        manager(model, path)


def test_rank_above_the_limit_names_the_flag(base, model, tmp_path):
    path = make_adapter(base, tmp_path / "ad", seed=0, r=16, target_modules=["q_proj"])
    with pytest.raises(AdapterError, match="rank 16 exceeds --max-lora-rank 8"):
        manager(model, path, max_rank=8)


def test_an_adapter_for_another_base_is_refused(tiny_model, model, tmp_path):
    other = tiny_model("mistral_mqa")  # one KV head: k_proj has fewer outputs
    path = make_adapter(other, tmp_path / "ad", seed=0, r=4, target_modules=["k_proj"])
    with pytest.raises(AdapterError, match=r"adapter 'ad': .*k_proj has A .* another base model"):
        manager(model, path)


def test_pickled_adapter_that_is_not_plain_tensors_is_refused(base, model, tmp_path):
    path = make_adapter(base, tmp_path / "ad", seed=0, r=4, target_modules=["q_proj"])
    tensors = __import__("safetensors.torch").torch.load_file(path / "adapter_model.safetensors")
    (path / "adapter_model.safetensors").unlink()
    torch.save({"tensors": tensors, "evil": Exception("x")}, path / "adapter_model.bin")
    with pytest.raises(AdapterError, match="does not load with weights_only=True"):
        manager(model, path)


def test_missing_directory_is_named(model, tmp_path):
    with pytest.raises(AdapterError, match="adapter 'ad': cannot read .*adapter_config.json"):
        manager(model, tmp_path / "nowhere")


def test_the_shard_process_refuses_at_startup_in_one_line(base, tmp_path, caplog):
    """`python -m shard serve` with an adapter it cannot apply: exit status 1 and one error
    line naming the adapter and the reason (the launcher shows the shard's last lines), not a
    traceback."""
    from shard.__main__ import main

    good = make_adapter(base, tmp_path / "good", seed=0, r=4, target_modules=["q_proj"])
    dora = make_adapter(base, tmp_path / "dora", seed=0, r=4, target_modules=["q_proj"],
                        use_dora=True)  # fmt: skip
    argv = ["serve", "--model-id", str(base), "--uds-path", str(tmp_path / "sock"),
            "--dtype", "float32", "--lora-adapters", f"good={good},bad={dora}"]  # fmt: skip
    with caplog.at_level("ERROR"):
        assert main(argv) == 1
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].exc_info is None
    assert "cannot start: adapter 'bad': DoRA adapters are not supported" in errors[0].getMessage()
    assert not list(tmp_path.glob("sock*"))  # it never began to serve


@pytest.mark.parametrize(
    "pattern",
    [
        {"q_proj": 2, "layers.1.mlp.down_proj": 16},
        {"gate_proj|up_proj": 3, "proj": 5},  # the first matching key wins, in order
        {"model.layers.0.self_attn.v_proj": 7, "v_proj": 9},
        {r"layers\.[01]\.self_attn\.(q|k)_proj": 11},
        {"_proj": 4, "self_attn.o_proj": 6},  # "_proj" is not at a dot boundary: no match
        {},
    ],
)
def test_rank_and_alpha_patterns_are_matched_as_peft_matches_them(pattern):
    from peft.utils.other import get_pattern_key

    from shard.lora.adapter import _pattern_value

    modules = [f"model.layers.{i}.{m}" for i in range(2) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    )]  # fmt: skip
    for module in modules:
        want = pattern.get(get_pattern_key(pattern.keys(), module), -1)
        assert _pattern_value(pattern, module, -1) == want, module
