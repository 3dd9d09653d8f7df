"""`--expert-parallel`: the flag's way to the shards, and the launcher's refusals of expert splits
that cannot work, before any shard is spawned (launcher/checks.py, check_experts)."""

import json
from pathlib import Path

import pytest

import launcher.main as launcher_main
from launcher.args import parse_args
from launcher.checks import ShardCountError, check_experts
from launcher.commands import Programs, build_plan
from launcher.env import LauncherEnv
from shard.__main__ import parse_args as parse_shard_args

CPU_ENV = LauncherEnv.from_environ({"CUDA_VISIBLE_DEVICES": ""})

# Shaped like transformers writes them, shrunk. Mixtral: every MLP is experts of intermediate_size.
MIXTRAL = {
    "architectures": ["MixtralForCausalLM"],
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "intermediate_size": 42,
}
# Qwen3-MoE: experts of moe_intermediate_size; intermediate_size is for dense layers, if any.
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_experts": 6,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 20,
    "intermediate_size": 50,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
# Qwen2-MoE: Qwen3-MoE's fields plus a shared expert every token goes through.
QWEN2_MOE = {
    **QWEN3_MOE,
    "architectures": ["Qwen2MoeForCausalLM"],
    "num_experts": 8,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 20,
}
DENSE = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 8, "intermediate_size": 30}


