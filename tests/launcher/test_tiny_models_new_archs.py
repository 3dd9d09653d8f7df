"""launcher.tiny_models' checkpoints beyond the Llama family (NEW_ARCH_MODELS) as transformers
reads them: every weight used, norms random around their identity, config values as given, and
each case's features visible in the logits, so that the shard tests comparing against
transformers on these cases test what their names say."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from launcher.tiny_models import build_model, is_norm
from tests.shard.tiny_model_cases import NEW_ARCH_MODELS

PROMPT_LENS = (21, 37)  # the shard tests' prompts: Phi-3's longrope switches at 32 between them
# Norms per layer (and the final one): Gemma 2 has four, Gemma 3 those and q/k norms.
NORMS_PER_LAYER = {
    "GPTBigCodeForCausalLM": 2,  # ln_1 and ln_2
    "OPTForCausalLM": 2,  # self_attn_layer_norm and final_layer_norm
    "GPT2LMHeadModel": 2,  # ln_1 and ln_2
    "Jais2ForCausalLM": 2,
    "ExaoneForCausalLM": 2,  # Llama's two (ln_1 and ln_2 in its Hub files)
    "ApertusForCausalLM": 4,  # and the q/k norms
    "InternLM3ForCausalLM": 2,
    "IQuestCoderForCausalLM": 2,
    "CwmForCausalLM": 2,
    "Lfm2ForCausalLM": 2,
    "Lfm3ForCausalLM": 4,  # and the sandwich norms
    "Gemma2ForCausalLM": 4,
    "Gemma3ForCausalLM": 6,
    "Phi3ForCausalLM": 2,
    "SmolLM3ForCausalLM": 2,
    "GraniteForCausalLM": 2,
    "Olmo2ForCausalLM": 4,  # after attention and the MLP, and q/k over the whole projection
    "Olmo3ForCausalLM": 4,
    "Exaone4ForCausalLM": 4,
    "Glm4ForCausalLM": 4,
    "SeedOssForCausalLM": 2,
    "Ernie4_5ForCausalLM": 2,
    "CohereForCausalLM": 1,  # one LayerNorm, attention and the MLP in parallel
    "Cohere2ForCausalLM": 1,
    "GraniteSWAForCausalLM": 2,
    "Ministral3ForCausalLM": 2,
    "YoutuForCausalLM": 4,  # and the latent attention's q_a and kv_a norms
    "HunYuanDenseV1ForCausalLM": 4,  # and the q/k norms after the rotary
    # two a layer, and every other layer's q/k norms (softmax) or gated norm (linear)
    "Qwen3_5ForCausalLM": 3.5,
    # the test case's one softmax layer in four: OLMo 2's four; the linear ones three (input,
    # before the MLP, the gated output norm)
    "OlmoHybridForCausalLM": 3.25,
    # two linear layers in five (input, before the MLP, gated output), three softmax (and q/k)
    "LaraMiniForCausalLM": 3.6,
    "Gemma4ForCausalLM": 6,  # Gemma 3's; its value norms have no weight
    "Gemma4UnifiedForCausalLM": 6,
    "GemmaForCausalLM": 2,
    "VaultGemmaForCausalLM": 2,
    "GlmForCausalLM": 2,
    "HeliumForCausalLM": 2,
    "ArceeForCausalLM": 2,
    # LayerNorms with a bias: each norm two tensors (BIASED_NORMS)
    "Starcoder2ForCausalLM": 2,
    "PhiForCausalLM": 1,  # one a layer, attention and the MLP in parallel
    "StableLmForCausalLM": 2,
    "NemotronForCausalLM": 2,
    "GPTNeoXForCausalLM": 2,  # in parallel: attention's and the MLP's, of the same input
}
# Architectures whose norms hold a bias besides the weight: tensors a norm
# Architectures transformers has no class of its own for: it runs them as Llama
LLAMA_RUN = dict.fromkeys(
    ("exaone3_gpt2_style_names", "internlm3_biased", "iquestcoder_llama_layers"),
    ("LlamaForCausalLM",),
)
BIASED_NORMS = tuple(
    f"{name}ForCausalLM"
    for name in (
        "Starcoder2",
        "Phi",
        "StableLm",
        "Nemotron",
        "GPTNeoX",
        "GPTBigCode",
        "Falcon",
        "OPT",
        "Jais2",
    )  # fmt: skip
) + ("GPT2LMHeadModel",)
# Cases whose layers differ in their norms: the total, the final norm included
NORMS_IN_ALL = {
    # six a layer, and a norm of each layer's per-layer input; the two KV-sharing layers have
    # no key norm; and the per-layer embeddings' projection norm
    "gemma4_per_layer_inputs_kv_sharing": 6 * 6 + 6 - 2 + 1 + 1,
    "gemma4_unified_text": 6 * 6 - 2 + 1,  # six a layer, no key norm in the 2 KV-sharing layers
    # four a layer, q/k norms (none for the 2 KV-sharing layers' keys), AltUp's router norm,
    # Laurel's, the per-layer input's; the final and the per-layer projection's
    "gemma3n_altup_laurel_sparse": 4 * 4 + 4 * 2 - 2 + 4 * 3 + 1 + 1,
    "phi_qk_layernorm_tied": 2 * (3 * 2 + 1),  # and each layer's q and k LayerNorms
    # one norm a layer (weight and bias), and a weight for each of the 4 q and 2 k heads
    "stablelm2_parallel_qk_layernorm": 2 * (2 + 4 + 2) + 2,
    "olmo_weightless_norms_clip": 0,  # LayerNorms without weight or bias
    "nanochat_reverse_rope": 0,  # RMSNorms without a weight
    # two a layer, and the three Mamba layers' gated norms
    "granite4_hybrid_dense_nope": 2 * 4 + 3 + 1,
    "bamba_hybrid_partial_rotary": 2 * 3 + 2 + 1,
    "lfm2_short_conv_hybrid": 2 * 3 + 2 + 1,  # and the attention layer's q/k norms
    "lfm3_gated_sliding_sandwich": 4 * 4 + 2 * 2 + 1,  # and the two attention layers' q/k
    # two a layer; the Mamba mixers' gated norms where mamba_rms_norm is on
    "falcon_h1_parallel_hybrid": 2 * 2 + 1,
    "falcon_h1_norm_before_gate": 2 * 2 + 2 + 1,
    "falcon_h1_gate_before_norm": 2 * 2 + 2 + 1,
    "nemotron_h_one_module_layers": 6 + 3 + 1,  # one a layer, the Mamba layers' gated norms
    "mamba2_pure": 3 + 3 + 1,  # one a layer and each mixer's gated norm
    # one a layer (FalconMamba's norms of dt, B and C have no weight)
    "mamba1_biased": 2 + 1,
    "falcon_mamba_bcdt_norms": 2 + 1,
    # Falcon: two a layer (ln_attn, ln_mlp) in the new architecture, one (input_layernorm) in
    # 7B's; weight and bias each
    "falcon_grouped_two_norms": 2 * (2 * 2 + 1),
    "falcon_multi_query_one_norm": 2 * (1 * 2 + 1),
    # two a layer and the final one, weight and bias each, and the embeddings' LayerNorm
    "bloom_alibi_six_heads": 2 * (2 * 2 + 1 + 1),
    "mpt_alibi_clip_scale": 2 * 2 + 1,  # LayerNorms without a bias
}
# Overrides that transformers' config turns into another field on save: (that field, how to
# find the value in it)
CONVERTED = {
    # Gemma 4's global layers' KV heads, into per_layer_config's entries
    "num_global_key_value_heads": (
        "per_layer_config",
        lambda field, value: {e["num_key_value_heads"] for e in field.values()} == {value},
    ),
}
# norms computing x * (1 + w), but for Qwen3.5's gated norm of linear attention's output
# (Gemma 4's and Gemma 3n's are x * w)
ZERO_CENTRED = ("GemmaFor", "Gemma2", "Gemma3For", "VaultGemma", "Qwen3_5")
ZERO_CENTRED += ("NemotronForCausalLM",)  # LayerNorm1P (not NemotronH's x * w)
PLAIN_NORMS = ("linear_attn.norm.weight",)


def _identity(architecture: str, key: str) -> float:
    if key.endswith(".bias"):  # a LayerNorm's
        return 0.0
    return 0.0 if architecture.startswith(ZERO_CENTRED) and not key.endswith(PLAIN_NORMS) else 1.0


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Callable[..., Path]:
    """name, **changes -> the case's checkpoint with `changes` on top of its overrides. The seed
    is the builder's, so a variant differing only in config values has the same weights."""
    cache: dict[tuple, Path] = {}

    def get(name: str, **changes: object) -> Path:
        key = (name, json.dumps(changes, sort_keys=True))
        if key not in cache:
            architecture, overrides = NEW_ARCH_MODELS[name]
            root = tmp_path_factory.mktemp(name)
            cache[key] = build_model(root, architecture, **{**overrides, **changes})
        return cache[key]

    return get


