"""OLMo-Hybrid beyond the whole-model comparison (test_models_vs_transformers.py): write
strengths kept below 1 (`linear_allow_neg_eigval` off) served as transformers computes them, and
a head layout transformers does not define refused by name."""

from __future__ import annotations

from config_edits import assert_refused, with_config
from paged_helpers import assert_serves_as_reference

NAME = "olmo_hybrid_delta_post_norm"


def test_write_strengths_below_one_are_served_as_transformers(tiny_model, tmp_path):
    change = {"linear_allow_neg_eigval": False}
    path = with_config(tiny_model(NAME), tmp_path / "changed", change)
    assert_serves_as_reference(path, path)


def test_unequal_linear_heads_are_refused(tiny_model, tmp_path):
    change = {"linear_num_value_heads": 4}
    assert_refused(tiny_model(NAME), tmp_path / "bad", change, "linear_num_value_heads")