def model(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def refusal(expert_parallel: bool, num_shard: int, path: Path) -> str:
    with pytest.raises(ShardCountError) as err:
        check_experts(expert_parallel, num_shard, path)
    return str(err.value)


# The flag's way: launcher argv -> LauncherConfig -> shard argv -> ShardSettings.


def test_the_flag_is_off_by_default_and_reaches_every_shard(tmp_path):
    base = ["--model-id", str(tmp_path), "--num-shard", "2", "--shard-uds-path", "/tmp/s"]
    plain = parse_args(base, CPU_ENV)
    assert plain.expert_parallel is False
    for shard in build_plan(plain, tmp_path, Programs(shard=("S",), router=("R",))).shards:
        assert "--expert-parallel" not in shard.argv
        assert parse_shard_args(list(shard.argv[1:])).expert_parallel is False

    cfg = parse_args([*base, "--expert-parallel"], CPU_ENV)
    assert cfg.expert_parallel is True
    plan = build_plan(cfg, tmp_path, Programs(shard=("S",), router=("R",)))
    assert len(plan.shards) == 2
    for shard in plan.shards:
        assert "--expert-parallel" in shard.argv
        assert parse_shard_args(list(shard.argv[1:])).expert_parallel is True
    assert "--expert-parallel" not in plan.router.argv  # the router never sees the weights


def test_the_help_says_what_the_flag_does(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"], CPU_ENV)
    assert "--expert-parallel" in capsys.readouterr().out


# Refusals.


def test_expert_parallel_needs_experts(tmp_path):
    path = model(tmp_path, DENSE)
    assert refusal(True, 2, path) == (
        f"--expert-parallel needs a Mixture-of-Experts model; {path / 'config.json'} has no "
        "experts (num_local_experts/num_experts)"
    )
    assert "has no experts" in refusal(True, 1, path)  # one shard: still a mistake
    assert "has no experts" in refusal(True, 2, model(tmp_path, {**DENSE, "num_experts": 0}))
    check_experts(False, 2, model(tmp_path, DENSE))  # dense layers: check_num_shard's business


def test_expert_parallel_needs_the_experts_to_divide(tmp_path):
    # 8 experts on 3 shards; 12 heads leave 1, 2, 4 of 8's divisors.
    message = refusal(True, 3, model(tmp_path, MIXTRAL))
    assert message.startswith(
        "--expert-parallel with --num-shard 3 cannot give each shard a whole number of the "
        f"model's 8 experts (num_local_experts in {tmp_path / 'config.json'}): pass one of 1, 2, 4"
    )
    # 42 splits 3 ways: tensor-parallel experts are the way out.
    assert message.endswith(
        "; or drop --expert-parallel to split each expert's intermediate_size (42) across the 3 "
        "shards instead"
    )


def test_the_counts_offered_split_every_layers_own_heads(tmp_path):
    # Laguna's query heads a layer: 8 experts would go 4 ways, but the last layer's 2 heads not
    laguna = {**MIXTRAL, "num_attention_heads": 8, "num_key_value_heads": 2,
              "num_attention_heads_per_layer": [8, 4, 2]}  # fmt: skip
    assert refusal(True, 3, model(tmp_path, laguna)).endswith(": pass one of 1, 2")


def test_expert_parallel_refusal_names_qwen_fields(tmp_path):
    message = refusal(True, 4, model(tmp_path, QWEN3_MOE))
    assert "the model's 6 experts (num_experts in" in message
    assert "pass one of 1, 2" in message
    assert "drop --expert-parallel to split each expert's moe_intermediate_size (20)" in message
    # The same checkpoint with the other spelling of the count.
    other = {k: v for k, v in QWEN3_MOE.items() if k != "num_experts"} | {"num_local_experts": 6}
    assert "6 experts (num_local_experts in" in refusal(True, 4, model(tmp_path, other))
    # 12 experts do not split 8 ways, nor does each expert's 20 without the flag: only the list.
    message = refusal(True, 8, model(tmp_path, {**QWEN3_MOE, "num_experts": 12}))
    assert "pass one of 1, 2, 4" in message and "drop --expert-parallel" not in message


def test_tensor_parallel_experts_need_the_intermediate_size_to_divide(tmp_path):
    # Mixtral: 42 does not split 4 ways, 8 experts do.
    message = refusal(False, 4, model(tmp_path, MIXTRAL))
    assert message == (
        "--num-shard 4 does not divide the experts' intermediate size (intermediate_size 42 in "
        f"{tmp_path / 'config.json'}); without --expert-parallel each shard holds a slice of every "
        "expert: pass one of 1, 2, 3, 6; or pass --expert-parallel to give each shard 2 whole "
        "experts of the 8 instead"
    )
    # Qwen3-MoE: the experts' size is moe_intermediate_size, not the dense intermediate_size.
    message = refusal(False, 8, model(tmp_path, QWEN3_MOE))
    assert "(moe_intermediate_size 20 in" in message and "pass one of 1, 2, 4" in message
    assert "--expert-parallel to give" not in message  # 6 experts do not split 8 ways either


def test_the_shared_expert_is_split_even_under_expert_parallel(tmp_path):
    path = model(tmp_path, QWEN2_MOE)
    for expert_parallel in (False, True):
        message = refusal(expert_parallel, 8, path)
        assert message.startswith(
            "--num-shard 8 does not divide the shared expert's intermediate size "
            "(shared_expert_intermediate_size 20 in"
        )
        assert "split across the shards even with --expert-parallel: pass one of 1, 2, 4" in message
    check_experts(True, 4, path)
    # No shared expert (0): nothing to divide.
    check_experts(True, 8, model(tmp_path, {**QWEN2_MOE, "shared_expert_intermediate_size": 0}))


@pytest.mark.parametrize(
    ("dense_layers", "reason"),
    [
        ({"mlp_only_layers": [0, 3]}, "mlp_only_layers [0, 3]"),
        ({"decoder_sparse_step": 2}, "decoder_sparse_step 2"),
        # Laguna's and Mellum's list (GLM-4.7-Flash's too)
        ({"mlp_layer_types": ["dense", "sparse", "sparse"]}, "mlp_layer_types 'dense'"),
    ],
)
def test_dense_layers_are_split_too(tmp_path, dense_layers, reason):
    # 8 experts of 20 split 4 ways either way; the dense layers' 50 does not.
    path = model(tmp_path, {**QWEN3_MOE, "num_experts": 8, **dense_layers})
    for expert_parallel in (False, True):
        message = refusal(expert_parallel, 4, path)
        assert message.startswith(
            "--num-shard 4 does not divide the dense layers' intermediate size "
            f"(intermediate_size 50 in {path / 'config.json'}, which has dense layers: {reason})"
        )
        assert message.endswith("pass one of 1, 2")
    check_experts(True, 2, path)


# Accepted.


def test_splits_that_work(tmp_path):
    check_experts(False, 6, model(tmp_path, MIXTRAL))  # 42 / 6 per expert
    check_experts(True, 8, model(tmp_path, MIXTRAL))  # one expert each
    check_experts(True, 2, model(tmp_path, QWEN3_MOE))
    check_experts(False, 4, model(tmp_path, QWEN3_MOE))  # no dense layers: 50 is never used
    check_experts(False, 2, model(tmp_path, QWEN2_MOE))
    # Mixtral-8x7B and Qwen3-30B-A3B's own numbers on 2, 4 and 8 GPUs.
    mixtral = {**MIXTRAL, "num_attention_heads": 32, "num_key_value_heads": 8}
    mixtral["intermediate_size"] = 14336
    qwen3 = {**QWEN3_MOE, "num_attention_heads": 32, "num_key_value_heads": 4, "num_experts": 128}
    qwen3 |= {"moe_intermediate_size": 768, "intermediate_size": 6144}
    for config in (mixtral, qwen3):
        for n in (1, 2, 4, 8):
            for expert_parallel in (False, True):
                check_experts(expert_parallel, n, model(tmp_path, config))


def test_one_shard_takes_any_moe_model(tmp_path):
    odd = {**QWEN2_MOE, "num_experts": 7, "moe_intermediate_size": 11}
    odd |= {"shared_expert_intermediate_size": 13, "mlp_only_layers": [1]}
    for expert_parallel in (False, True):
        check_experts(expert_parallel, 1, model(tmp_path, odd))


def test_multimodal_wrappers_keep_the_experts_in_text_config(tmp_path):
    path = model(tmp_path, {"architectures": ["X"], "text_config": MIXTRAL})
    assert "model's 8 experts" in refusal(True, 3, path)
    check_experts(True, 4, path)


def test_an_unreadable_config_is_left_to_the_shard(tmp_path):
    check_experts(True, 3, tmp_path / "missing")
    (tmp_path / "config.json").write_text("not json")
    check_experts(True, 3, tmp_path)


# What the user sees: the launcher exits 1 with the message, before spawning anything.


def test_launcher_exits_1_before_spawning(tmp_path, monkeypatch, capsys):
    def no_spawn(*_args, **_kwargs):
        raise AssertionError("a shard was spawned")

    monkeypatch.setattr(launcher_main, "Supervisor", no_spawn)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = model(tmp_path, DENSE)
    assert launcher_main.main(["--model-id", str(path), "--expert-parallel"]) == 1
    err = capsys.readouterr().err
    assert "--expert-parallel needs a Mixture-of-Experts model" in err
    assert (
        launcher_main.main(["--model-id", str(model(tmp_path, MIXTRAL)), "--num-shard", "4"]) == 1
    )
    assert "or pass --expert-parallel to give each shard 2 whole experts" in capsys.readouterr().err


def test_compile_refuses_moe_models_and_takes_dense_ones(tmp_path, monkeypatch, capsys):
    (tmp_path / "dense").mkdir()
    check_experts(False, 1, model(tmp_path / "dense", DENSE), True)
    with pytest.raises(ShardCountError, match="--compile does not serve Mixture-of-Experts"):
        check_experts(False, 1, model(tmp_path, QWEN3_MOE), True)
    monkeypatch.setattr(launcher_main, "Supervisor", lambda *_a, **_k: pytest.fail("spawned"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = model(tmp_path, MIXTRAL)
    assert launcher_main.main(["--model-id", str(path), "--compile"]) == 1
    assert "serve it without --compile" in capsys.readouterr().err


# DeepSeek-V3 (and GLM-4.5): n_routed_experts, n_shared_experts experts of
# moe_intermediate_size every token takes, the first first_k_dense_replace layers dense.
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "n_shared_experts": 3,
    "intermediate_size": 96,
    "first_k_dense_replace": 1,
}


def test_deepseek_fields_name_the_experts_the_shared_ones_and_the_dense_layers(tmp_path):
    check_experts(True, 8, model(tmp_path, {**DEEPSEEK_V3, "n_shared_experts": 2}))
    check_experts(False, 16, model(tmp_path, {**DEEPSEEK_V3, "n_shared_experts": 2}))
    path = model(tmp_path, DEEPSEEK_V3)
    # 3 shared experts of 16: one MLP of 48, which 32 shards cannot split
    assert "(n_shared_experts 3 x moe_intermediate_size 16 in" in refusal(True, 32, path)
    # 8 experts cannot go 16 ways whole
    assert "model's 8 experts (n_routed_experts in" in refusal(True, 16, path)
    dense = model(tmp_path, {**DEEPSEEK_V3, "intermediate_size": 100})
    assert "which has dense layers: first_k_dense_replace 1)" in refusal(False, 8, dense)
    with pytest.raises(ShardCountError, match="--compile does not serve"):
        check_experts(False, 1, path, compiled=True)


def test_ernie_fields_name_the_experts_the_shared_ones_and_the_dense_layers(tmp_path):
    ernie = {
        "architectures": ["Ernie4_5_MoeForCausalLM"],
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "moe_num_experts": 8,
        "moe_k": 2,
        "moe_intermediate_size": 16,
        "moe_num_shared_experts": 3,
        "intermediate_size": 96,
        "moe_layer_start_index": 1,
    }
    path = model(tmp_path, ernie)
    assert "(moe_num_shared_experts 3 x moe_intermediate_size 16 in" in refusal(True, 32, path)
    assert "model's 8 experts (moe_num_experts in" in refusal(True, 16, path)
    dense = model(tmp_path, {**ernie, "intermediate_size": 100})
    assert "which has dense layers: moe_layer_start_index 1)" in refusal(False, 8, dense)
    check_experts(True, 4, model(tmp_path, {**ernie, "moe_num_shared_experts": 2}))


def test_nemotron3_fields_name_the_shared_expert_and_the_dense_layers(tmp_path):
    """Nemotron 3: n_routed_experts of moe_intermediate_size, one shared expert of its own
    moe_shared_expert_intermediate_size (not n_shared_experts x moe_intermediate_size), dense
    ReLU^2 layers among the MoE ones where layers_block_type lists 'mlp'."""
    nemotron = {
        "architectures": ["NemotronHForCausalLM"],
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "n_shared_experts": 1,
        "moe_shared_expert_intermediate_size": 24,
        "intermediate_size": 64,
        "layers_block_type": ["mamba", "moe", "attention", "moe"],
    }
    path = model(tmp_path, nemotron)
    check_experts(False, 8, path)  # 16, 24: both split 8 ways; no dense layer
    assert "(moe_shared_expert_intermediate_size 24 in" in refusal(False, 16, path)
    dense = model(
        tmp_path, {**nemotron, "layers_block_type": ["moe", "mlp"], "intermediate_size": 100}
    )
    assert "which has dense layers: layers_block_type 'mlp')" in refusal(False, 8, dense)
