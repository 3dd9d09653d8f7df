"""ModelConfig.rope_regime_boundary, what Info tells the router: longrope's
original_max_position_embeddings (prompts longer than it rotate every K with the long tables, so
the router's prefix cache keeps them apart from shorter ones), 0 for every rope whose rotation
does not depend on the sequence's length."""

from __future__ import annotations

from typing import Any

import pytest

from shard.models.config import ModelConfig

# head_dim 8, partial rotary 0.75: 6 rotated dims, 3 longrope factors each.
BASE: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 256,
}
LONGROPE: dict[str, Any] = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.75,
    "short_factor": [1.0, 1.1, 1.2],
    "long_factor": [2.0, 3.0, 4.0],
    "original_max_position_embeddings": 64,
}


def config(**extra: Any) -> ModelConfig:
    return ModelConfig.from_dict({**BASE, **extra}, architecture="X", eos_token_ids=[])


def test_longrope_reports_its_original_length():
    assert config(rope_parameters=LONGROPE).rope_regime_boundary == 64


def test_phi3_keeps_the_original_length_at_the_top_level():
    # Phi-3's config.json: the length beside rope_scaling, the "su" name of longrope.
    scaling = {k: v for k, v in LONGROPE.items() if k != "original_max_position_embeddings"}
    got = config(
        rope_scaling={**scaling, "type": "su"},
        original_max_position_embeddings=48,
    )
    assert got.rope_regime_boundary == 48


@pytest.mark.parametrize(
    "rope",
    [
        None,
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_ropes_that_ignore_the_sequence_length_report_zero(rope: dict[str, Any] | None):
    got = config() if rope is None else config(rope_parameters=rope)
    assert got.rope_regime_boundary == 0


def test_a_longrope_among_per_layer_ropes_is_found():
    """transformers 5 keys the parameters by layer type (Gemma 3): the first layer's rope is not
    longrope, a later one's is."""
    got = config(
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": LONGROPE,
        },
    )
    assert got.rope.rope_type == "default" and got.rope_regime_boundary == 64
    plain = config(
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
        },
    )
    assert plain.rope_regime_boundary == 0
