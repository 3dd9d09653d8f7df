"""Builds small checkpoints locally (Llama family, Gemma 2/3, Phi-3, SmolLM3, Granite, OLMo 2/3,
EXAONE 4, Mixtral, Qwen2/3-MoE, gpt-oss, GLM-4.5): random weights and a byte-level BPE tokenizer.

There is no model hub here, so every test model comes from this one builder.
The tokenizer is byte-level, so any text (multi-byte UTF-8 included) round-trips.
"""

import copy
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|end|>"]

# A small corpus with enough variety for BPE merges; non-ASCII lines exercise multi-byte tokens.
_CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Switchyard serves language models over HTTP with continuous batching.",
    "Paged attention reads keys and values through a block table.",
    "Tensor parallelism splits every layer across several devices.",
    "In the beginning the universe was created, which made a lot of people very angry.",
    "def forward(self, x): return self.down(self.act(self.gate(x)) * self.up(x))",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2048 65536",
    "Ünïcödé façade naïve café résumé — “quotes” and ‘apostrophes’ …",
    "日本語のテキストと中文文本以及한국어 텍스트",
    "Emoji: 🚀🔥✨🙂 and symbols ∑ ∫ √ ∞ ≠ ≤ ≥ π",
]

ARCHITECTURES = {
    "LlamaForCausalLM": "LlamaConfig",
    "MistralForCausalLM": "MistralConfig",
    "MinistralForCausalLM": "MinistralConfig",
    "Ministral3ForCausalLM": "Ministral3Config",
    # Mistral Small 3.1 and later as released: Pixtral's vision tower before a Mistral
    "Mistral3ForConditionalGeneration": "MistralConfig",
    "Qwen2ForCausalLM": "Qwen2Config",
    "Qwen3ForCausalLM": "Qwen3Config",
    "GemmaForCausalLM": "GemmaConfig",
    "Gemma2ForCausalLM": "Gemma2Config",
    "VaultGemmaForCausalLM": "VaultGemmaConfig",
    "Gemma3ForCausalLM": "Gemma3TextConfig",  # text-only Gemma 3 (Gemma3Config is the VLM's)
    # Gemma 3 4B and up as released: the vision-language wrapper around Gemma3TextConfig's LM
    "Gemma3ForConditionalGeneration": "Gemma3TextConfig",
    "Gemma4ForCausalLM": "Gemma4TextConfig",
    "Gemma4ForConditionalGeneration": "Gemma4TextConfig",
    "Gemma3nForCausalLM": "Gemma3nTextConfig",
    "Gemma4UnifiedForCausalLM": "Gemma4UnifiedTextConfig",
    "Gemma4UnifiedForConditionalGeneration": "Gemma4UnifiedTextConfig",
    "Phi3ForCausalLM": "Phi3Config",
    "SmolLM3ForCausalLM": "SmolLM3Config",
    "GraniteForCausalLM": "GraniteConfig",
    "Olmo2ForCausalLM": "Olmo2Config",
    "Olmo3ForCausalLM": "Olmo3Config",
    "OlmoHybridForCausalLM": "OlmoHybridConfig",
    "Exaone4ForCausalLM": "Exaone4Config",
    "GlmForCausalLM": "GlmConfig",
    "Glm4ForCausalLM": "Glm4Config",
    "HeliumForCausalLM": "HeliumConfig",
    "ArceeForCausalLM": "ArceeConfig",
    "Starcoder2ForCausalLM": "Starcoder2Config",
    "PhiForCausalLM": "PhiConfig",
    "StableLmForCausalLM": "StableLmConfig",
    "NemotronForCausalLM": "NemotronConfig",
    "OlmoForCausalLM": "OlmoConfig",
    "GPTNeoXForCausalLM": "GPTNeoXConfig",
    "BloomForCausalLM": "BloomConfig",
    "MptForCausalLM": "MptConfig",
    "CohereForCausalLM": "CohereConfig",
    "Cohere2ForCausalLM": "Cohere2Config",
    "SeedOssForCausalLM": "SeedOssConfig",
    "Ernie4_5ForCausalLM": "Ernie4_5Config",
    "Ernie4_5_MoeForCausalLM": "Ernie4_5_MoeConfig",
    "MixtralForCausalLM": "MixtralConfig",
    "PhimoeForCausalLM": "PhimoeConfig",
    "Qwen2MoeForCausalLM": "Qwen2MoeConfig",
    "Qwen3MoeForCausalLM": "Qwen3MoeConfig",
    "GptOssForCausalLM": "GptOssConfig",
    "Glm4MoeForCausalLM": "Glm4MoeConfig",
    "DeepseekV2ForCausalLM": "DeepseekV2Config",
    "DeepseekV3ForCausalLM": "DeepseekV3Config",
    "Glm4MoeLiteForCausalLM": "Glm4MoeLiteConfig",
    "DeepseekV32ForCausalLM": "DeepseekV32Config",
    "GlmMoeDsaForCausalLM": "GlmMoeDsaConfig",
    "MiniMaxM2ForCausalLM": "MiniMaxM2Config",
    "OlmoeForCausalLM": "OlmoeConfig",
    "GraniteMoeForCausalLM": "GraniteMoeConfig",
    "Mistral4ForCausalLM": "Mistral4Config",
    "Dots1ForCausalLM": "Dots1Config",
    "SolarOpenForCausalLM": "SolarOpenConfig",
    "GraniteSWAForCausalLM": "GraniteSWAConfig",
    "GraniteMoeSWAForCausalLM": "GraniteMoeSWAConfig",
    "GraniteMoeSharedForCausalLM": "GraniteMoeSharedConfig",
    "GraniteMoeHybridForCausalLM": "GraniteMoeHybridConfig",
    "BambaForCausalLM": "BambaConfig",
    "NemotronHForCausalLM": "NemotronHConfig",
    "GPTBigCodeForCausalLM": "GPTBigCodeConfig",
    "FalconForCausalLM": "FalconConfig",
    "ExaoneForCausalLM": "ExaoneConfig",
    "ApertusForCausalLM": "ApertusConfig",
    "InternLM3ForCausalLM": "InternLM3Config",
    "IQuestCoderForCausalLM": "IQuestCoderConfig",
    "ExaoneMoeForCausalLM": "ExaoneMoeConfig",
    "FlexOlmoForCausalLM": "FlexOlmoConfig",
    "YoutuForCausalLM": "YoutuConfig",
    "AfmoeForCausalLM": "AfmoeConfig",
    "HunYuanDenseV1ForCausalLM": "HunYuanDenseV1Config",
    "HunYuanMoEV1ForCausalLM": "HunYuanMoEV1Config",
    "Qwen3_5ForCausalLM": "Qwen3_5TextConfig",
    "Qwen3_5MoeForCausalLM": "Qwen3_5MoeTextConfig",
    # Qwen3.5 as released: the vision-language wrapper around its LM
    "Qwen3_5ForConditionalGeneration": "Qwen3_5TextConfig",
    "Qwen2VLForConditionalGeneration": "Qwen2VLTextConfig",
    "Qwen2_5_VLForConditionalGeneration": "Qwen2_5_VLTextConfig",
    "Qwen3VLForConditionalGeneration": "Qwen3VLTextConfig",
    "Qwen3VLMoeForConditionalGeneration": "Qwen3VLMoeTextConfig",
    "Glm4vForConditionalGeneration": "Glm4vTextConfig",
    "CwmForCausalLM": "CwmConfig",
    # LLaVA-style wrappers (Pixtral-12B, Apriel): a Mistral's config inside
    "LlavaForConditionalGeneration": "MistralConfig",
    # Mistral's Voxtral: a Llama behind a Whisper-style audio encoder
    "VoxtralForConditionalGeneration": "LlamaConfig",
    # Kimi K2.5 and K2.6: DeepSeek-V3's layers behind a vision tower
    "Kimi_K25ForConditionalGeneration": "DeepseekV3Config",
    "Lfm2ForCausalLM": "Lfm2Config",
    "Lfm2MoeForCausalLM": "Lfm2MoeConfig",
    "Lfm3ForCausalLM": "Lfm3Config",
    "FalconH1ForCausalLM": "FalconH1Config",
    "OPTForCausalLM": "OPTConfig",
    "Jais2ForCausalLM": "Jais2Config",
    "NanoChatForCausalLM": "NanoChatConfig",
    "Kolibri1ForCausalLM": "Kolibri1Config",
    "Cohere2MoeForCausalLM": "Cohere2MoeConfig",
    "FlintForCausalLM": "FlintConfig",
    "LaraMiniForCausalLM": "LaraMiniConfig",
    "MiMoV2FlashForCausalLM": "MiMoV2FlashConfig",
    "MistralLarge4ForConditionalGeneration": "MistralLarge4TextConfig",
    "LagunaForCausalLM": "LagunaConfig",
    "MellumForCausalLM": "MellumConfig",
    "GPT2LMHeadModel": "GPT2Config",
    "Mamba2ForCausalLM": "Mamba2Config",
    "MambaForCausalLM": "MambaConfig",
    "FalconMambaForCausalLM": "FalconMambaConfig",
    "JambaForCausalLM": "JambaConfig",
    "Glm4vMoeForConditionalGeneration": "Glm4vMoeTextConfig",
    "Glm46VForConditionalGeneration": "Glm4vMoeTextConfig",
    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeTextConfig",
    "Qwen3NextForCausalLM": "Qwen3NextConfig",
    "KimiLinearForCausalLM": "KimiLinearConfig",
    "BailingHybridForCausalLM": "BailingHybridConfig",
    "Llama4ForCausalLM": "Llama4TextConfig",
    # Llama 4 as released: the vision-language wrapper around Llama4TextConfig's LM
    "Llama4ForConditionalGeneration": "Llama4TextConfig",
}


