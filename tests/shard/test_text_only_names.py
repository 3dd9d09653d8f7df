"""shard/models/text_only.py: a vision-language checkpoint's LM names in the Hub's layout and in
transformers 5's, and adapters' module names mapped onto whichever the checkpoint holds."""

import pytest

from shard.models.gemma2 import GEMMA_NAMES
from shard.models.text_only import (
    HUB_LAYOUT,
    MODULE_LAYOUT,
    PLAIN_LAYOUT,
    adapter_module,
    layout_of,
    nest,
    nested_table,
    text_config,
    unnest,
)

LM_NAMES = ["model.embed_tokens", "model.layers.3.self_attn.q_proj", "model.norm", "lm_head"]
HUB = ["language_model.model.embed_tokens", "language_model.model.layers.3.self_attn.q_proj",
       "language_model.model.norm", "language_model.lm_head"]  # fmt: skip
MODULES = ["model.language_model.embed_tokens", "model.language_model.layers.3.self_attn.q_proj",
           "model.language_model.norm", "lm_head"]  # fmt: skip


@pytest.mark.parametrize(("layout", "nested"), [(HUB_LAYOUT, HUB), (MODULE_LAYOUT, MODULES)])
def test_names_nest_and_unnest_in_both_layouts(layout, nested):
    assert [nest(n, layout) for n in LM_NAMES] == nested
    assert [unnest(n) for n in nested] == LM_NAMES


def test_names_outside_the_language_model_are_not_unnested():
    assert unnest("vision_tower.encoder.layers.0.self_attn.q_proj") is None
    assert unnest("multi_modal_projector.mm_input_projection_weight") is None
    assert unnest("language_model.lm_head_extra") is None
    with pytest.raises(ValueError, match="not a language model name"):
        nest("vision_tower.encoder", HUB_LAYOUT)


def test_the_table_nests_every_name_of_the_causal_lm():
    table = nested_table(GEMMA_NAMES, HUB_LAYOUT)
    assert table["qkv_proj"][0] == "language_model.model.layers.{i}.self_attn.q_proj"
    assert table["lm_head"] == ("language_model.lm_head",)
    assert set(table) == set(GEMMA_NAMES)


@pytest.mark.parametrize(("layout", "nested"), [(HUB_LAYOUT, HUB), (MODULE_LAYOUT, MODULES)])
def test_adapter_modules_in_either_layout_map_onto_the_checkpoints(layout, nested):
    for hub, modules, want in zip(HUB, MODULES, nested, strict=True):
        assert adapter_module(hub, layout) == want
        assert adapter_module(modules, layout) == want
    for vision in ("model.vision_tower.encoder.layers.0.mlp.fc1",
                   "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj",
                   "multi_modal_projector.linear"):  # fmt: skip
        assert adapter_module(vision, layout) is None


def test_the_layout_is_read_from_the_checkpoint():
    assert layout_of(lambda m: m == "model.language_model.embed_tokens") is MODULE_LAYOUT
    assert layout_of(lambda m: m == "language_model.model.embed_tokens") is HUB_LAYOUT
    assert layout_of(lambda m: m == "model.embed_tokens") is PLAIN_LAYOUT  # Qwen2.5-VL's


def test_adapters_on_an_unnested_checkpoint_map_onto_its_own_names():
    """Qwen2.5-VL's Hub files keep the LM's names; PEFT names its modules as transformers 5
    holds them (`model.language_model.`), and its vision tower's (`model.visual.`) are left."""
    want = "model.layers.0.self_attn.q_proj"
    assert adapter_module("model.language_model.layers.0.self_attn.q_proj", PLAIN_LAYOUT) == want
    assert adapter_module(want, PLAIN_LAYOUT) == want
    assert adapter_module("lm_head", PLAIN_LAYOUT) == "lm_head"
    for vision in ("model.visual.blocks.0.attn.qkv", "visual.blocks.0.mlp.up_proj"):
        assert adapter_module(vision, PLAIN_LAYOUT) is None


def test_a_wrapper_config_without_the_language_models_is_refused():
    assert text_config({"text_config": {"hidden_size": 8}}) == {"hidden_size": 8}
    with pytest.raises(ValueError, match="text_config"):
        text_config({"vision_config": {}})


def test_a_llava_wrapper_around_a_language_model_it_does_not_serve_is_refused():
    """LLaVA's wrapper serves a Llama or a Mistral inside it; another language model (a Qwen2,
    whose q/k/v biases the Llama class would not read) is refused naming the field."""
    from shard.models.config import UnsupportedArchitectureError
    from shard.models.llama import LlavaForConditionalGeneration

    text = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 2, "vocab_size": 512}  # fmt: skip
    with pytest.raises(UnsupportedArchitectureError, match="text_config.model_type"):
        LlavaForConditionalGeneration.config_from_dict(
            {"text_config": text}, architecture="LlavaForConditionalGeneration",
            eos_token_ids=[2], quantization=None,
        )  # fmt: skip


def test_a_glm46v_wrapper_around_a_language_model_it_does_not_serve_is_refused():
    """GLM-4.6V's wrapper serves GLM-4's or GLM-4.5's language model; another is refused naming
    the field."""
    from shard.models.config import UnsupportedArchitectureError
    from shard.models.glm4_moe import Glm46VForConditionalGeneration

    text = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 2, "vocab_size": 512}  # fmt: skip
    with pytest.raises(UnsupportedArchitectureError, match="text_config.model_type"):
        Glm46VForConditionalGeneration.config_from_dict(
            {"text_config": text}, architecture="Glm46VForConditionalGeneration",
            eos_token_ids=[2], quantization=None,
        )  # fmt: skip