def _load(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _prompts(vocab_size: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)  # tests/shard's prompts()
    return [torch.randint(3, vocab_size, (n,), generator=gen) for n in PROMPT_LENS]


@torch.inference_mode()
def _logits(model: torch.nn.Module) -> list[torch.Tensor]:
    return [model(p[None]).logits[0] for p in _prompts(model.config.vocab_size)]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def _contains(actual: object, expected: object) -> bool:
    """`expected` within `actual`: dicts may have gained keys (transformers fills in rope
    defaults), everything else is equal."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _contains(actual[k], v) for k, v in expected.items()
        )
    return actual == expected


@pytest.mark.parametrize("name", sorted(NEW_ARCH_MODELS))
def test_loads_in_transformers_with_every_weight_and_generates(built, name):
    model, info = AutoModelForCausalLM.from_pretrained(
        built(name), dtype=torch.float32, output_loading_info=True
    )
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert info["mismatched_keys"] == set() and info["error_msgs"] == []
    # (transformers runs EXAONE 3.5, InternLM3 and IQuest-Coder as Llama)
    assert type(model).__name__ in (NEW_ARCH_MODELS[name][0], *LLAMA_RUN.get(name, ()))
    prompt = _prompts(model.config.vocab_size)[0]
    with torch.inference_mode():
        out = model.eval().generate(
            prompt[None],
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=4,
            do_sample=False,
        )
    assert out.shape == (1, len(prompt) + 4)


@pytest.mark.parametrize("name", sorted(NEW_ARCH_MODELS))
def test_config_round_trips_the_overrides(built, name):
    architecture, overrides = NEW_ARCH_MODELS[name]
    path = built(name)
    raw = json.loads((path / "config.json").read_text())  # what the server reads
    config = AutoConfig.from_pretrained(path)
    loaded = config.to_dict()
    for key, value in overrides.items():
        if key in CONVERTED:
            field, holds = CONVERTED[key]
            assert holds(raw[field], value) and holds(loaded[field], value), (key, raw[field])
            continue
        key = config.attribute_map.get(key, key)  # stored under the class's own name (n_head)
        assert _contains(raw[key], value), (key, raw[key])
        assert _contains(loaded[key], value), (key, loaded[key])
    assert raw["architectures"] == [architecture] and raw["pad_token_id"] is None
    # rotary tables stay small (GPT-2's name for it: n_positions, MPT's max_seq_len; pure Mamba
    # and BLOOM have none)
    unbounded = ("Mamba2ForCausalLM", "MambaForCausalLM", "FalconMambaForCausalLM")
    if architecture not in (*unbounded, "BloomForCausalLM"):
        limit = raw.get("max_position_embeddings", raw.get("n_positions", raw.get("max_seq_len")))
        assert limit <= 512


@pytest.mark.parametrize("name", sorted(NEW_ARCH_MODELS))
def test_norms_are_random_around_their_identity_and_matter(built, name):
    architecture, _ = NEW_ARCH_MODELS[name]
    model = _load(built(name))
    norms = {k: v for k, v in model.state_dict().items() if is_norm(k)}
    layers = model.config.num_hidden_layers
    per_norm = 2 if architecture.startswith(BIASED_NORMS) else 1
    expected = (NORMS_PER_LAYER.get(architecture, 0) * layers + 1) * per_norm
    expected = NORMS_IN_ALL.get(name, expected)
    assert len(norms) == expected
    if not norms:  # nothing random to check (OLMo's norms have no parameters)
        return
    for key, w in norms.items():
        assert abs(w.mean().item() - _identity(architecture, key)) < 0.1, key
        assert 0.04 < w.std().item() < 0.2, key  # N(identity, 0.1): 16 or 64 draws
    assert len({tuple(w.tolist()) for w in norms.values()}) == len(norms)  # each its own draw

    before = _logits(model)
    with torch.no_grad():
        for key, w in norms.items():
            w.fill_(_identity(architecture, key))
    assert _max_diff(before, _logits(model)) > 1e-2


def test_older_architectures_keep_norms_at_their_init(tmp_path):
    """Their checkpoints stay byte-identical to those the older tests were written against."""
    model = _load(build_model(tmp_path, "LlamaForCausalLM"))
    norms = [v for k, v in model.state_dict().items() if "norm" in k]
    assert norms and all(torch.equal(w, torch.ones_like(w)) for w in norms)


@pytest.mark.parametrize(
    "architecture, expected",
    [
        (
            "Gemma2ForCausalLM",
            dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                 max_position_embeddings=512),
        ),
        (
            "Gemma3ForCausalLM",
            dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                 max_position_embeddings=512),
        ),
        (
            "Phi3ForCausalLM",
            dict(max_position_embeddings=512, original_max_position_embeddings=512),
        ),
    ],
)  # fmt: skip
def test_builder_defaults_are_tiny(tmp_path, architecture, expected):
    path = build_model(tmp_path, architecture)
    config = json.loads((path / "config.json").read_text())
    assert {k: config[k] for k in expected} == expected
    assert config["vocab_size"] == 512 and config["pad_token_id"] is None
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    assert head_dim == 16
    # An override of head_dim carries into the default attention scale.
    if architecture.startswith("Gemma"):
        other = build_model(tmp_path / "hd32", architecture, head_dim=32)
        assert json.loads((other / "config.json").read_text())["query_pre_attn_scalar"] == 32


def test_gemma2_softcaps_change_the_logits(built):
    name = "gemma2_softcap_alternating"
    capped = _logits(_load(built(name)))
    no_attn_cap = _logits(_load(built(name, attn_logit_softcapping=None)))
    no_final_cap = _logits(_load(built(name, final_logit_softcapping=None)))
    # Far above the shard tests' 1e-4, so a model ignoring either cap fails them.
    assert _max_diff(capped, no_attn_cap) > 5e-3
    assert _max_diff(capped, no_final_cap) > 0.1
    assert max(x.abs().max().item() for x in capped) < 3.0  # tanh's bound


def test_gemma3_each_layer_type_has_its_own_rotary(built):
    name = "gemma3_qk_norm_local_rope"
    rope = NEW_ARCH_MODELS[name][1]["rope_parameters"]
    logits = _logits(_load(built(name)))
    unscaled = {**rope, "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}}
    same_theta = {**rope, "sliding_attention": {"rope_type": "default", "rope_theta": 1e6}}
    assert _max_diff(logits, _logits(_load(built(name, rope_parameters=unscaled)))) > 0.1
    assert _max_diff(logits, _logits(_load(built(name, rope_parameters=same_theta)))) > 0.1


@torch.inference_mode()
def test_phi3_prompts_straddle_the_longrope_switch(built):
    """transformers picks short or long factors per forward, by its longest position: prompts
    up to original_max_position_embeddings (32) get the short ones, longer ones the long ones
    at every position (and tokens already cached keep the rotation they were given)."""
    model = _load(built("phi3_partial_longrope"))
    prompt = _prompts(model.config.vocab_size)[1]  # 37 tokens
    alone = model(prompt[None, :21]).logits[0]
    in_32 = model(prompt[None, :32]).logits[0, :21]
    in_37 = model(prompt[None]).logits[0, :21]
    torch.testing.assert_close(alone, in_32, atol=1e-5, rtol=0)
    assert (alone - in_37).abs().max().item() > 1e-2


# Each case's own config values, changed one at a time: every change moves the logits far past
# the shard tests' 1e-4, so a server ignoring the value fails them.
FEATURES = [
    ("smollm3_nope", {"no_rope_layers": [1, 1]}),
    ("granite_multipliers", {"embedding_multiplier": 1.0}),
    ("granite_multipliers", {"attention_multiplier": 0.25}),
    ("granite_multipliers", {"residual_multiplier": 1.0}),
    ("granite_multipliers", {"logits_scaling": 1.0}),
    (
        "olmo3_sliding_one_kv_head",
        {
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            }
        },
    ),
    ("olmo3_sliding_one_kv_head", {"layer_types": ["full_attention", "full_attention"]}),
    # no window: every layer full and rotating (transformers needs layer_types to agree)
    ("exaone4_sliding_nope", {"sliding_window": None, "layer_types": ["full_attention"] * 2}),
    ("glm4_interleaved_partial", {"partial_rotary_factor": 1.0}),
    ("seed_oss_out_bias", {"attention_out_bias": False}),
    ("ernie4_5_biased_interleaved", {"use_bias": False}),
    ("olmo_weightless_norms_clip", {"clip_qkv": None}),
    ("phi_parallel_head_bias", {"partial_rotary_factor": 1.0}),
    ("stablelm2_qkv_bias", {"partial_rotary_factor": 1.0}),
    ("nemotron_layernorm1p_relu2", {"partial_rotary_factor": 1.0}),
    ("gpt_neox_parallel_two_norms", {"use_parallel_residual": False}),
]


@pytest.mark.parametrize("name, change", FEATURES)
def test_each_config_value_changes_the_logits(built, name, change):
    assert _max_diff(_logits(_load(built(name))), _logits(_load(built(name, **change)))) > 1e-2