_QWEN3_5_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                   "out_hidden_size": 64, "num_position_embeddings": 16}  # fmt: skip

_GLM4V_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                 "out_hidden_size": 64, "image_size": 28}  # fmt: skip

# Vision-language wrappers -> their config class and its arguments besides the LM's config: a
# tiny vision tower (its weights are saved, as in the released checkpoints, and a text-only
# server skips them).
VISION_LANGUAGE = {
    "Gemma3ForConditionalGeneration": ("Gemma3Config", {
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
        "mm_tokens_per_image": 4,  # a whole number of the 2x2 patches' pooling windows
    }),
    "Qwen3_5ForConditionalGeneration": ("Qwen3_5Config", {"vision_config": _QWEN3_5_VISION}),
    "Qwen2VLForConditionalGeneration": ("Qwen2VLConfig", {
        "vision_config": {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2}}),
    "Qwen2_5_VLForConditionalGeneration": ("Qwen2_5_VLConfig", {
        "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                          "out_hidden_size": 64, "fullatt_block_indexes": [0]}}),
    "Qwen3VLForConditionalGeneration": ("Qwen3VLConfig", {
        "vision_config": {**_QWEN3_5_VISION, "deepstack_visual_indexes": [0]}}),
    "Qwen3VLMoeForConditionalGeneration": ("Qwen3VLMoeConfig", {
        "vision_config": {**_QWEN3_5_VISION, "deepstack_visual_indexes": [0]}}),
    "Qwen3_5MoeForConditionalGeneration": ("Qwen3_5MoeConfig", {
        "vision_config": _QWEN3_5_VISION}),
    "Glm4vForConditionalGeneration": ("Glm4vConfig", {"vision_config": _GLM4V_VISION}),
    "Glm4vMoeForConditionalGeneration": ("Glm4vMoeConfig", {"vision_config": _GLM4V_VISION}),
    "Glm46VForConditionalGeneration": ("Glm46VConfig", {"vision_config": _GLM4V_VISION}),
    "Gemma4ForConditionalGeneration": ("Gemma4Config", {
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
                          "position_embedding_size": 64},
        "audio_config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                         "subsampling_conv_channels": [8, 4], "output_proj_dims": 32},
    }),
    "Llama4ForConditionalGeneration": ("Llama4Config", {
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                          "vision_output_dim": 32, "projector_input_dim": 32,
                          "projector_output_dim": 32},
    }),
    # (no towers: the unified model's vision and audio embedders are optional)
    "Gemma4UnifiedForConditionalGeneration": ("Gemma4UnifiedConfig", {}),
    "Kimi_K25ForConditionalGeneration": ("Kimi_K25Config", {
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "pos_emb_height": 4, "pos_emb_width": 4},
        "projection_hidden_size": 32,
    }),
    "VoxtralForConditionalGeneration": ("VoxtralConfig", {
        "audio_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                         "num_attention_heads": 2, "num_mel_bins": 16,
                         "max_source_positions": 8},
    }),
    "LlavaForConditionalGeneration": ("LlavaConfig", {
        "vision_config": {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64,
                          "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 16,
                          "image_size": 28, "patch_size": 14},
    }),
    "Mistral3ForConditionalGeneration": ("Mistral3Config", {
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "head_dim": 16, "image_size": 28,
                          "patch_size": 14},
    }),
    "MistralLarge4ForConditionalGeneration": ("MistralLarge4Config", {
        "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "head_dim": 16, "image_size": 28,
                          "patch_size": 14},
    }),
}  # fmt: skip


