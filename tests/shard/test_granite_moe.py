"""Granite 3 MoE as the Hub's files store it: each layer's experts in `input_linear` and
`output_linear`, the router as `router.layer`. A tiny checkpoint saved by transformers 5 (its
own names: the vs-transformers case) renamed to the Hub's, read by us and by transformers
(whose loader renames them back): the same logits and greedy ids."""

from __future__ import annotations

import json
import re
import shutil

import torch
from paged_helpers import assert_equals_reference, run_paged
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from shard.distributed import Distributed
from shard.models import load_model
from tests.shard.test_models_vs_transformers import prompts

HUB_NAMES = {
    r"\.experts\.gate_up_proj$": ".input_linear.weight",
    r"\.experts\.down_proj$": ".output_linear.weight",
    r"\.router\.weight$": ".router.layer.weight",
}


def test_the_hubs_layout_reads_as_transformers_reads_it(tiny_model, tmp_path):
    saved = tiny_model("granite_moe_multipliers")
    hub = shutil.copytree(saved, tmp_path / "hub")
    (file,) = hub.glob("*.safetensors")
    tensors = load_file(file)
    renamed = {}
    for name, tensor in tensors.items():
        for pattern, new in HUB_NAMES.items():
            name = re.sub(pattern, new, name)
        renamed[name] = tensor
    assert (
        sum(".input_linear." in n for n in renamed)
        == json.loads((hub / "config.json").read_text())["num_hidden_layers"]
    )
    save_file(renamed, file, metadata={"format": "pt"})
    ours = load_model(hub, dtype=torch.float32, device=torch.device("cpu"), dist=Distributed())
    batch = prompts(ours.vocab_size)
    logits, tokens = run_paged(ours, batch, 3)
    ref = AutoModelForCausalLM.from_pretrained(hub, dtype=torch.float32).eval()
    with torch.inference_mode():
        assert_equals_reference(ref, batch, logits, tokens, atol=1e-4)
