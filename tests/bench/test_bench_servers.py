"""Command lines the serving benchmark starts its servers with (nothing is started here)."""

from __future__ import annotations

import json

import pytest

import shard.platforms.host_memory
from bench.servers import FACTORIES, switchyard, transformers_kv_blocks, transformers_serve

SMOLLM = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
}


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM))
    monkeypatch.setattr(shard.platforms.host_memory, "available_host_memory", lambda: 64 << 30)
    return tmp_path


def test_transformers_runs_at_its_own_defaults(model_dir):
    server = transformers_serve(model_dir, [])
    assert server.name == "transformers"
    assert not any(a.startswith("--cb-") for a in server.argv)  # its own KV sizing
    assert {"--continuous-batching", "bfloat16", "cpu", str(model_dir)} <= set(server.argv)


def test_the_equal_kv_configuration_gets_the_kv_memory_of_a_switchyard_cpu_shard(model_dir):
    bytes_per_token = 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 KV heads of 64, bf16
    assert transformers_kv_blocks(model_dir) == (1 << 30) // (256 * bytes_per_token)  # 1 GiB cap
    server = FACTORIES["transformers-equal-kv"](model_dir, [])
    assert server.name == "transformers-equal-kv"
    argv = server.argv
    assert argv[argv.index("--cb-num-blocks") + 1] == str(transformers_kv_blocks(model_dir))


def test_user_kv_flags_replace_the_equal_kv_size(model_dir):
    argv = transformers_serve(model_dir, ["--cb-max-memory-percent", "0.6"], equal_kv=True).argv
    assert "--cb-num-blocks" not in argv and "--cb-max-memory-percent" in argv


def test_switchyard_uses_private_sockets_and_ignores_eos(model_dir):
    a, b = switchyard(model_dir, ["--max-batch-prefill-tokens", "4096"]), switchyard(model_dir, [])
    path = a.argv[a.argv.index("--shard-uds-path") + 1]
    assert path != b.argv[b.argv.index("--shard-uds-path") + 1]
    assert a.argv[-2:] == ["--max-batch-prefill-tokens", "4096"]
    assert a.extra_body["ignore_eos"] is True and a.extra_body["temperature"] == 0.0


def test_with_eos_honoured_both_servers_stop_at_the_models_eos(model_dir):
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert switchyard(model_dir, [], ignore_eos=False).extra_body["ignore_eos"] is False
    body = transformers_serve(model_dir, [], ignore_eos=False).extra_body
    assert json.loads(body["generation_config"]) == {"eos_token_id": 2, "do_sample": False}
    body = transformers_serve(model_dir, []).extra_body  # the default: EOS disabled
    assert json.loads(body["generation_config"])["eos_token_id"] == -1


def test_benchmarks_default_to_the_real_smollm2(tmp_path, monkeypatch):
    import argparse

    import launcher.default_model
    from bench.models import REAL, add_model_args, resolve_model

    p = argparse.ArgumentParser()
    add_model_args(p)
    monkeypatch.setattr(launcher.default_model, "ensure_default_model", lambda root: tmp_path)
    assert resolve_model(p.parse_args([])) == (tmp_path, REAL)
    assert resolve_model(p.parse_args(["--model-dir", str(tmp_path)]))[0] == tmp_path
    with pytest.raises(SystemExit, match="exclude each other"):
        resolve_model(p.parse_args(["--model-dir", "x", "--random-weights"]))