def _vision_language(architecture: str, text_config):
    """The wrapper's config around `text_config`."""
    import transformers

    config_class, arguments = VISION_LANGUAGE[architecture]
    return getattr(transformers, config_class)(
        text_config=text_config.to_dict(),
        # the LM's, not the wrapper's default (Mistral 3's is tied; its LM is not, and a tied
        # wrapper would drop the lm_head on save)
        # (Qwen2.5-VL's text config has no such field: the wrapper's says it)
        tie_word_embeddings=getattr(text_config, "tie_word_embeddings", False),
        **arguments,
    )


# Dense architectures added after the first ones: random norms, and positions sized for tests
# (their defaults tabulate rotary tables for 32k-128k positions).
POST_LLAMA_ARCHITECTURES = (
    "SmolLM3ForCausalLM",
    "GraniteForCausalLM",
    "Olmo2ForCausalLM",
    "Olmo3ForCausalLM",
    "Exaone4ForCausalLM",
    "Glm4ForCausalLM",
    "Glm4vForConditionalGeneration",
    "CwmForCausalLM",
    "Lfm2ForCausalLM",
    "Lfm3ForCausalLM",
    "SeedOssForCausalLM",
    "Ernie4_5ForCausalLM",
    "CohereForCausalLM",
    "Cohere2ForCausalLM",
    "GraniteSWAForCausalLM",
    "Ministral3ForCausalLM",
    "YoutuForCausalLM",
    "HunYuanDenseV1ForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "GlmForCausalLM",
    "HeliumForCausalLM",
    "ArceeForCausalLM",
    "Starcoder2ForCausalLM",
    "PhiForCausalLM",
    "StableLmForCausalLM",
    "OlmoForCausalLM",  # (its norms have no weights: nothing random there)
    "NemotronForCausalLM",  # 1 + w norms: _NORM_IDENTITY says 0
    "GPTNeoXForCausalLM",
)
MOE_ARCHITECTURES = (
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen3VLMoeForConditionalGeneration",
    "PhimoeForCausalLM",
    "GptOssForCausalLM",
    "Glm4MoeForCausalLM",
    "Glm4vMoeForConditionalGeneration",
    "Glm46VForConditionalGeneration",
    "Lfm2MoeForCausalLM",
    "Kolibri1ForCausalLM",
    "Cohere2MoeForCausalLM",
    "FlintForCausalLM",
    "MiMoV2FlashForCausalLM",
    "LagunaForCausalLM",
    "MellumForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "DeepseekV32ForCausalLM",
    "GlmMoeDsaForCausalLM",
    "Kimi_K25ForConditionalGeneration",
    "Ernie4_5_MoeForCausalLM",
    "MiniMaxM2ForCausalLM",
    "OlmoeForCausalLM",
    "GraniteMoeForCausalLM",
    "Mistral4ForCausalLM",
    "Dots1ForCausalLM",
    "SolarOpenForCausalLM",
    "GraniteMoeSWAForCausalLM",
    "GraniteMoeSharedForCausalLM",
    "ExaoneMoeForCausalLM",
    "FlexOlmoForCausalLM",
    "AfmoeForCausalLM",
    "HunYuanMoEV1ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3NextForCausalLM",
    "Llama4ForCausalLM",
    "Llama4ForConditionalGeneration",
    "KimiLinearForCausalLM",
    "BailingHybridForCausalLM",
)
# Kimi Delta Attention beside latent attention (Kimi Linear, Ling's hybrids)
KDA_ARCHITECTURES = ("KimiLinearForCausalLM", "BailingHybridForCausalLM")
# Gated DeltaNet linear attention in some layers (Qwen3.5)
LINEAR_ATTENTION_ARCHITECTURES = (
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3NextForCausalLM",
)
# The tiny Gated DeltaNet heads (Qwen3.5's, OLMo-Hybrid's, Lara's): 2 key heads of 16, values of
# 24 dims (each architecture its own number of value heads)
_TINY_LINEAR_HEADS = {"linear_num_key_heads": 2, "linear_key_head_dim": 16,
                      "linear_value_head_dim": 24}  # fmt: skip
