"""Qwen3-Omni served text in, text out as its thinker's language model: the whole model's files
(thinker beside the talker's) and the thinker's own, each against transformers' thinker on the
same weights, every prompt position and decode step (the towers and the talker are skipped)."""

from __future__ import annotations

import pytest
import torch
from paged_helpers import assert_every_step_equals_reference, run_paged
from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

from shard.distributed import Distributed
from shard.models import load_model

TEXT = dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
            max_position_embeddings=512)  # fmt: skip
AUDIO = dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
             output_dim=64, num_mel_bins=16, max_source_positions=8, n_window=4,
             n_window_infer=8, downsample_hidden_size=8, conv_chunksize=4)  # fmt: skip
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
              num_position_embeddings=16, deepstack_visual_indexes=[0])  # fmt: skip


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    """The whole model saved, its thinker saved alone, and the thinker as the reference."""
    torch.manual_seed(0)
    thinker = dict(text_config=TEXT, audio_config=AUDIO, vision_config=VISION)
    model = Qwen3OmniMoeForConditionalGeneration(
        Qwen3OmniMoeConfig(thinker_config=thinker, enable_audio_output=False)
    ).eval()
    with torch.no_grad():  # weights that make every part matter (the init is near zero)
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.1)
            elif name.endswith("mlp.gate.weight"):  # the router: clear top-k margins
                param.normal_(0.0, 0.3)
            else:
                param.normal_(0.0, 0.05)
    whole, alone = tmp_path_factory.mktemp("omni"), tmp_path_factory.mktemp("thinker")
    model.save_pretrained(whole)
    model.thinker.save_pretrained(alone)
    # (transformers' multimodal positions read a vision-start id the thinker's config lacks; a
    # text prompt has none of it, so an id outside the vocabulary serves)
    model.thinker.config.vision_start_token_id = 10 * TEXT["vocab_size"]
    return whole, alone, model.thinker


@pytest.mark.parametrize("which", ["whole", "thinker"])
def test_text_equals_transformers_thinker(omni, which):
    whole, alone, reference = omni
    path = whole if which == "whole" else alone
    ours = load_model(path, dtype=torch.float32, device=torch.device("cpu"), dist=Distributed())
    gen = torch.Generator().manual_seed(2)
    batch = [torch.randint(3, ours.vocab_size, (n,), generator=gen) for n in (21, 37)]
    logits, tokens = run_paged(ours, batch, 3, seed=4)
    assert_every_step_equals_reference(reference, batch, logits, tokens, atol=1e-4)


def test_the_launcher_checks_the_thinkers_heads_and_experts(omni):
    """Before spawning, --num-shard and --expert-parallel are checked against the thinker's
    language model (its 4 heads, 2 KV heads and 8 experts), not the wrapper's config."""
    from launcher.checks import ShardCountError, check_experts, check_num_shard

    whole, _, _ = omni
    check_num_shard(2, whole, None, lambda _: 8)
    check_experts(True, 8, whole)
    with pytest.raises(ShardCountError, match="--num-shard 3"):
        check_num_shard(3, whole, None, lambda _: 8)
    with pytest.raises(ShardCountError, match="--expert-parallel"):
        check_experts(True, 16, whole)
