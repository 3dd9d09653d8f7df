"""config.json's `architectures[0]` -> the module and class that serve it, imported on first use
(vLLM's registry shape): adding an architecture is its model file and one line here.

Torch-free, so that a process can check a checkpoint's architecture without loading models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shard.models.blocks import DecoderModel

ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("shard.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("shard.models.llama", "LlamaForCausalLM"),
    # Mistral with per-layer attention types (transformers loads a Mistral config that has
    # layer_types as Ministral; ModelConfig.layer_windows follows layer_types).
    "MinistralForCausalLM": ("shard.models.llama", "LlamaForCausalLM"),
    "Ministral3ForCausalLM": ("shard.models.llama", "Ministral3ForCausalLM"),
    # Mistral Small 3.1 and later as released (vision-language), served text only
    "Mistral3ForConditionalGeneration": ("shard.models.llama", "Mistral3ForConditionalGeneration"),
    "LlavaForConditionalGeneration": ("shard.models.llama", "LlavaForConditionalGeneration"),
    "VoxtralForConditionalGeneration": ("shard.models.llama", "VoxtralForConditionalGeneration"),
    "Qwen2ForCausalLM": ("shard.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen2VLForConditionalGeneration": ("shard.models.qwen2", "Qwen2VLForConditionalGeneration"),
    "Qwen2_5_VLForConditionalGeneration": (
        "shard.models.qwen2",
        "Qwen2_5_VLForConditionalGeneration",
    ),
    "Qwen3ForCausalLM": ("shard.models.qwen3", "Qwen3ForCausalLM"),
    "Qwen3VLForConditionalGeneration": ("shard.models.qwen3", "Qwen3VLForConditionalGeneration"),
    "GemmaForCausalLM": ("shard.models.gemma", "GemmaForCausalLM"),
    "Gemma2ForCausalLM": ("shard.models.gemma2", "Gemma2ForCausalLM"),
    "VaultGemmaForCausalLM": ("shard.models.gemma2", "VaultGemmaForCausalLM"),
    "Gemma3ForCausalLM": ("shard.models.gemma3", "Gemma3ForCausalLM"),
    # Gemma 3 4B and up as released (vision-language), served text only
    "Gemma3ForConditionalGeneration": ("shard.models.gemma3", "Gemma3ForConditionalGeneration"),
    "Gemma4ForCausalLM": ("shard.models.gemma4", "Gemma4ForCausalLM"),
    "Gemma3nForCausalLM": ("shard.models.gemma3n", "Gemma3nForCausalLM"),
    # Gemma 4's unified releases (gemma-4-12B): Gemma 4's text layers without per-layer inputs
    "Gemma4UnifiedForCausalLM": ("shard.models.gemma4", "Gemma4ForCausalLM"),
    "Gemma4UnifiedForConditionalGeneration": (
        "shard.models.gemma4",
        "Gemma4ForConditionalGeneration",
    ),
    "Gemma3nForConditionalGeneration": ("shard.models.gemma3n", "Gemma3nForConditionalGeneration"),
    # Gemma 4 as released (vision and audio towers), served text only
    "Gemma4ForConditionalGeneration": ("shard.models.gemma4", "Gemma4ForConditionalGeneration"),
    "Phi3ForCausalLM": ("shard.models.phi3", "Phi3ForCausalLM"),
    "SmolLM3ForCausalLM": ("shard.models.smollm3", "SmolLM3ForCausalLM"),
    "GraniteForCausalLM": ("shard.models.granite", "GraniteForCausalLM"),
    "Olmo2ForCausalLM": ("shard.models.olmo2", "Olmo2ForCausalLM"),
    "Olmo3ForCausalLM": ("shard.models.olmo2", "Olmo3ForCausalLM"),
    "OlmoHybridForCausalLM": ("shard.models.olmo_hybrid", "OlmoHybridForCausalLM"),
    "LaraMiniForCausalLM": ("shard.models.lara", "LaraMiniForCausalLM"),
    "MiMoV2FlashForCausalLM": ("shard.models.mimo_v2", "MiMoV2FlashForCausalLM"),
    "MistralLarge4ForConditionalGeneration": (
        "shard.models.mistral_large4",
        "MistralLarge4ForConditionalGeneration",
    ),
    "ExaoneForCausalLM": ("shard.models.exaone", "ExaoneForCausalLM"),
    "Exaone4ForCausalLM": ("shard.models.exaone4", "Exaone4ForCausalLM"),
    # Llama's layers as transformers runs them, under their own config and architecture names
    "InternLM3ForCausalLM": ("shard.models.llama", "LlamaForCausalLM"),
    "IQuestCoderForCausalLM": ("shard.models.llama", "LlamaForCausalLM"),
    # Meta's Code World Model: Llama's layers, a window in three layers of four (layer_types)
    "CwmForCausalLM": ("shard.models.llama", "LlamaForCausalLM"),
    "GlmForCausalLM": ("shard.models.glm4", "GlmForCausalLM"),
    "Glm4ForCausalLM": ("shard.models.glm4", "Glm4ForCausalLM"),
    "Glm4vForConditionalGeneration": ("shard.models.glm4", "Glm4vForConditionalGeneration"),
    "HeliumForCausalLM": ("shard.models.helium", "HeliumForCausalLM"),
    "CohereForCausalLM": ("shard.models.cohere", "CohereForCausalLM"),
    "Cohere2ForCausalLM": ("shard.models.cohere", "Cohere2ForCausalLM"),
    "Cohere2MoeForCausalLM": ("shard.models.cohere", "Cohere2MoeForCausalLM"),  # Command A+
    "SeedOssForCausalLM": ("shard.models.seed_oss", "SeedOssForCausalLM"),
    "Ernie4_5ForCausalLM": ("shard.models.ernie4_5", "Ernie4_5ForCausalLM"),
    "Ernie4_5_MoeForCausalLM": ("shard.models.ernie4_5_moe", "Ernie4_5_MoeForCausalLM"),
    "MixtralForCausalLM": ("shard.models.mixtral", "MixtralForCausalLM"),
    "PhimoeForCausalLM": ("shard.models.phimoe", "PhimoeForCausalLM"),
    "GptOssForCausalLM": ("shard.models.gpt_oss", "GptOssForCausalLM"),
    "Qwen2MoeForCausalLM": ("shard.models.qwen2_moe", "Qwen2MoeForCausalLM"),
    "Qwen3MoeForCausalLM": ("shard.models.qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen3OmniMoeForConditionalGeneration": (
        "shard.models.qwen3_omni",
        "Qwen3OmniMoeForConditionalGeneration",
    ),
    "Qwen3OmniMoeThinkerForConditionalGeneration": (
        "shard.models.qwen3_omni",
        "Qwen3OmniMoeThinkerForConditionalGeneration",
    ),
    "Qwen3VLMoeForConditionalGeneration": (
        "shard.models.qwen3_moe",
        "Qwen3VLMoeForConditionalGeneration",
    ),
    "OlmoeForCausalLM": ("shard.models.olmoe", "OlmoeForCausalLM"),
    "FlexOlmoForCausalLM": ("shard.models.flex_olmo", "FlexOlmoForCausalLM"),
    "GraniteMoeForCausalLM": ("shard.models.granite_moe", "GraniteMoeForCausalLM"),
    "GraniteMoeSharedForCausalLM": ("shard.models.granite_moe", "GraniteMoeSharedForCausalLM"),
    "GraniteSWAForCausalLM": ("shard.models.granite_swa", "GraniteSWAForCausalLM"),
    # Granite 4.0: Mamba 2 layers with a few attention ones (shard/models/mamba_mixer.py)
    "GraniteMoeHybridForCausalLM": ("shard.models.granite_hybrid", "GraniteMoeHybridForCausalLM"),
    "BambaForCausalLM": ("shard.models.bamba", "BambaForCausalLM"),
    "Lfm2ForCausalLM": ("shard.models.lfm2", "Lfm2ForCausalLM"),
    "FalconH1ForCausalLM": ("shard.models.falcon_h1", "FalconH1ForCausalLM"),
    "Mamba2ForCausalLM": ("shard.models.mamba2", "Mamba2ForCausalLM"),
    # Mamba 1 (shard/models/mamba1_mixer.py): alone, or beside attention and experts (Jamba)
    "MambaForCausalLM": ("shard.models.mamba1", "MambaForCausalLM"),
    "FalconMambaForCausalLM": ("shard.models.mamba1", "FalconMambaForCausalLM"),
    "JambaForCausalLM": ("shard.models.jamba", "JambaForCausalLM"),
    "Lfm2MoeForCausalLM": ("shard.models.lfm2", "Lfm2MoeForCausalLM"),
    "Lfm3ForCausalLM": ("shard.models.lfm2", "Lfm3ForCausalLM"),
    "NemotronHForCausalLM": ("shard.models.nemotron_h", "NemotronHForCausalLM"),
    "GraniteMoeSWAForCausalLM": ("shard.models.granite_swa", "GraniteMoeSWAForCausalLM"),
    "Glm4MoeForCausalLM": ("shard.models.glm4_moe", "Glm4MoeForCausalLM"),
    "Glm4vMoeForConditionalGeneration": (
        "shard.models.glm4_moe",
        "Glm4vMoeForConditionalGeneration",
    ),
    # GLM-4.6V's own wrapper: GLM-4's or GLM-4.5's language model inside
    "Glm46VForConditionalGeneration": ("shard.models.glm4_moe", "Glm46VForConditionalGeneration"),
    "Dots1ForCausalLM": ("shard.models.dots1", "Dots1ForCausalLM"),
    "AfmoeForCausalLM": ("shard.models.afmoe", "AfmoeForCausalLM"),
    "ArceeForCausalLM": ("shard.models.arcee", "ArceeForCausalLM"),
    "Jais2ForCausalLM": ("shard.models.jais2", "Jais2ForCausalLM"),
    "Kolibri1ForCausalLM": ("shard.models.kolibri", "Kolibri1ForCausalLM"),
    "FlintForCausalLM": ("shard.models.flint", "FlintForCausalLM"),
    "LagunaForCausalLM": ("shard.models.laguna", "LagunaForCausalLM"),
    "MellumForCausalLM": ("shard.models.mellum", "MellumForCausalLM"),
    "NanoChatForCausalLM": ("shard.models.nanochat", "NanoChatForCausalLM"),
    "ApertusForCausalLM": ("shard.models.apertus", "ApertusForCausalLM"),
    "Starcoder2ForCausalLM": ("shard.models.starcoder2", "Starcoder2ForCausalLM"),
    "PhiForCausalLM": ("shard.models.phi", "PhiForCausalLM"),
    "StableLmForCausalLM": ("shard.models.stablelm", "StableLmForCausalLM"),
    "NemotronForCausalLM": ("shard.models.nemotron", "NemotronForCausalLM"),
    "OlmoForCausalLM": ("shard.models.olmo", "OlmoForCausalLM"),
    "GPTNeoXForCausalLM": ("shard.models.gpt_neox", "GPTNeoXForCausalLM"),
    # ALiBi instead of rotary (attention's per-head linear biases)
    "BloomForCausalLM": ("shard.models.bloom", "BloomForCausalLM"),
    "MptForCausalLM": ("shard.models.mpt", "MptForCausalLM"),
    "GPTBigCodeForCausalLM": ("shard.models.gpt_bigcode", "GPTBigCodeForCausalLM"),
    "OPTForCausalLM": ("shard.models.opt", "OPTForCausalLM"),
    "GPT2LMHeadModel": ("shard.models.gpt2", "GPT2LMHeadModel"),
    "FalconForCausalLM": ("shard.models.falcon", "FalconForCausalLM"),
    "HunYuanDenseV1ForCausalLM": ("shard.models.hunyuan", "HunYuanDenseV1ForCausalLM"),
    "HunYuanMoEV1ForCausalLM": ("shard.models.hunyuan", "HunYuanMoEV1ForCausalLM"),
    "ExaoneMoeForCausalLM": ("shard.models.exaone_moe", "ExaoneMoeForCausalLM"),
    "SolarOpenForCausalLM": ("shard.models.solar_open", "SolarOpenForCausalLM"),
    # multi-head latent attention; V3 also serves DeepSeek-R1, Kimi K2 and Moonlight
    "DeepseekV2ForCausalLM": ("shard.models.deepseek", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": ("shard.models.deepseek", "DeepseekV3ForCausalLM"),
    "Glm4MoeLiteForCausalLM": ("shard.models.deepseek", "Glm4MoeLiteForCausalLM"),  # GLM-4.7-Flash
    "YoutuForCausalLM": ("shard.models.deepseek", "YoutuForCausalLM"),
    "DeepseekV32ForCausalLM": ("shard.models.deepseek", "DeepseekV32ForCausalLM"),
    "Kimi_K25ForConditionalGeneration": (
        "shard.models.deepseek",
        "Kimi_K25ForConditionalGeneration",
    ),
    "GlmMoeDsaForCausalLM": ("shard.models.deepseek", "GlmMoeDsaForCausalLM"),  # GLM-5
    # Kimi Delta Attention beside latent attention (a state per sequence in the KDA layers)
    "KimiLinearForCausalLM": ("shard.models.kimi_linear", "KimiLinearForCausalLM"),
    "BailingHybridForCausalLM": ("shard.models.bailing_hybrid", "BailingHybridForCausalLM"),
    # Gated DeltaNet linear attention in three layers of four (a state per sequence)
    "Qwen3_5ForCausalLM": ("shard.models.qwen3_5", "Qwen3_5ForCausalLM"),
    "Qwen3_5MoeForCausalLM": ("shard.models.qwen3_5", "Qwen3_5MoeForCausalLM"),
    "Qwen3_5ForConditionalGeneration": ("shard.models.qwen3_5", "Qwen3_5ForConditionalGeneration"),
    "Qwen3_5MoeForConditionalGeneration": (
        "shard.models.qwen3_5",
        "Qwen3_5MoeForConditionalGeneration",
    ),
    "Qwen3NextForCausalLM": ("shard.models.qwen3_5", "Qwen3NextForCausalLM"),
    "MiniMaxM2ForCausalLM": ("shard.models.minimax_m2", "MiniMaxM2ForCausalLM"),
    "Mistral4ForCausalLM": ("shard.models.mistral4", "Mistral4ForCausalLM"),
    "Llama4ForCausalLM": ("shard.models.llama4", "Llama4ForCausalLM"),
    # Llama 4 Scout and Maverick as released (vision-language), served text only
    "Llama4ForConditionalGeneration": ("shard.models.llama4", "Llama4ForConditionalGeneration"),
}
SUPPORTED_ARCHITECTURES = tuple(sorted(ARCHITECTURES))


def model_class(architecture: str) -> type[DecoderModel]:
    """The class serving `architecture`; KeyError for one the registry lacks."""
    module, name = ARCHITECTURES[architecture]
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