# Every MLP an expert block: the released configs have no intermediate_size
_NO_DENSE_MLP = ("SolarOpenForCausalLM",)
# Multi-head latent attention (DeepSeek's)
MLA_ARCHITECTURES = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "Mistral4ForCausalLM",
    "YoutuForCausalLM",
    "DeepseekV32ForCausalLM",
    "GlmMoeDsaForCausalLM",
    "Kimi_K25ForConditionalGeneration",
    "MistralLarge4ForConditionalGeneration",
)
# ... whose attention reads only the tokens an indexer picks (DeepSeek Sparse Attention)
SPARSE_ATTENTION_ARCHITECTURES = (
    "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "MistralLarge4ForConditionalGeneration",
)  # fmt: skip
# Mistral Large 4's learned scales, their inits 0 (scale) and 1 (bias, LeRoPE's exp(alpha)):
# spread so that each moves the logits (name suffix -> mean, spread)
_MISTRAL_LARGE4_SCALES = {
    "softmax_scaling.scale": (0.0, 0.2),
    "softmax_scaling.bias": (1.0, 0.2),
    "rotary_emb.alpha": (0.0, 0.3),
}
# The router's weights spread wider than the rest: its top-k choices then have clear margins,
# so a model that computes the layer's input within rounding picks the same experts.
_ROUTER_SPREAD = 0.3
_ROUTERS = (
    "mlp.gate.weight", "mlp.router.weight", "mlp.router.gate.weight", "feed_forward.router.weight",
    "feed_forward.gate.weight",  # LFM2-MoE's
)  # fmt: skip
# gpt-oss's attention sinks: a logit per head of the size of the scores', so that a model
# ignoring them (or applying them to the wrong head) is visibly off.
_SINK_MEAN, _SINK_SPREAD = 0.5, 1.0
# GLM-4.5's per-expert correction of the sigmoid scores its router chooses by (zeros at init):
# about the size of the scores' own spread, so that the choices with it differ from those without
_CORRECTION_SPREAD = 0.2
# Gemma 4's multipliers that are ones at init (each layer's output scalar, its router's input
# scale and per-expert scale): random around one, so that one left out shows
_GEMMA4_SCALES = (
    "layer_scalar", "router.scale", "router.per_expert_scale",
    "altup.correct_output_scale",  # Gemma 3n's (zeros at init)
)  # fmt: skip
_SCALE_SPREAD = 0.2
_GEMMA4_ROUTER_SPREAD = 1.0

# Mamba 2 mixers' per-head scalars, as ranges like the releases': time steps of about 0.02 to
# 0.3 (dt_bias through softplus) and decays exp(A_log) of 0.4 to 2.7, so that some heads
# remember a few tokens and others hundreds; the skip D around one
_MAMBA_INIT = {"mamba.A_log": (-1.0, 1.0), "mamba.dt_bias": (-4.0, -1.0), "mamba.D": (0.5, 1.5)}
# KDA's forget gates likewise (per head A_log, per channel dt_bias through softplus or Ling's
# bounded sigmoid): decays from about 0.99 to 0.4 a token, so that some channels carry the
# state across a whole test prompt; at the plain 0.05 spread every channel would halve a token
_KDA_INIT = {"forget_gate.A_log": (-1.0, 1.0), "forget_gate.dt_bias": (-5.0, -1.0)}
# Mamba 1 mixers' per-channel parameters likewise: decays exp(A_log) of 1 to 16 per state
# element (the releases' init), time steps of about 0.007 to 0.3 (dt_proj's bias through
# softplus), so that some channels remember hundreds of tokens; the skip D around one
_MAMBA1_ARCHITECTURES = ("MambaForCausalLM", "FalconMambaForCausalLM", "JambaForCausalLM")
_MAMBA1_INIT = {".A_log": (0.0, 2.8), ".dt_proj.bias": (-5.0, -1.0), ".D": (0.5, 1.5)}
# ... and the conv's and x_proj's weights spread wider than the rest: B and C (so the state's
# reading) then weigh about one, as in the releases, where at 0.05 two small products would make
# them vanish beside the skip D x and a model that lost its state would go unnoticed
_MAMBA1_SPREAD = {".conv1d.weight": 0.3, ".x_proj.weight": 0.5}


