"""RMSNorm and rotary embedding against transformers' Llama implementations, on their torch paths
and (rotary, bit for bit too) on the native CPU kernel's; the native RMSNorm's own check against
float64 is in test_native_elementwise.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

import shard.platforms.cpu.native.build
from shard.layers.linear import QKVParallelLinear
from shard.layers.norm import RMSNorm
from shard.layers.rotary import RopeConfig, RotaryEmbedding, _joint_heads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("rows", "hidden", "magnitude"),
    [(7, 32, 3.0), (16, 576, 40.0), (3, 1000, 1e-3), (1, 4096, 1.0)],
)
def test_rmsnorm_torch_path_matches_llama(dtype, rows, hidden, magnitude, monkeypatch):
    monkeypatch.setattr(shard.platforms.cpu.native.build, "rms_norm_kernel", lambda: None)
    torch.manual_seed(hidden)
    weight = torch.randn(hidden).to(dtype)
    x = (torch.randn(rows, hidden) * magnitude).to(dtype)
    ref = LlamaRMSNorm(hidden, eps=1e-5).to(dtype)
    ref.weight.data.copy_(weight)
    assert torch.equal(RMSNorm(weight, 1e-5)(x), ref(x))


ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 500000.0, "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
    "yarn_untruncated_betas": {
        "rope_type": "yarn",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "beta_fast": 16,
        "beta_slow": 2,
        "truncate": False,
        "original_max_position_embeddings": 512,
    },
    "yarn_mscale": {  # DeepSeek's form of the attention factor
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 1024,
    },
    "yarn_attention_factor": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "attention_factor": 1.3,
        "original_max_position_embeddings": 1024,
    },
}


@pytest.mark.parametrize("kind", list(ROPES))
def test_rotary_matches_llama(kind, rotary_path):
    config = LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=4096,
        rope_parameters=dict(ROPES[kind]),
    )
    head_dim = 64
    ours = RotaryEmbedding(
        RopeConfig.from_config_dict(config.to_dict(), head_dim), torch.device("cpu")
    )
    ref = LlamaRotaryEmbedding(config)
    torch.manual_seed(0)
    positions = torch.tensor([0, 1, 17, 255, 1000, 4095, 3])
    q, k = torch.randn(7, 4, head_dim), torch.randn(7, 2, head_dim)
    cos, sin = ref(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    q_ours, k_ours = ours(positions, q, k)
    torch.testing.assert_close(q_ours, q_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_ours, k_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotary_of_fused_qkv_views_matches_llama_bit_for_bit(dtype, rotary_path):
    # The fused qkv projection's q and k are neighbouring views of one row, which the module
    # rotates in one pass: the result must be exactly transformers' (same products, same sums,
    # same rounding) and exactly what rotating separate copies gives.
    config = LlamaConfig(hidden_size=9 * 64, num_attention_heads=9, num_key_value_heads=3)
    ours = RotaryEmbedding(RopeConfig.from_config_dict(config.to_dict(), 64), torch.device("cpu"))
    layout = SimpleNamespace(head_dim=64, value_head_dim=64, num_heads=9, num_kv_heads=3)
    torch.manual_seed(1)
    positions = torch.tensor([0, 3, 17, 100, 511])
    fused = (torch.randn(5, (9 + 2 * 3) * 64) * 4).to(dtype)
    q, k, _ = QKVParallelLinear.split(layout, fused)  # type: ignore[arg-type]
    with torch.inference_mode():
        q_ours, k_ours = ours(positions, q, k)
        q_sep, k_sep = ours(positions, q.contiguous(), k.contiguous())
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    assert torch.equal(q_ours, q_ref[0].transpose(0, 1))
    assert torch.equal(k_ours, k_ref[0].transpose(0, 1))
    assert torch.equal(q_ours, q_sep) and torch.equal(k_ours, k_sep)
    assert torch.equal(fused[:, : 9 * 64].view(5, 9, 64), q)  # the input is left as it was


@pytest.mark.parametrize("tokens", [1, 4])
def test_fused_qkv_views_are_one_joint_view_at_any_token_count(tokens):
    """q and k of one fused row reach the platform's rotation as one view (on a GPU, the one
    in-place Triton kernel instead of some eight torch ops a layer). With one token, view()
    gives q and k different strides between tokens: those are never read, and must not count
    (a batch-1 decode step on a GPU took the torch ops in every layer)."""
    layout = SimpleNamespace(head_dim=64, value_head_dim=64, num_heads=9, num_kv_heads=3)
    fused = torch.randn(tokens, (9 + 2 * 3) * 64)
    q, k, _ = QKVParallelLinear.split(layout, fused)  # type: ignore[arg-type]
    joint = _joint_heads(q, k)
    assert joint is not None
    assert torch.equal(joint, fused[:, : 12 * 64].view(tokens, 12, 64))
    assert _joint_heads(q, k.clone()) is None  # not the row's neighbour: no joint view


def test_rotary_kept_cos_sin_follow_the_positions(rotary_path):
    # cos/sin are kept between the layers of a step; the next step's positions tensor must
    # not get the previous step's, under inference mode as the runner steps.
    rope = RotaryEmbedding(RopeConfig(head_dim=8, max_position_embeddings=64), torch.device("cpu"))
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)

    def fresh(positions):  # what a module with nothing kept computes
        return RotaryEmbedding(rope.config, torch.device("cpu"))(positions.clone(), q, k)

    with torch.inference_mode():
        positions = torch.tensor([0, 5, 9])
        first = rope(positions, q, k)
        assert all(torch.equal(a, b) for a, b in zip(rope(positions, q, k), first, strict=True))
        for step in (torch.tensor([1, 6, 10]), torch.tensor([7, 3, 30])):
            for got, want in zip(rope(step, q, k), fresh(step), strict=True):
                assert torch.equal(got, want)


def test_rope_config_reads_old_style_fields():
    old = {
        "max_position_embeddings": 1024,
        "rope_theta": 1e6,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    cfg = RopeConfig.from_config_dict(old, head_dim=8)
    assert (cfg.theta, cfg.rope_type, cfg.factor) == (1e6, "linear", 2.0)
    llama3 = {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
        "max_position_embeddings": 512,
    }
    assert RopeConfig.from_config_dict(llama3, 8).original_max_position_embeddings == 512
    plain = RopeConfig.from_config_dict({}, 8)
    assert (plain.theta, plain.rope_type, plain.max_position_embeddings) == (
        10000.0,
        "default",
        2048,
    )


def test_rope_config_rejects_unsupported_scaling():
    # dynamic NTK rescales with the batch's current length in transformers: no fixed table.
    with pytest.raises(ValueError, match="'dynamic'.*llama3"):
        RopeConfig.from_config_dict({"rope_parameters": {"rope_type": "dynamic", "factor": 4.0}}, 8)


def test_half_precision_rotary_keeps_dtype():
    rope = RotaryEmbedding(RopeConfig(head_dim=8, max_position_embeddings=64), torch.device("cpu"))
    assert rope.cos.dtype == torch.float32
    q, k = rope(torch.arange(3), torch.randn(3, 2, 8).half(), torch.randn(3, 1, 8).half())
    assert q.dtype == k.dtype == torch.float16
