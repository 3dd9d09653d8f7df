"""The first Gemma's config as its releases wrote it (beyond test_models_vs_transformers.py's
whole-model comparison of gemma_geglu_one_kv_head, whose config also carries a stray
`sliding_window` that transformers' Gemma does not read, and neither does ours): the legacy
`hidden_act: "gelu"`, which transformers reads as gelu's tanh form, is served as that form."""

from __future__ import annotations

import torch
from config_edits import with_config
from paged_helpers import run_paged
from transformers import AutoModelForCausalLM

from shard.distributed import Distributed
from shard.models import load_model

CPU = torch.device("cpu")


def test_the_legacy_gelu_is_the_tanh_form_as_transformers_reads_it(tiny_model, tmp_path):
    path = with_config(tiny_model("gemma_geglu_one_kv_head"), tmp_path / "gelu", {
        "hidden_act": "gelu"})  # fmt: skip
    ours = load_model(path, dtype=torch.float32, device=CPU, dist=Distributed())
    assert ours.config.hidden_act == "gelu_pytorch_tanh"
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert ref.config.hidden_act == "gelu_pytorch_tanh"
    prompt = torch.arange(3, 40)
    logits, _ = run_paged(ours, [prompt], 0)
    with torch.inference_mode():
        want = ref(prompt[None]).logits[0]
    torch.testing.assert_close(logits[0], want, atol=1e-4, rtol=0)
    # At the logits, gelu's two forms differ by less than that tolerance on this tiny model;
    # one MLP on inputs of a few units tells them apart.
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * 4
    with torch.inference_mode():
        got, want = ours.layers[0].mlp(x), ref.model.layers[0].mlp(x)
        ref.model.layers[0].mlp.act_fn = torch.nn.GELU()  # the erf form
        erf = ref.model.layers[0].mlp(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert (erf - want).abs().max() > 1e-4