def _by_ending(name: str, table: dict[str, Any]) -> Any:
    """The value of `table` whose key `name` ends with, or None."""
    return next((value for end, value in table.items() if name.endswith(end)), None)


# Where each norm's weight is its identity: Gemma norms compute x * (1 + w), others x * w. Left
# at their init (zeros for Gemma) a norm's weight would be invisible: a model computing x * w or
# skipping the norm would go unnoticed. Only these architectures get random norms, so the older
# ones' checkpoints stay byte-identical to what their tests were written against.
_NORM_IDENTITY = {
    "GemmaForCausalLM": 0.0,
    "Gemma2ForCausalLM": 0.0,
    "VaultGemmaForCausalLM": 0.0,
    "Gemma3ForCausalLM": 0.0,
    "Gemma3ForConditionalGeneration": 0.0,
    "Phi3ForCausalLM": 1.0,
    "Gemma4ForCausalLM": 1.0,  # x * w, unlike Gemma 2 and 3
    "Gemma4ForConditionalGeneration": 1.0,
    "Gemma3nForCausalLM": 1.0,  # x * w, as Gemma 4's
    "Gemma4UnifiedForCausalLM": 1.0,
    "Gemma4UnifiedForConditionalGeneration": 1.0,
    **dict.fromkeys(POST_LLAMA_ARCHITECTURES, 1.0),
    **dict.fromkeys(MOE_ARCHITECTURES, 1.0),
    **dict.fromkeys(LINEAR_ATTENTION_ARCHITECTURES, 0.0),  # 1 + w, but for the gated norm:
    "NemotronForCausalLM": 0.0,  # LayerNorm1P: 1 + w
    "GraniteMoeHybridForCausalLM": 1.0,  # its Mamba layers' gated norms too
    "BambaForCausalLM": 1.0,
    "FalconH1ForCausalLM": 1.0,
    "OlmoHybridForCausalLM": 1.0,  # its gated output norms too
    "MistralLarge4ForConditionalGeneration": 1.0,
    "LaraMiniForCausalLM": 1.0,  # likewise
    "OPTForCausalLM": 1.0,
    "Jais2ForCausalLM": 1.0,
    "GPT2LMHeadModel": 1.0,
    "BloomForCausalLM": 1.0,
    "MptForCausalLM": 1.0,
    "Mamba2ForCausalLM": 1.0,
    "MambaForCausalLM": 1.0,
    "FalconMambaForCausalLM": 1.0,
    "JambaForCausalLM": 1.0,  # its mixers' dt, B and C norms too
    "NemotronHForCausalLM": 1.0,
    "GPTBigCodeForCausalLM": 1.0,
    "FalconForCausalLM": 1.0,
    "ExaoneForCausalLM": 1.0,
    "ApertusForCausalLM": 1.0,
    "InternLM3ForCausalLM": 1.0,
    "IQuestCoderForCausalLM": 1.0,
}
# norms computing x * w in a model whose others compute x * (1 + w)
_PLAIN_NORMS = ("linear_attn.norm.weight",)
# LayerNorms' names that do not say "norm": GPT-2's (GPTBigCode's ln_1, ln_2, ln_f), Falcon's
# parallel ones (ln_attn, ln_mlp)
_GPT2_NORM = re.compile(r"(^|\.)ln_(\d+|f|attn|mlp)\.")


def is_norm(name: str) -> bool:
    """Whether a parameter belongs to a norm, by its name."""
    return "norm" in name or _GPT2_NORM.search(name) is not None


_NORM_SPREAD = 0.1


def _corpus() -> list[str]:
    words = " ".join(_CORPUS_LINES).split()
    # Deterministic shuffles of the words give the trainer more pairs to merge.
    lines = list(_CORPUS_LINES)
    for stride in range(1, 40):
        lines.append(" ".join(words[i % len(words)] for i in range(0, len(words) * stride, stride)))
    return lines


def build_tokenizer(vocab_size: int, corpus: Iterable[str] | None = None):
    """A byte-level BPE PreTrainedTokenizerFast trained on `corpus` (default: the built-in one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus() if corpus is None else corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<|end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(
    path: str | Path,
    architecture: str = "LlamaForCausalLM",
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    seed: int = 0,
    dtype: str = "float32",
    stacked_experts: bool = False,
    module_names: bool = False,
    mxfp4_experts: bool = False,
    chat_family: str | None = None,
    text_config: str | None = None,
    **config_overrides,
) -> Path:
    """Writes config, safetensors weights and tokenizer of a random model to `path`.

    `vocab_size` is the model's embedding size; the tokenizer may have fewer entries (the
    trainer stops when it runs out of merges), as real checkpoints often pad their vocabulary.
    `stacked_experts`: a Mixture-of-Experts model saved as transformers 5 holds its experts
    (stacked `experts.gate_up_proj` / `experts.down_proj`) instead of the Hub's per-expert layout.
    `module_names`: saved under transformers 5's module names rather than the Hub's (for a
    vision-language model, `model.language_model.layers...` instead of `language_model.model...`).
    `mxfp4_experts`: gpt-oss's experts in MXFP4, as released (launcher/tiny_mxfp4.py).
    `chat_family`: the tokenizer and chat template of a `launcher.chat_families` family (tool
    calls, reasoning); the embedding then grows to cover its added tokens when they pass
    `vocab_size`.
    `text_config`: a vision-language wrapper's language-model config class in place of the
    architecture's own (`Ministral3Config`: Ministral 3 as released, a Mistral3 wrapper).
    """
    import torch
    import transformers

    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r}; one of {sorted(ARCHITECTURES)}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if chat_family is None:
        tokenizer = build_tokenizer(vocab_size)
    else:
        from launcher.chat_families import family_tokenizer

        tokenizer = family_tokenizer(chat_family, vocab_size)
        vocab_size = max(vocab_size, len(tokenizer))
    config_cls = getattr(transformers, text_config or ARCHITECTURES[architecture])
    if architecture in MLA_ARCHITECTURES or architecture in KDA_ARCHITECTURES:
        # latent attention expands every head's keys and values: transformers' MLA wants as
        # many "KV heads" as heads
        num_key_value_heads = num_attention_heads
    # transformers' configs edit nested values in place (Mistral 4's fills partial_rotary_factor
    # into rope_parameters): the caller's dicts, often shared by several cases, stay untouched
    config_overrides = copy.deepcopy(config_overrides)
    defaults = _tiny_defaults(
        architecture, hidden_size, num_attention_heads, config_overrides, vocab_size
    )
    config_overrides = {**defaults, **config_overrides}
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=config_overrides.pop("pad_token_id", None),
        **config_overrides,
    )
    if architecture in VISION_LANGUAGE:
        config = _vision_language(architecture, config)
    config.architectures = [architecture]
    torch.manual_seed(seed)
    # (EXAONE 3.5, InternLM3, IQuest-Coder: transformers runs them as Llama, no class of their own)
    model_cls = getattr(transformers, architecture, None)
    if model_cls is None:
        model = transformers.AutoModelForCausalLM.from_config(config)
    else:
        model = model_cls(config)
    model = model.to(getattr(torch, dtype))
    # Random init gives near-uniform logits; a wider spread makes greedy choices decisive, so
    # token-equality tests compare real decisions rather than numerical ties.
    with torch.no_grad():
        # GLM-4.5's routers' correction biases are buffers, saved with the weights
        # (and Gemma 4's layer scalars, ones at init)
        corrections = [
            (n, b) for n, b in model.named_buffers()
            if n.endswith(("e_score_correction_bias", "layer_scalar", "feed_forward.expert_bias"))
        ]  # fmt: skip
        for name, param in [*model.named_parameters(), *corrections]:
            if name.endswith(_GEMMA4_SCALES):
                param.normal_(1.0, _SCALE_SPREAD)
            elif name.endswith("router.proj.weight"):  # Gemma 4's: its inputs are ~H ** -0.5
                param.normal_(0.0, _GEMMA4_ROUTER_SPREAD)
            elif name.endswith(_ROUTERS):  # an MoE router
                param.normal_(0.0, _ROUTER_SPREAD)
            elif name.endswith("self_attn.sinks"):
                param.normal_(_SINK_MEAN, _SINK_SPREAD)
            elif name.endswith(tuple(_MISTRAL_LARGE4_SCALES)):
                suffix = next(s for s in _MISTRAL_LARGE4_SCALES if name.endswith(s))
                param.normal_(*_MISTRAL_LARGE4_SCALES[suffix])
            elif name.endswith(
                ("e_score_correction_bias", "mlp.expert_bias", "feed_forward.expert_bias")
            ):  # AFMoE's, LFM2-MoE's
                param.normal_(0.0, _CORRECTION_SPREAD)
            elif architecture in _MAMBA1_ARCHITECTURES and _by_ending(name, _MAMBA1_INIT):
                param.uniform_(*_by_ending(name, _MAMBA1_INIT))
            elif architecture in _MAMBA1_ARCHITECTURES and _by_ending(name, _MAMBA1_SPREAD):
                param.normal_(0.0, _by_ending(name, _MAMBA1_SPREAD))
            elif _by_ending(name, _KDA_INIT):
                param.uniform_(*_by_ending(name, _KDA_INIT))
            elif name.endswith(tuple(_MAMBA_INIT)):
                low, high = _MAMBA_INIT[".".join(name.split(".")[-2:])]
                param.uniform_(low, high)
            elif not is_norm(name):
                param.normal_(0.0, 0.08 if "embed" in name or "lm_head" in name else 0.05)
            elif name.endswith(_PLAIN_NORMS):
                param.normal_(1.0, _NORM_SPREAD)
            elif architecture in _NORM_IDENTITY:
                # a LayerNorm's bias (zeros at init) is random around its identity, zero
                bias = name.endswith(".bias")
                param.normal_(0.0 if bias else _NORM_IDENTITY[architecture], _NORM_SPREAD)
    # transformers 5 writes the Hub's names by default; without them, its own module names
    # (stacked experts; a vision-language model's `model.language_model.`)
    hub_names = not (stacked_experts or module_names)
    model.save_pretrained(path, safe_serialization=True, save_original_format=hub_names)
    if mxfp4_experts:
        from launcher.tiny_mxfp4 import to_mxfp4

        to_mxfp4(path, seed)
    if model_cls is None:  # as released: the config names the architecture, not Llama
        saved = json.loads((path / "config.json").read_text())
        saved["architectures"] = [architecture]
        (path / "config.json").write_text(json.dumps(saved, indent=2))
    if architecture in _NO_DENSE_MLP:  # as released: the config names no dense MLP size
        saved = json.loads((path / "config.json").read_text())
        saved.pop("intermediate_size", None)
        (path / "config.json").write_text(json.dumps(saved, indent=2))
    tokenizer.save_pretrained(path)
    # A generation_config with eos lets both transformers and Switchyard stop on the same token.
    eos_token_id = tokenizer.eos_token_id
    if chat_family is not None:  # a family may end turns with several tokens (Llama 3's eom)
        from launcher.chat_families import family_eos_ids

        eos_token_id = family_eos_ids(chat_family, tokenizer)
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos_token_id})
    )
    return path


def _tiny_defaults(
    architecture: str,
    hidden_size: int,
    num_attention_heads: int,
    overrides: dict,
    vocab_size: int = 512,
) -> dict:
    """Config values whose transformers defaults are sized for the real models (Gemma's head_dim
    256 and 4096-token window, Gemma 3's 131072 positions, which the server tabulates rotary
    tables for); `overrides` win over these."""
    if architecture.startswith("Gemma4"):
        # the releases' head_dim 256 (512 global), 512-1024-token windows, 131072 positions,
        # and the per-layer embeddings' 262144-row table of 256 a layer (none in the unified
        # models)
        head_dim = overrides.get("head_dim", hidden_size // num_attention_heads)
        per_layer = {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": vocab_size}
        return {
            "head_dim": head_dim,
            "global_head_dim": 2 * head_dim,
            "sliding_window": 8,
            "max_position_embeddings": 512,
            **({} if architecture.startswith("Gemma4Unified") else per_layer),
        }
    if architecture.startswith("Gemma3n"):
        # the releases' 2048 and 256-wide per-layer inputs, windows of 512, 32768 positions,
        # a shared KV cache in the last 10-20 of 30-35 layers, AltUp over 4 streams
        head_dim = overrides.get("head_dim", hidden_size // num_attention_heads)
        return {
            "head_dim": head_dim,
            "sliding_window": 8,
            "max_position_embeddings": 512,
            "hidden_size_per_layer_input": 8,
            "vocab_size_per_layer_input": vocab_size,
            "laurel_rank": 8,
            "num_kv_shared_layers": 0,
            "activation_sparsity_pattern": None,
        }
    if architecture.startswith("Llama4"):
        # the releases' 8192-token chunks and temperature floor, 131072 positions, 16-128
        # experts of 8192 beside dense MLPs of 16384, NoPE every fourth layer: tests see each
        # feature within a few tokens and two layers
        return {
            "head_dim": hidden_size // num_attention_heads,
            "max_position_embeddings": 512,
            "attention_chunk_size": 8,
            "floor_scale": 4,
            "attn_scale": 0.5,
            "num_local_experts": 4,
            "intermediate_size_mlp": 96,
            "no_rope_layer_interval": 2,
        }
    if architecture.startswith(("Gemma", "VaultGemma")):
        head_dim = overrides.get("head_dim", hidden_size // num_attention_heads)
        return {
            "head_dim": head_dim,
            "query_pre_attn_scalar": head_dim,  # scores scaled by head_dim ** -0.5, as in Gemma 2B
            "sliding_window": 8,
            "max_position_embeddings": 512,
        }
    if architecture == "Phi3ForCausalLM":
        max_positions = overrides.get("max_position_embeddings", 512)
        # Phi-3's 4096 default would be a pretraining length past the model's own maximum; it
        # matters only to longrope, whose cases set it.
        return {
            "max_position_embeddings": max_positions,
            "original_max_position_embeddings": max_positions,
        }
    if architecture == "GptOssForCausalLM":
        # gpt-oss's own are sized for the released models: 128 experts, head_dim 64, a
        # 128-token window, YaRN from 4096 positions
        return {
            "head_dim": hidden_size // num_attention_heads,
            "num_local_experts": 6,
            "num_experts_per_tok": 2,
            "sliding_window": 8,
            "max_position_embeddings": 512,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150_000.0,
                "factor": 8.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 64,
            },
        }
    if architecture in KDA_ARCHITECTURES:
        # the releases' 32 KDA heads of 128 (kernel 4), MLA ranks of 512, 256-512 experts (top
        # 8) in groups, 27-42 layers: 4 heads of 16 beside a 32-wide latent
        head_dim = hidden_size // num_attention_heads
        kda = (
            {"linear_num_heads": num_attention_heads, "linear_head_dim": head_dim}
            if architecture == "KimiLinearForCausalLM"
            else {"head_dim": head_dim}  # Ling's KDA heads are num_attention_heads of head_dim
        )
        return {
            **kda,
            "max_position_embeddings": 512,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": head_dim,
            "qk_rope_head_dim": head_dim // 2,
            "v_head_dim": head_dim,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "n_group": 2,
            "topk_group": 1,
            "first_k_dense_replace": 1,
        }
    if architecture in MLA_ARCHITECTURES:
        # the releases' latent attention ranks (512, 1536), 64-256 experts and 47-61 layers
        head_dim = hidden_size // num_attention_heads
        # GLM-4.7-Flash lists its dense layers (the first, by default) in mlp_layer_types
        dense = {} if architecture == "Glm4MoeLiteForCausalLM" else {"first_k_dense_replace": 1}
        return {
            **dense,
            "max_position_embeddings": 512,
            "q_lora_rank": None
            if architecture in ("DeepseekV2ForCausalLM", "MistralLarge4ForConditionalGeneration")
            else 48,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": head_dim,
            "qk_rope_head_dim": head_dim // 2,
            "v_head_dim": head_dim,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "n_shared_experts": 1,
            "n_group": 4,
            "topk_group": 2,
            # DeepSeek-V3.2's and GLM-5's indexer (DSA): 64 or 32 heads of 128 choose 2048 tokens
            **(
                {"index_n_heads": 8, "index_head_dim": 2 * head_dim, "index_topk": 12}
                if architecture in SPARSE_ATTENTION_ARCHITECTURES
                else {}
            ),
        }
    if architecture == "MiniMaxM2ForCausalLM":
        # the releases' 256 experts (top 8) and head_dim 128, rotary over its first 64
        head_dim = overrides.get("head_dim", hidden_size // num_attention_heads)
        return {
            "head_dim": head_dim,
            "rotary_dim": head_dim // 2,  # the releases' own field for the partial rotary
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 512,
        }
    if architecture in LINEAR_ATTENTION_ARCHITECTURES:
        # the releases' 248k vocabulary, head_dim 256 and 16-32 linear heads of 128: every
        # other layer linear (from the last, a softmax one), value heads wider than key heads
        head_dim = overrides.get("head_dim", hidden_size // num_attention_heads)
        moe = {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "shared_expert_intermediate_size": 48}  # fmt: skip
        return {
            "head_dim": head_dim,
            "full_attention_interval": 2,
            **_TINY_LINEAR_HEADS,
            "linear_num_value_heads": 4,
            "max_position_embeddings": 512,
            **(moe if "Moe" in architecture or "Next" in architecture else {}),
        }
    if architecture == "LaraMiniForCausalLM":
        # the release's 8 linear key heads (16 value heads) of 128, 128 experts (top 4)
        return {
            "head_dim": hidden_size // num_attention_heads,
            **_TINY_LINEAR_HEADS,
            "linear_num_value_heads": 4,
            "num_experts": 8,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            "max_position_embeddings": 512,
        }
    if architecture == "OlmoHybridForCausalLM":
        # the release's 30 linear heads of 96 keys and 192 values, three linear layers in four
        return {
            "head_dim": hidden_size // num_attention_heads,
            **_TINY_LINEAR_HEADS,
            "linear_num_value_heads": 2,
            "max_position_embeddings": 512,
        }
    if architecture == "NemotronHForCausalLM":
        # the releases' 128 Mamba heads of 64 in 8 groups, a 128-wide state, head_dim 128
        return {
            "head_dim": hidden_size // num_attention_heads,
            "mamba_num_heads": 8,
            "mamba_head_dim": 16,
            "n_groups": 2,
            "ssm_state_size": 16,
            "max_position_embeddings": 512,
        }
    if architecture in ("GraniteMoeHybridForCausalLM", "BambaForCausalLM"):
        # the releases' 48-128 Mamba heads of 64 with a 128-256 state, 64 experts, and
        # 128k positions: 8 heads in two groups (each group's B and C shared by four)
        return {
            "mamba_n_heads": 8,
            "mamba_n_groups": 2,
            "mamba_d_state": 16,
            "mamba_d_head": 2 * hidden_size // 8,
            "mamba_d_conv": 4,
            "shared_intermediate_size": 96,
            "max_position_embeddings": 512,
        }
    if architecture == "JambaForCausalLM":
        # the releases' 16 experts and 256k positions (no rotary): 4 experts; its attention and
        # expert layer pattern is the case's
        return {"num_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 512}
    if architecture == "Mamba2ForCausalLM":
        # Codestral Mamba's 128 heads of 64 in 8 groups, a 128-wide state: 8 heads in 2 groups
        return {"num_heads": 8, "head_dim": 16, "n_groups": 2, "state_size": 16, "chunk_size": 16}
    if architecture == "FalconH1ForCausalLM":
        # the releases' 24-64 Mamba heads of 64 (mamba_d_ssm 1536-4096) with a 128-256 state,
        # muP multipliers of 0.1-10: 8 heads in two groups, multipliers away from 1
        return {
            "mamba_n_heads": 8,
            "mamba_n_groups": 2,
            "mamba_d_state": 16,
            "mamba_d_ssm": 96,
            "mamba_d_head": 12,
            "mamba_d_conv": 4,
            "mamba_chunk_size": 16,
            "max_position_embeddings": 512,
            "embedding_multiplier": 1.5,
            "lm_head_multiplier": 0.7,
            "key_multiplier": 0.8,
            "attention_in_multiplier": 1.2,
            "attention_out_multiplier": 0.9,
            "ssm_in_multiplier": 1.1,
            "ssm_out_multiplier": 0.8,
            "ssm_multipliers": [0.9, 1.1, 0.8, 1.2, 1.3],
            "mlp_multipliers": [1.2, 0.8],
        }
    if architecture in MOE_ARCHITECTURES or architecture in POST_LLAMA_ARCHITECTURES:
        # the defaults' 32k-131k positions would tabulate rotary tables far past any test
        return {"max_position_embeddings": 512}
    return {}
