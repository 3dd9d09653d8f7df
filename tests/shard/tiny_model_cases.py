"""The tiny model shapes the shard tests run on: name -> (architecture, config overrides)."""

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small enough that the tiny head_dim has frequencies in all three llama3 bands.
    "original_max_position_embeddings": 64,
}

YARN_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    # Short, so that the tiny head_dim has both kept and interpolated frequencies.
    "original_max_position_embeddings": 16,
}

GRANITE_MULTIPLIERS = {
    "embedding_multiplier": 4.0,
    "attention_multiplier": 0.1,
    "residual_multiplier": 0.5,
    "logits_scaling": 2.0,
}
# Hunyuan's "dynamic" rope with a fixed alpha (the checkpoints' form)
HUNYUAN_ROPE = {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 50.0, "factor": 1.0}
MINISTRAL3 = {
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rope_parameters": {**YARN_ROPE, "llama_4_scaling_beta": 0.5, "mscale": 1.0,
                        "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0},
}  # fmt: skip

# name -> (architecture, config overrides)
TINY_MODELS: dict[str, tuple[str, dict]] = {
    "llama_gqa_llama3": (
        "LlamaForCausalLM",
        {"num_key_value_heads": 2, "rope_parameters": LLAMA3_ROPE},
    ),
    "llama_tied_linear_bias": (
        "LlamaForCausalLM",
        {
            "num_key_value_heads": 4,
            "tie_word_embeddings": True,
            "head_dim": 32,  # != hidden_size / heads, so head_dim must come from the config
            "attention_bias": True,
            "mlp_bias": True,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
    ),
    "mistral_mqa": ("MistralForCausalLM", {"num_key_value_heads": 1}),
    "qwen2_bias": ("Qwen2ForCausalLM", {"num_key_value_heads": 2}),
    "qwen2_yarn": ("Qwen2ForCausalLM", {"num_key_value_heads": 2, "rope_parameters": YARN_ROPE}),
    # Windows far shorter than the test prompts (21 and 37 tokens) and the 16-token blocks.
    "mistral_sliding_window": (
        "MistralForCausalLM",
        {"num_key_value_heads": 2, "sliding_window": 7},
    ),
    # Ministral: the window in the layers layer_types names, here the first but not the second.
    "ministral_alternating": (
        "MinistralForCausalLM",
        {
            "num_key_value_heads": 2,
            "head_dim": 16,  # transformers' Ministral needs it given (real configs all do)
            "sliding_window": 7,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    # Qwen2 slides only from layer max_window_layers on: layer 0 full, layer 1 windowed.
    "qwen2_sliding_layers": (
        "Qwen2ForCausalLM",
        {
            "num_key_value_heads": 2,
            "use_sliding_window": True,
            "sliding_window": 11,
            "max_window_layers": 1,
        },
    ),
    # Per-head q/k norms; head_dim 32 != hidden / heads; windows in the second layer only.
    "qwen3_qk_norm_sliding": (
        "Qwen3ForCausalLM",
        {
            "num_key_value_heads": 2,
            "head_dim": 32,
            "tie_word_embeddings": True,
            "use_sliding_window": True,
            "sliding_window": 9,
            "max_window_layers": 1,
        },
    ),
    "llama_odd_vocab": ("LlamaForCausalLM", {"vocab_size": 509, "num_key_value_heads": 2}),
}

# Gemma 3's per-layer-type rotary as the 4B and larger ship it: local layers plain at theta 10k,
# global layers at theta 1M with linear scaling 8.
GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
}

# Phi-3.5 style longrope over the rotary part of the head (16 * 0.75 = 12 dims, 6 frequencies):
# distinct factors per frequency, so that swapping short for long, or indexing them wrongly, shows.
PHI3_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10_000.0,
    "partial_rotary_factor": 0.75,
    "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5],
    "long_factor": [2.0, 3.0, 4.0, 5.0, 6.5, 8.0],
}

# Architectures beyond the Llama family, kept apart from TINY_MODELS (whose tests run only the
# Llama family): name -> (architecture, config overrides). Norm weights are random around their
# identity (launcher.tiny_models), so Gemma's 1 + w is tested; 3 layers cover both layer types.
NEW_ARCH_MODELS: dict[str, tuple[str, dict]] = {
    # Gemma 2: sliding / full / sliding (transformers' default alternation), scores scaled by
    # query_pre_attn_scalar ** -0.5 rather than head_dim ** -0.5, tied embeddings. The softcaps
    # are far below Gemma 2's 50 / 30, which at these scales (scaled scores within about +-0.7,
    # logits within about +-3) would change nothing. With 1.0 and 3.0, on the shard tests'
    # prompts, dropping the attention cap alone moves the logits by about 0.012 (one greedy
    # token flips) and dropping the final cap alone by about 0.45: both far above the 1e-4 the
    # shard tests compare to (tests/launcher/test_tiny_models_new_archs.py checks it).
    "gemma2_softcap_alternating": (
        "Gemma2ForCausalLM",
        {
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": 7,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "attn_logit_softcapping": 1.0,
            "final_logit_softcapping": 3.0,
            "tie_word_embeddings": True,
        },
    ),
    # Gemma 3 (text): per-head q/k norms (1 + w), four norms a layer, a rotary table per layer
    # type, one KV head as in Gemma 3 1B; no softcapping (Gemma 3 has none).
    "gemma3_qk_norm_local_rope": (
        "Gemma3ForCausalLM",
        {
            "num_hidden_layers": 3,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "query_pre_attn_scalar": 32,
            "sliding_window": 7,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": GEMMA3_ROPE,
            "tie_word_embeddings": True,
        },
    ),
    # Phi-3.5 mini style: fused qkv_proj / gate_up_proj, MHA, longrope over 3/4 of the head. The
    # test prompts (21 and 37 tokens) fall on both sides of the 32-token pretraining length.
    "phi3_partial_longrope": (
        "Phi3ForCausalLM",
        {
            "num_key_value_heads": 4,
            "rope_parameters": PHI3_LONGROPE,
            "original_max_position_embeddings": 32,
            "max_position_embeddings": 256,
        },
    ),
    # Phi-4-mini style: GQA, 3/4 of the head rotated, plain rotary, tied embeddings.
    "phi3_gqa": (
        "Phi3ForCausalLM",
        {
            "num_key_value_heads": 2,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10_000.0,
                "partial_rotary_factor": 0.75,
            },
            "tie_word_embeddings": True,
        },
    ),
    # SmolLM3: the second layer without position encoding (no_rope_layers 0), tied embeddings.
    "smollm3_nope": ("SmolLM3ForCausalLM", {"no_rope_layers": [1, 0]}),
    # Granite 3: its four multipliers, each far enough from 1 to show (the query scale 0.1
    # rather than head_dim ** -0.5 = 0.25); logits divided by 2 stay decisive at these scales.
    "granite_multipliers": (
        "GraniteForCausalLM",
        {
            "embedding_multiplier": 4.0,
            "attention_multiplier": 0.1,
            "residual_multiplier": 0.5,
            "logits_scaling": 2.0,
        },
    ),
    # OLMo 2: norms after attention and the MLP only, q/k normed over the whole projection
    # (two KV heads: each rank of two holds one).
    "olmo2_projection_qk_norm": ("Olmo2ForCausalLM", {}),
    # OLMo 3: a sliding and a full layer with their own rope bases, one KV head (replicated on
    # both ranks of two, so the k norm's mean must count it once).
    "olmo3_sliding_one_kv_head": (
        "Olmo3ForCausalLM",
        {
            "num_key_value_heads": 1,
            "sliding_window": 7,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 500.0},
            },
        },
    ),
    # EXAONE 4: per-head q/k norms, post norms only; the sliding layer rotates, the full one
    # has no position encoding.
    "exaone4_sliding_nope": (
        "Exaone4ForCausalLM",
        {"sliding_window": 7, "layer_types": ["sliding_attention", "full_attention"]},
    ),
    # GLM-4 dense: the rotary over the first half of each head (its default factor 0.5) in
    # interleaved pairs, four norms a layer under GLM's names, q/k/v biases, a fused gate_up.
    "glm4_interleaved_partial": ("Glm4ForCausalLM", {"head_dim": 16, "num_key_value_heads": 2}),
    # Seed-OSS: q/k/v biases (its default) and an o_proj bias of its own switch
    "seed_oss_out_bias": (
        "SeedOssForCausalLM",
        {"head_dim": 16, "num_key_value_heads": 2, "attention_out_bias": True},
    ),
    # ERNIE 4.5: a bias on every projection (q/k/v/o and the MLP's), interleaved pairs rotated
    # over the whole head, tied embeddings (its default)
    "ernie4_5_biased_interleaved": ("Ernie4_5ForCausalLM", {"head_dim": 16, "use_bias": True}),
    # Ministral 3: YaRN from 16 positions, and past them the queries scaled by position
    # (llama_4_scaling_beta; 0.5 here, 0.1 released, so the factor is visible at 21-42 tokens)
    "ministral3_position_scaled": ("Ministral3ForCausalLM", MINISTRAL3),
    # Hunyuan dense: per-head q/k norms after the rotary, the rope base stretched by alpha
    "hunyuan_norm_after_rope": (
        "HunYuanDenseV1ForCausalLM",
        {"head_dim": 16, "rope_parameters": HUNYUAN_ROPE},
    ),
    # Youtu-LLM: DeepSeek-V3's latent attention (a query bottleneck, interleaved rotary) in
    # Llama's layers with dense MLPs, tied embeddings (its default)
    "youtu_mla_dense": ("YoutuForCausalLM", {}),
    # Granite with windows: Granite's multipliers, sink logits, the sliding layer rotating and
    # the full one without position encoding (its layer_rope_theta 0)
    "granite_swa_sinks_nope": (
        "GraniteSWAForCausalLM",
        {
            **GRANITE_MULTIPLIERS,
            "sliding_window": 7,
            "layer_types": ["sliding_attention", "full_attention"],
            "layer_rope_theta": [10000.0, 0],
        },
    ),  # fmt: skip
    # Command R: one LayerNorm a layer, attention and MLP in parallel, interleaved rotary, tied
    # embeddings, the logits scaled (its default 0.0625)
    "cohere_parallel_layernorm": ("CohereForCausalLM", {"num_key_value_heads": 2}),
    # Command R7B / A: Cohere's layers, the sliding one rotating and the full one without
    # position encoding
    "cohere2_sliding_nope": (
        "Cohere2ForCausalLM",
        {"sliding_window": 7, "layer_types": ["sliding_attention", "full_attention"]},
    ),
}

# Gemma 3 4B and up and Mistral Small 3.1 and later as released: vision-language checkpoints
# (Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration), served as their LMs. Gemma
# 3's LM is gemma3_qk_norm_local_rope's; the files are the Hub's (`language_model.model...`) or
# transformers 5's module names (`model.language_model...`).
# Qwen3.5: Gated DeltaNet linear attention in every other layer (value heads twice the key
# heads, of other dims), softmax layers with q/k norms, a query-computed output gate and a
# quarter of each head rotated; 1 + w norms
NEW_ARCH_MODELS["qwen3_5_linear_attention"] = ("Qwen3_5ForCausalLM", {"num_hidden_layers": 4})
# OLMo-Hybrid: pre-norm Gated DeltaNet layers (q, k, v projected apart, write strengths up to
# 2) around OLMo 2's post-norm softmax layers
NEW_ARCH_MODELS["olmo_hybrid_delta_post_norm"] = (
    "OlmoHybridForCausalLM",
    {"num_hidden_layers": 4, "layer_types": ["linear_attention", "full_attention",
                                             "linear_attention", "linear_attention"]},
)  # fmt: skip
# Granite 4.0-H dense (h-micro): Mamba 2 layers (8 heads in 2 groups, a conv bias) and a
# softmax layer without position encoding; the shared MLP every layer's; Granite's multipliers
NEW_ARCH_MODELS["granite4_hybrid_dense_nope"] = (
    "GraniteMoeHybridForCausalLM",
    {**GRANITE_MULTIPLIERS, "num_hidden_layers": 4, "num_local_experts": 0,
     "layer_types": ["linear_attention", "linear_attention", "full_attention",
                     "linear_attention"]},
)  # fmt: skip
# LFM2: gated short convolutions (3 taps) around one attention layer of per-head q/k norms;
# the MLP's width derived from intermediate_size as transformers derives it
NEW_ARCH_MODELS["lfm2_short_conv_hybrid"] = (
    "Lfm2ForCausalLM",
    {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
     "block_multiple_of": 16, "block_ffn_dim_multiplier": 1.5, "max_position_embeddings": 256},
)  # fmt: skip
# Falcon-H1: a Mamba 2 mixer and attention side by side in every layer, muP multipliers away
# from 1 everywhere (the tiny builder's), the mixer's output gated alone (mamba_rms_norm off,
# the releases'); then with the gated norm, normed before the gate and after it
NEW_ARCH_MODELS["falcon_h1_parallel_hybrid"] = (
    "FalconH1ForCausalLM",
    {"num_hidden_layers": 2, "head_dim": 16},
)
NEW_ARCH_MODELS["falcon_h1_norm_before_gate"] = (
    "FalconH1ForCausalLM",
    {"num_hidden_layers": 2, "head_dim": 16, "mamba_rms_norm": True,
     "mamba_norm_before_gate": True},
)  # fmt: skip
NEW_ARCH_MODELS["falcon_h1_gate_before_norm"] = (
    "FalconH1ForCausalLM",
    {"num_hidden_layers": 2, "head_dim": 16, "mamba_rms_norm": True,
     "mamba_norm_before_gate": False, "num_key_value_heads": 1},
)  # fmt: skip
# Pure Mamba 2 (Codestral Mamba): a Mamba 2 block in every layer, no attention or MLP, the
# stream between them in float32
NEW_ARCH_MODELS["mamba2_pure"] = ("Mamba2ForCausalLM", {"num_hidden_layers": 3})
# Pure Mamba 1 (state-spaces' mamba-*-hf): a Mamba 1 block in every layer, the stream between
# them in float32; in_proj and out_proj biased (the releases' are not: the bias path is tested)
NEW_ARCH_MODELS["mamba1_biased"] = ("MambaForCausalLM", {"use_bias": True})
# Falcon Mamba 7B: Mamba 1 with weightless RMS norms on each mixer's time step, B and C, an
# untied LM head as released
NEW_ARCH_MODELS["falcon_mamba_bcdt_norms"] = (
    "FalconMambaForCausalLM",
    {"tie_word_embeddings": False, "mixer_rms_eps": 1e-5},
)
# LFM3: short convolutions (7 taps) around a sliding layer (a 7-token window, its own rope) and
# a full one (proportional rope over half of each head), each head's output gated, sandwich
# norms after the mixers and the MLPs
NEW_ARCH_MODELS["lfm3_gated_sliding_sandwich"] = (
    "Lfm3ForCausalLM",
    {"num_hidden_layers": 4, "head_dim": 16,
     "layer_types": ["conv", "sliding_attention", "conv", "full_attention"],
     "sliding_window": 7, "max_position_embeddings": 256,
     "rope_parameters": {
         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
         "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                            "partial_rotary_factor": 0.5}}},
)  # fmt: skip
# Bamba: Mamba 2 layers around one attention layer of half-rotated heads, SwiGLU after each
NEW_ARCH_MODELS["bamba_hybrid_partial_rotary"] = (
    "BambaForCausalLM",
    {"num_hidden_layers": 3, "attn_layer_indices": [1], "head_dim": 16},
)
# Nemotron-H: one module a layer (Mamba 2, a ReLU^2 MLP, attention without position encoding),
# two Mamba layers in a row as Nemotron Nano 2's pattern has
NEW_ARCH_MODELS["nemotron_h_one_module_layers"] = (
    "NemotronHForCausalLM",
    {"layers_block_type": ["linear_attention", "mlp", "linear_attention",
     "linear_attention", "full_attention", "mlp"]},
)  # fmt: skip
# The first Gemma: GeGLU (gelu-tanh), 1 + w norms, scaled embeddings, one KV head, tied
NEW_ARCH_MODELS["gemma_geglu_one_kv_head"] = (
    "GemmaForCausalLM",
    {"head_dim": 16, "num_key_value_heads": 1, "tie_word_embeddings": True},
)
# VaultGemma: Gemma 2's layer types and soft-caps (gemma2_softcap_alternating's), two norms a
# layer, the MLP's under `pre_feedforward_layernorm`
NEW_ARCH_MODELS["vaultgemma_two_norms_softcap"] = (
    "VaultGemmaForCausalLM",
    {**NEW_ARCH_MODELS["gemma2_softcap_alternating"][1]},
)
# GLM-4-9B-chat as transformers ports it: GLM-4's attention and fused gate_up, two norms a layer
NEW_ARCH_MODELS["glm_interleaved_partial_two_norms"] = (
    "GlmForCausalLM",
    {"head_dim": 16, "num_key_value_heads": 2},
)
# Helium: RMSNorms scaled in float32 before the rounding, q/k/v biases without an o_proj one
NEW_ARCH_MODELS["helium_fp32_norms_qkv_bias"] = (
    "HeliumForCausalLM",
    {"head_dim": 16, "num_key_value_heads": 2, "attention_bias": True},
)
# LayerNorms with a bias (random, as their weights), biases on every projection:
# StarCoder2: the ungated c_fc -> gelu-tanh -> c_proj MLP, a window in every layer, tied
NEW_ARCH_MODELS["starcoder2_biased_sliding"] = ("Starcoder2ForCausalLM", {"sliding_window": 7})
# Phi-2: one LayerNorm a layer, attention and the gelu_new MLP summed in parallel, half of each
# head rotated, an LM head with a bias; MHA as released
NEW_ARCH_MODELS["phi_parallel_head_bias"] = ("PhiForCausalLM", {"num_key_value_heads": 4})
# Phi with its optional q/k LayerNorms (one over head_dim for all heads) and a tied head whose
# bias is its own
NEW_ARCH_MODELS["phi_qk_layernorm_tied"] = (
    "PhiForCausalLM",
    {"qk_layernorm": True, "tie_word_embeddings": True},
)
# StableLM 2: q/k/v biases, a quarter of each head rotated, SwiGLU, two norms a layer
NEW_ARCH_MODELS["stablelm2_qkv_bias"] = ("StableLmForCausalLM", {"use_qkv_bias": True})
# StableLM 2 12B: the parallel residual (one norm a layer, attention's output added first, as
# Cohere's) and q/k LayerNorms whose weights are each head's own
NEW_ARCH_MODELS["stablelm2_parallel_qk_layernorm"] = (
    "StableLmForCausalLM",
    {"use_parallel_residual": True, "qk_layernorm": True},
)
# Nemotron: LayerNorm1P (1 + w, a bias), the ungated relu^2 MLP, half of each head rotated
NEW_ARCH_MODELS["nemotron_layernorm1p_relu2"] = ("NemotronForCausalLM", {})
# OLMo: LayerNorms without weight or bias, q/k/v clamped to +-0.3 (about their spread here)
NEW_ARCH_MODELS["olmo_weightless_norms_clip"] = ("OlmoForCausalLM", {"clip_qkv": 0.3})
# Pythia: q/k/v fused by head, a quarter of each head rotated, the parallel residual with two
# norms of the same input, the biased gelu MLP, the `embed_out` head; MHA (GPT-NeoX has no GQA)
NEW_ARCH_MODELS["gpt_neox_parallel_two_norms"] = (
    "GPTNeoXForCausalLM",
    {"num_key_value_heads": 4},
)
# GPT-NeoX without the parallel residual: Llama's order, post_attention_layernorm before the MLP
NEW_ARCH_MODELS["gpt_neox_sequential"] = (
    "GPTNeoXForCausalLM",
    {"num_key_value_heads": 4, "use_parallel_residual": False},
)
# BLOOM: ALiBi, no rotary; 6 heads (not a power of two: the last two take BLOOM's in-between
# slopes 0.5 and 0.125, the largest), 3 a rank; the embeddings' LayerNorm, q/k/v fused by head,
# biases everywhere, the tanh-gelu MLP, the tied head
NEW_ARCH_MODELS["bloom_alibi_six_heads"] = (
    "BloomForCausalLM",
    {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 6},
)
# MPT: ALiBi over 6 heads (MPT's slopes 2^(-8i/8) for i = 2, 4, 6, 8 then 1, 3: the power of
# two above, odd-indexed first), q/k/v clamped to +-0.5 (about their spread), softmax_scale 0.2
# for head_dim 16's
# 0.25, bias-free linears and LayerNorms, the gelu MLP, the tied head
NEW_ARCH_MODELS["mpt_alibi_clip_scale"] = (
    "MptForCausalLM",
    {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 6, "max_seq_len": 256,
     "attn_config": {"clip_qkv": 0.5, "softmax_scale": 0.2}},
)  # fmt: skip
# StarCoder (GPTBigCode): one KV head for every query head (multi_query, q/k/v fused as q rows
# then k's then v's), learned absolute positions added to the tokens', GPT-2's biased LayerNorms
# and gelu-tanh MLP, the head tied to wte
NEW_ARCH_MODELS["gpt_bigcode_multi_query"] = (
    "GPTBigCodeForCausalLM",
    {"n_inner": 96, "activation_function": "gelu_pytorch_tanh", "n_positions": 128},
)
# ... without multi_query: every head its own k and v, fused by head as GPT-NeoX's
NEW_ARCH_MODELS["gpt_bigcode_per_head_qkv"] = (
    "GPTBigCodeForCausalLM",
    {**NEW_ARCH_MODELS["gpt_bigcode_multi_query"][1], "multi_query": False},
)
# Falcon-40B/180B's new decoder architecture: q/k/v fused by KV group (2 query heads, then the
# group's k and v, in each of 2 groups), attention and the MLP in parallel after their own norms
# (ln_attn, ln_mlp), the gelu MLP, the head tied
NEW_ARCH_MODELS["falcon_grouped_two_norms"] = (
    "FalconForCausalLM",
    {"new_decoder_architecture": True, "num_kv_heads": 2, "ffn_hidden_size": 96,
     "max_position_embeddings": 256},
)  # fmt: skip
# Falcon-7B: multi-query (every q row, then the one KV head's k and v), attention and the MLP in
# parallel on one shared norm
NEW_ARCH_MODELS["falcon_multi_query_one_norm"] = (
    "FalconForCausalLM",
    {"new_decoder_architecture": False, "multi_query": True, "parallel_attn": True,
     "ffn_hidden_size": 96, "max_position_embeddings": 256},
)  # fmt: skip
# Llama's layers under other names, as transformers runs them: EXAONE 3.0/3.5's Hub files
# (transformer.h.{i}.attn.attention..., the MLP's c_fc_0/c_fc_1/c_proj); InternLM3's and
# IQuest-Coder's own architecture names (InternLM3's q/k/v/o and MLP biases)
NEW_ARCH_MODELS["exaone3_gpt2_style_names"] = (
    "ExaoneForCausalLM",
    {"max_position_embeddings": 256},
)
NEW_ARCH_MODELS["internlm3_biased"] = (
    "InternLM3ForCausalLM",
    {"attention_bias": True, "mlp_bias": True, "head_dim": 16, "max_position_embeddings": 256},
)
NEW_ARCH_MODELS["iquestcoder_llama_layers"] = (
    "IQuestCoderForCausalLM",
    {"head_dim": 16, "max_position_embeddings": 256},
)
# Gemma 3n: AltUp over 4 streams, Laurel, the per-layer inputs (a table of 480 rows: the test
# prompts' ids past it read row 0), activation sparsity (0.95) in the first two layers' MLPs,
# per-layer MLP widths, and the last two layers (sliding, full) reading the first two's KV
NEW_ARCH_MODELS["gemma3n_altup_laurel_sparse"] = (
    "Gemma3nForCausalLM",
    {"num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 16,
     "layer_types": ["sliding_attention", "full_attention"] * 2, "num_kv_shared_layers": 2,
     "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0],
     "intermediate_size": [128, 128, 96, 96], "vocab_size_per_layer_input": 480,
     "max_position_embeddings": 256},
)  # fmt: skip
# OPT (vLLM's quickstart opt-125m's layers): GPT-2's pre-norm layer with q/k/v/o and the ReLU
# MLP biased, learned positions two rows into their table, the head tied; and the original
# checkpoints' names without `model.`
NEW_ARCH_MODELS["opt_learned_positions"] = (
    "OPTForCausalLM",
    {"ffn_dim": 96, "max_position_embeddings": 128, "word_embed_proj_dim": 64},
)
# GPT-2: StarCoder's layer with every head its own keys and values, [q | k | v] in c_attn,
# gelu_new, its linears stored as Conv1D ([in, out])
NEW_ARCH_MODELS["gpt2_conv1d"] = (
    "GPT2LMHeadModel",
    {"n_inner": 96, "activation_function": "gelu_new", "n_positions": 128},
)
# Jais 2: Arcee's ungated relu^2 MLP under LayerNorms with biases, biases on q/k/v/o and the MLP
NEW_ARCH_MODELS["jais2_layernorm_relu2"] = (
    "Jais2ForCausalLM",
    {"head_dim": 16, "max_position_embeddings": 256},
)
# nanochat: weightless RMSNorms everywhere (the embeddings normed too), q/k normed after a
# rotary that turns the other way, fc1 -> relu^2 -> fc2, the final logits capped
NEW_ARCH_MODELS["nanochat_reverse_rope"] = (
    "NanoChatForCausalLM",
    {"num_key_value_heads": 4, "final_logit_softcapping": 3.0, "max_position_embeddings": 256},
)
# Meta's CWM: Llama's layers, its window (7 here, 8192 released) in the layers layer_types
# names sliding (every layer but each fourth's first by default: here the second of two)
NEW_ARCH_MODELS["cwm_sliding_layers"] = (
    "CwmForCausalLM",
    {"head_dim": 16, "sliding_window": 7, "max_position_embeddings": 256},
)
# Apertus: Qwen3's per-head q/k norms under Llama's attention, the norms' own names, an ungated
# MLP through each layer's xIELU (its random alpha_p and alpha_n), llama3 rope scaling
NEW_ARCH_MODELS["apertus_xielu_qk_norm"] = (
    "ApertusForCausalLM",
    {"head_dim": 16, "max_position_embeddings": 256},
)

VISION_LANGUAGE_MODELS: dict[str, tuple[str, dict]] = {
    # Qwen3.5 as released (transformers 5's names: model.language_model., model.visual.)
    "qwen3_5_vision_language": (
        "Qwen3_5ForConditionalGeneration",
        {"num_hidden_layers": 4, "module_names": True},
    ),
    "gemma3_vision_language": (
        "Gemma3ForConditionalGeneration",
        NEW_ARCH_MODELS["gemma3_qk_norm_local_rope"][1],
    ),
    "gemma3_vision_language_module_names": (
        "Gemma3ForConditionalGeneration",
        {**NEW_ARCH_MODELS["gemma3_qk_norm_local_rope"][1], "module_names": True},
    ),
    # Ministral 3 as released: Pixtral's tower before a Ministral 3 (queries scaled by position)
    "ministral3_vision_language": (
        "Mistral3ForConditionalGeneration",
        {**MINISTRAL3, "text_config": "Ministral3Config"},
    ),
    # Mistral Small 3.1 style: Pixtral's tower before a Mistral (GQA, untied lm_head, no window).
    "mistral3_vision_language": (
        "Mistral3ForConditionalGeneration",
        {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": None},
    ),
}

# Mixture-of-Experts architectures: name -> (architecture, config overrides). Experts are few
# and small, the top-k high enough that most steps leave some experts without tokens and load
# others unevenly.
MOE_MODELS: dict[str, tuple[str, dict]] = {
    # Mixtral: every layer sparse, top-2 of 6 renormalised, GQA.
    "mixtral_top2": (
        "MixtralForCausalLM",
        {"num_local_experts": 6, "num_experts_per_tok": 2, "intermediate_size": 48},
    ),
    # Qwen2-MoE: q/k/v biases, top-3 of 8 without renormalisation, a shared expert behind its
    # sigmoid gate; the middle layer dense (mlp_only_layers) with the 128-wide MLP.
    "qwen2_moe_shared_dense": (
        "Qwen2MoeForCausalLM",
        {
            "num_hidden_layers": 3,
            "num_experts": 8,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            "mlp_only_layers": [1],
            "norm_topk_prob": False,
        },
    ),
    # Qwen3-MoE: q/k norms, head_dim 32 != hidden / heads, top-4 of 8 renormalised.
    "qwen3_moe_norm_topk": (
        "Qwen3MoeForCausalLM",
        {
            "num_experts": 8,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "head_dim": 32,
        },
    ),
    # OLMoE: q/k normed over the whole projection (Llama's rounding), top-3 of 8 without
    # renormalisation, each expert intermediate_size wide, in every layer
    "olmoe_projection_norms": (
        "OlmoeForCausalLM",
        {"num_experts": 8, "num_experts_per_tok": 3, "intermediate_size": 32},
    ),
    # Granite 3 MoE: Granite's multipliers, top-2 of 6 by logit, softmax over the two, weights
    # rounded to the dtype
    "granite_moe_multipliers": (
        "GraniteMoeForCausalLM",
        {
            "num_local_experts": 6,
            "num_experts_per_tok": 2,
            "intermediate_size": 48,
            "embedding_multiplier": 4.0,
            "attention_multiplier": 0.1,
            "residual_multiplier": 0.5,
            "logits_scaling": 2.0,
        },
    ),  # fmt: skip
    # GLM-4.5: sigmoid scores chosen with a correction bias within the best 2 of 4 groups of 2
    # experts, top-3, renormalised and scaled by 2.5; one shared expert ungated; the first layer
    # dense; q/k norms, q/k/v biases without an o_proj bias, rotary over half of each head.
    "glm4_moe_grouped": (
        "Glm4MoeForCausalLM",
        {
            "num_hidden_layers": 3,
            "n_routed_experts": 8,
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 3,
            "n_shared_experts": 1,
            "moe_intermediate_size": 32,
            "first_k_dense_replace": 1,
            "routed_scaling_factor": 2.5,
            "use_qk_norm": True,
            "attention_bias": True,
        },
    ),
}
# gpt-oss: attention sinks (random logits around 0.5), q/k/v/o biases, sliding (7 tokens) and
# full layers alternating, YaRN (tiny_models' defaults: from 64 positions, factor 8, not
# truncated); a biased router over 6 experts, top-2; biased experts whose clamped SwiGLU binds
# (a limit of 0.3, where gate and up values here spread about +-0.4: Qwen's SwiGLU would differ);
# expert intermediate size 96: three MXFP4 blocks of 32, which two shards split mid-block.
# Qwen3.5-MoE: Qwen3.5's layers over top-2 of 6 experts (always renormalised) and a shared
# expert behind a sigmoid gate, stacked as transformers 5 saves them
MOE_MODELS["qwen3_5_moe_linear_attention"] = (
    "Qwen3_5MoeForCausalLM",
    {"num_hidden_layers": 4, "stacked_experts": True},
)
# Mistral Large 4 as released (its Pixtral tower beside, Mistral's own tensor names): one
# q_proj, every query scaled per head by position, the last layer without position encoding,
# LeRoPE's learned frequencies, an indexer over its own normed input past 12 tokens, Mistral
# 4's router after a dense first layer, the final logits capped
MOE_MODELS["mistral_large4_sparse_nope"] = (
    "MistralLarge4ForConditionalGeneration",
    {"num_hidden_layers": 4},
)
# MiMo-V2-Flash: values narrower than keys (16 under 24) and scaled, the sliding layers with
# twice the KV heads and sinks, a third of each head rotated at a rope base per layer type; a
# dense first layer, then DeepSeek-V3's router (scaled 1.5) over experts without a shared one
MOE_MODELS["mimo_v2_flash_narrow_values"] = (
    "MiMoV2FlashForCausalLM",
    {"num_hidden_layers": 3, "num_key_value_heads": 1, "head_dim": 24, "v_head_dim": 16,
     "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
     "routed_scaling_factor": 1.5, "sliding_window": 7,
     "layer_types": ["full_attention", "sliding_attention", "sliding_attention"]},
)  # fmt: skip
# The same in transformers' own names (stacked experts, `sinks`), two KV heads (four in the
# sliding layers), the router choosing within the best of two groups
MOE_MODELS["mimo_v2_flash_stacked_grouped"] = (
    "MiMoV2FlashForCausalLM",
    {"num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 24, "v_head_dim": 16,
     "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
     "n_group": 2, "topk_group": 1, "sliding_window": 7, "stacked_experts": True,
     "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
     "mlp_layer_types": ["sparse", "dense", "sparse"]},
)  # fmt: skip
# Lara Mini: its period of five (linear, sliding, linear, full without positions, sliding), the
# linear layers' projections in one in_proj, experts by a float32 softmax beside a shared one
MOE_MODELS["lara_mini_single_in_proj"] = (
    "LaraMiniForCausalLM",
    {"num_hidden_layers": 5, "sliding_window": 7},
)
# Qwen3-Next: the same layers with linear attention's projections fused by key head
# (in_proj_qkvz, in_proj_ba); experts in every other layer, the Hub's per-expert tensors
MOE_MODELS["qwen3_next_fused_projections"] = (
    "Qwen3NextForCausalLM",
    {"num_hidden_layers": 4, "decoder_sparse_step": 2},
)
# Kimi Linear: Kimi Delta Attention (4 heads of 16, a decay per key channel, low-rank forget
# and output gates, q/k/v convs) around a NoPE latent attention layer; DeepSeek-V3's router
# over 8 experts in 2 groups beside a shared expert, the first layer dense
MOE_MODELS["kimi_linear_kda_nope_mla"] = (
    "KimiLinearForCausalLM",
    {"num_hidden_layers": 3,
     "layer_types": ["linear_attention", "full_attention", "linear_attention"]},
)  # fmt: skip
# Ling/Ring hybrid: KDA with full-rank gates, the forget gate bounded (kda_safe_gate) and its
# convs in float32, around latent attention with interleaved rotary, queries through a
# 48-wide bottleneck and a sigmoid gate a head; experts after a dense first layer
MOE_MODELS["bailing_hybrid_kda_gated_mla"] = (
    "BailingHybridForCausalLM",
    {"num_hidden_layers": 3, "q_lora_rank": 48,
     "layer_types": ["linear_attention", "full_attention", "linear_attention"]},
)  # fmt: skip
MOE_MODELS["gpt_oss_sinks_clamped"] = (
    "GptOssForCausalLM",
    {"intermediate_size": 96, "sliding_window": 7, "swiglu_limit": 0.3},
)
# The same as released: the experts in MXFP4 (random codes and scales, which transformers
# dequantizes as the reference).
MOE_MODELS["gpt_oss_mxfp4"] = (
    "GptOssForCausalLM",
    {**MOE_MODELS["gpt_oss_sinks_clamped"][1], "mxfp4_experts": True},
)
# DeepSeek's multi-head latent attention (a 32-wide latent and 8 rotary dims shared by the 4
# heads of 16 + 8 query/key dims and 16 value dims), the rotary dims interleaved as released.
# V3: queries through a 48-wide bottleneck; YaRN from 16 positions with DeepSeek's mscale (the
# query scale grows too); GLM-4.5's grouped sigmoid router, top-3 of the best 2 of 4 groups,
# scaled by 2.5; one shared expert; the first layer dense.
MOE_MODELS["deepseek_v3_mla"] = (
    "DeepseekV3ForCausalLM",
    {
        "num_hidden_layers": 3,
        "num_experts_per_tok": 3,
        "routed_scaling_factor": 2.5,
        "rope_parameters": {**YARN_ROPE, "mscale": 1.0, "mscale_all_dim": 1.0},
    },
)
# V2 (V2-Lite's shape: one q_proj, no bottleneck): softmax routing, top-2 of the best of 4
# groups by their best probability (both its experts: the greedy top-2 often differ), scaled by
# 2.0 and not renormalised; latent projections with biases (attention_bias).
MOE_MODELS["deepseek_v2_grouped"] = (
    "DeepseekV2ForCausalLM",
    {
        "num_hidden_layers": 3,
        "topk_method": "group_limited_greedy",
        "topk_group": 1,
        "routed_scaling_factor": 2.0,
        "attention_bias": True,
    },
)
# GLM-4.7-Flash: V3's layers, its dense ones listed (here the last, not the first), the plain
# rope, one expert group (top-2 of 8, renormalised, scaled by 1.8).
MOE_MODELS["glm4_moe_lite_mla"] = (
    "Glm4MoeLiteForCausalLM",
    {
        "num_hidden_layers": 3,
        "mlp_layer_types": ["sparse", "sparse", "dense"],
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.8,
    },
)
# DeepSeek-V3.2: V3's case with DeepSeek Sparse Attention, each token attending over the 12
# earlier tokens its layer's indexer (8 heads of 32, the first 8 dims rotated in halves) scores
# best: the test prompts (21 and 37 tokens) run past it from their thirteenth token on
MOE_MODELS["deepseek_v32_sparse_attention"] = (
    "DeepseekV32ForCausalLM",
    {**MOE_MODELS["deepseek_v3_mla"][1], "index_topk": 12},
)
# GLM-5: V3.2's layers with the indexer's rotary in interleaved pairs, the middle layer reusing
# the first's choice (indexer_types), one expert group
MOE_MODELS["glm_moe_dsa_shared_choice"] = (
    "GlmMoeDsaForCausalLM",
    {
        "num_hidden_layers": 3,
        "indexer_types": ["full", "shared", "full"],
        "n_group": 1,
        "topk_group": 1,
        "index_topk": 10,
    },
)
# ERNIE 4.5 MoE: softmax top-3 of 8 chosen with a correction bias, renormalised, one shared
# expert; only the middle layer sparse (moe_layer_interval 2); interleaved rotary.
MOE_MODELS["ernie4_5_moe_biased_choice"] = (
    "Ernie4_5_MoeForCausalLM",
    {
        "num_hidden_layers": 3,
        "head_dim": 16,
        "moe_num_experts": 8,
        "moe_k": 3,
        "moe_intermediate_size": 32,
        "moe_num_shared_experts": 1,
        "moe_layer_interval": 2,
    },
)
# MiniMax-M2: q/k normed over the whole projection, rotary over half of each head (the release's
# `rotary_dim`), sigmoid routing chosen with a correction bias, renormalised, in every layer.
MOE_MODELS["minimax_m2_projection_norms"] = (
    "MiniMaxM2ForCausalLM",
    {"num_hidden_layers": 3, "num_local_experts": 8, "num_experts_per_tok": 3},
)
# The same Qwen3-MoE saved as transformers 5 holds it (stacked experts, `save_original_format`
# off): the layout the loader must read besides the Hub's.
MOE_MODELS["qwen3_moe_stacked"] = (
    "Qwen3MoeForCausalLM",
    {**MOE_MODELS["qwen3_moe_norm_topk"][1], "stacked_experts": True},
)


# GGUF files of the families beyond Llama/Qwen2/Qwen3 (tests/gguf_writer.py): name -> (GGUF
# architecture, the tiny HF model it is written from), within what llama.cpp's reading of the
# file can express: Gemma's query scale is head_dim ** -0.5 (llama.cpp's rule below 27B), Gemma
# 3's local layers rotate at base 10000 and one layer in six is global (7 layers: the sixth).
# Soft-caps, windows (7 tokens, shorter than the prompts), Gemma 3's linear scaling of its
# global layers and Phi-3's longrope over 3/4 of the head (the prompts of 21 and 37 tokens fall
# on both sides of its 32-token boundary) all differ from the classes' defaults.
GGUF_MODELS: dict[str, tuple[str, str, dict]] = {
    "gemma2": ("gemma2", "Gemma2ForCausalLM", dict(
        num_hidden_layers=3, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=7, attn_logit_softcapping=1.0, final_logit_softcapping=3.0,
        tie_word_embeddings=True,
    )),
    "gemma3": ("gemma3", "Gemma3ForCausalLM", dict(
        num_hidden_layers=7, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=7, rope_parameters=GEMMA3_ROPE, tie_word_embeddings=True,
    )),
    "phi3": ("phi3", "Phi3ForCausalLM", dict(
        num_key_value_heads=4, rope_parameters=PHI3_LONGROPE,
        original_max_position_embeddings=32, max_position_embeddings=256,
    )),
    # llama.cpp's MoE files have experts in every layer and renormalise the top-k weights for
    # Qwen3-MoE, not for Qwen2-MoE (whose shared expert and its gate are written too).
    "qwen2moe": (
        "qwen2moe", "Qwen2MoeForCausalLM",
        {**MOE_MODELS["qwen2_moe_shared_dense"][1], "mlp_only_layers": []},
    ),
    "qwen3moe": ("qwen3moe", *MOE_MODELS["qwen3_moe_norm_topk"]),
    # Mixtral: a llama file with experts, its Q/K rows interleaved as every llama file's.
    "mixtral": ("llama", *MOE_MODELS["mixtral_top2"]),
}  # fmt: skip
# Mistral 4: DeepSeek-V3's latent attention and layers, a softmax router keeping 2 of 4 groups by
# their two best probabilities, top-2 renormalised and scaled by 1.5; YaRN from 16 positions and
# the queries scaled by position past them (beta 0.5).
MOE_MODELS["mistral4_grouped_position_scaled"] = (
    "Mistral4ForCausalLM",
    {
        "num_hidden_layers": 3,
        "routed_scaling_factor": 1.5,
        "rope_parameters": MINISTRAL3["rope_parameters"],
    },
)
# dots.llm1: Qwen3's per-head q/k norms over GLM-4.5's routing (sigmoid scores with a correction
# bias, the best 2 of 4 groups, top-3 not renormalised, scaled by 2.0), one shared expert, the
# first layer dense; the last layer sliding (layer_types from max_window_layers).
MOE_MODELS["dots1_grouped_sliding"] = (
    "Dots1ForCausalLM",
    {
        "num_hidden_layers": 3,
        "n_routed_experts": 8,
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 3,
        "n_shared_experts": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.0,
        "norm_topk_prob": False,
        "sliding_window": 7,
        "max_window_layers": 2,
    },
)
# Solar Open: Llama's attention (head_dim 16 != hidden / heads) over GLM-4.5's routing in every
# layer: the best 2 of 4 groups, top-3 renormalised (its default), scaled by 1.5, one shared
# expert.
MOE_MODELS["solar_open_grouped"] = (
    "SolarOpenForCausalLM",
    {
        "head_dim": 16,
        "n_routed_experts": 8,
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 3,
        "n_shared_experts": 1,
        "moe_intermediate_size": 32,
        "routed_scaling_factor": 1.5,
    },
)
# Granite MoE with windows: top-2 of 6 by logit, a shared expert (its gate and up fused), sink
# logits, a window in the first layer, a rope base per layer (500 and 10000)
MOE_MODELS["granite_moe_swa_shared"] = (
    "GraniteMoeSWAForCausalLM",
    {
        **GRANITE_MULTIPLIERS,
        "num_local_experts": 6,
        "num_experts_per_tok": 2,
        "intermediate_size": 48,
        "shared_intermediate_size": 32,
        "sliding_window": 7,
        "layer_types": ["sliding_attention", "full_attention"],
        "layer_rope_theta": [500.0, 10000.0],
    },
)
# K-EXAONE: EXAONE 4's per-head q/k norms, the sliding layer rotating and the full one NoPE, in
# pre-norm layers; the first MLP dense, the others routed as DeepSeek-V3 (2 of 4 groups, top-3
# renormalised, scaled by 2.5), one shared expert.
MOE_MODELS["exaone_moe_grouped_nope"] = (
    "ExaoneMoeForCausalLM",
    {
        "num_hidden_layers": 3,
        "num_experts": 8,
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 3,
        "num_shared_experts": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "sliding_window": 7,
        "sliding_window_pattern": 2,
    },
)
# FlexOlmo: OLMo 2's post norms and whole-projection q/k norms (float32) over OLMoE's experts,
# top-3 of 7 not renormalised (its defaults' shape)
MOE_MODELS["flex_olmo_post_norms"] = (
    "FlexOlmoForCausalLM",
    {"num_experts": 7, "num_experts_per_tok": 3, "intermediate_size": 32},
)
# AFMoE (Arcee Trinity): four float32 norms a layer, per-head q/k norms, attention's output gated,
# the sliding layer rotating and the full one NoPE, embeddings scaled (mup_enabled); the first
# MLP dense, then sigmoid scores chosen with an expert bias, top-3 of 8 renormalised, times 1.5,
# one shared expert.
MOE_MODELS["afmoe_gated_nope"] = (
    "AfmoeForCausalLM",
    {
        "num_hidden_layers": 3,
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 3,
        "num_shared_experts": 1,
        "moe_intermediate_size": 32,
        "num_dense_layers": 1,
        "route_scale": 1.5,
        "mup_enabled": True,
        "sliding_window": 7,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    },
)
# Granite MoE with a shared expert (its gate and up fused), Granite's multipliers
MOE_MODELS["granite_moe_shared"] = (
    "GraniteMoeSharedForCausalLM",
    {**GRANITE_MULTIPLIERS, "num_local_experts": 6, "num_experts_per_tok": 2,
     "intermediate_size": 48, "shared_intermediate_size": 32},
)  # fmt: skip
# Granite 4.0-H MoE (h-tiny, h-small): Mamba 2 layers (one group of heads, as released) around
# one softmax layer, rotary on (the field's other value), experts beside the shared MLP,
# Granite's multipliers
MOE_MODELS["granite4_hybrid_moe"] = (
    "GraniteMoeHybridForCausalLM",
    {**GRANITE_MULTIPLIERS, "num_hidden_layers": 3, "position_embedding_type": "rope",
     "layer_types": ["linear_attention", "full_attention", "linear_attention"],
     "mamba_n_groups": 1, "num_local_experts": 6,
     "num_experts_per_tok": 2, "intermediate_size": 48, "shared_intermediate_size": 32},
)  # fmt: skip
# Nemotron 3 Nano: Mamba 2, attention without position encoding, a dense ReLU^2 MLP and
# Mixture-of-Experts blocks of ungated ReLU^2 experts (top-3 of 8 from the best of 2 groups by
# DeepSeek-V3's sigmoid choice with a correction bias, renormalised, scaled by 2.0) beside an
# ungated shared expert; the Hub's layout (backbone., a tensor per expert)
NEMOTRON3_MOE = {
    "layers_block_type": ["linear_attention", "moe", "full_attention", "moe", "mlp"],
    "n_routed_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 48, "n_group": 2, "topk_group": 1,
    "routed_scaling_factor": 2.0,
}  # fmt: skip
MOE_MODELS["nemotron3_ungated_experts"] = ("NemotronHForCausalLM", NEMOTRON3_MOE)
# Nemotron 3 Super: the experts in a 24-wide latent space (the token projected in, their sum
# projected out), saved as transformers holds it (model., the experts stacked)
MOE_MODELS["nemotron3_latent_stacked"] = (
    "NemotronHForCausalLM",
    {**NEMOTRON3_MOE, "moe_latent_size": 24, "stacked_experts": True},
)
# Jamba: Mamba 1 mixers (weighted RMS norms on dt, B and C) with attention without position
# encoding in every 4th layer from the 3rd, experts (top-2 of 4, not renormalised) in every 2nd
# MLP from the 2nd: Mamba + dense, Mamba + experts, attention + dense, Mamba + experts
MOE_MODELS["jamba_mamba1_attention_experts"] = (
    "JambaForCausalLM",
    {"num_hidden_layers": 4, "attn_layer_period": 4, "attn_layer_offset": 2,
     "expert_layer_period": 2, "expert_layer_offset": 1},
)  # fmt: skip
# ... its experts stacked, as transformers 5 holds them
MOE_MODELS["jamba_stacked"] = (
    "JambaForCausalLM",
    {**MOE_MODELS["jamba_mamba1_attention_experts"][1], "stacked_experts": True},
)
# Hunyuan MoE: Hunyuan's attention, a float32 router, top-2 of 6 renormalised, a shared MLP
MOE_MODELS["hunyuan_moe_shared"] = (
    "HunYuanMoEV1ForCausalLM",
    {"head_dim": 16, "rope_parameters": HUNYUAN_ROPE, "num_experts": 6, "moe_topk": 2,
     "intermediate_size": 48},
)  # fmt: skip

# Gemma 4 (text). The small models' shape (E2B/E4B): per-layer embeddings of 8 a layer, the
# last two layers reading the keys and values of the last earlier layer of their kind (layers 3
# and 2) with MLPs twice as wide; global layers of 32-dim heads rotated by proportional rope
# (4 of their 16 frequencies turn); final logits soft-capped.
GEMMA4_LAYERS = ["sliding_attention", "sliding_attention", "full_attention"] * 2
NEW_ARCH_MODELS["gemma4_per_layer_inputs_kv_sharing"] = (
    "Gemma4ForCausalLM",
    {
        "num_hidden_layers": 6,
        "layer_types": GEMMA4_LAYERS,
        "hidden_size_per_layer_input": 8,
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "final_logit_softcapping": 3.0,
    },
)
# The larger dense model's shape (31B): the global layers' values are their keys' projection,
# with one KV head where the sliding layers have two.
NEW_ARCH_MODELS["gemma4_keys_as_values"] = (
    "Gemma4ForCausalLM",
    {
        "num_hidden_layers": 3,
        "layer_types": GEMMA4_LAYERS[:3],
        "attention_k_eq_v": True,
        "num_global_key_value_heads": 1,
    },
)
# Gemma 4's unified text model (gemma-4-12B): Gemma 4's layers without per-layer inputs, values
# from keys in the global layers, KV sharing in the last two, the final logits capped
NEW_ARCH_MODELS["gemma4_unified_text"] = (
    "Gemma4UnifiedForCausalLM",
    {
        "num_hidden_layers": 6,
        "layer_types": GEMMA4_LAYERS,
        "num_kv_shared_layers": 2,
        "attention_k_eq_v": True,
        "final_logit_softcapping": 3.0,
    },
)
VISION_LANGUAGE_MODELS["gemma4_unified_wrapper"] = (
    "Gemma4UnifiedForConditionalGeneration",
    {**NEW_ARCH_MODELS["gemma4_unified_text"][1], "module_names": True, "pad_token_id": 0},
)
# Gemma 4 as released: the vision and audio towers around the E2B-shaped LM, transformers 5's
# names (model.language_model., model.vision_tower., model.audio_tower.)
VISION_LANGUAGE_MODELS["gemma4_vision_language"] = (
    "Gemma4ForConditionalGeneration",
    # (Gemma's pad token: transformers' text-only forward of the wrapper reads it)
    {
        **NEW_ARCH_MODELS["gemma4_per_layer_inputs_kv_sharing"][1],
        "module_names": True,
        "pad_token_id": 0,
    },  # fmt: skip
)
# The MoE model's shape (26B-A4B): top-2 of 6 experts beside every layer's dense MLP, routed
# from the un-normed stream with a scale per expert; values from keys in the global layers
MOE_MODELS["gemma4_experts_beside_dense"] = (
    "Gemma4ForCausalLM",
    {
        "num_hidden_layers": 3,
        "layer_types": GEMMA4_LAYERS[:3],
        "attention_k_eq_v": True,
        "num_global_key_value_heads": 1,
        "enable_moe_block": True,
        "num_experts": 6,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
    },
)

# Llama 4 (text): the Maverick shape, dense and MoE layers alternating (interleave 2): layer 0
# rotates (interleaved pairs), attends in chunks of 8 positions and L2-norms q and k; layer 1
# has no rotary, attends to everything and scales its queries by position (from position 3 on);
# one of 4 experts a token, weighted on its input, beside the shared expert.
MOE_MODELS["llama4_chunked_nope_top1"] = (
    "Llama4ForCausalLM",
    {"interleave_moe_layer_step": 2, "num_experts_per_tok": 1},
)
# The Scout shape: every layer sparse, three with rotary and chunks, one without (interval 4),
# llama3 rope scaling; top-2 (released models take 1; transformers computes any top-k)
MOE_MODELS["llama4_scout_top2"] = (
    "Llama4ForCausalLM",
    {
        "num_hidden_layers": 4,
        "no_rope_layer_interval": 4,
        "num_experts_per_tok": 2,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },  # fmt: skip
)
# Llama 4 as released: the vision model and projector around the Maverick-shaped LM
VISION_LANGUAGE_MODELS["llama4_vision_language"] = (
    "Llama4ForConditionalGeneration",
    MOE_MODELS["llama4_chunked_nope_top1"][1],
)
# Arcee's AFM: an ungated MLP, relu(up)^2 then down, and YaRN rope
NEW_ARCH_MODELS["arcee_relu2_ungated_yarn"] = (
    "ArceeForCausalLM",
    {"head_dim": 16, "num_key_value_heads": 2, "rope_parameters": YARN_ROPE},
)
# Pixtral-12B and Apriel as transformers ports them: a Mistral (GQA, a window off) behind
# Pixtral's tower in a LLaVA wrapper, the Hub's layout (language_model.model...)
VISION_LANGUAGE_MODELS["llava_mistral_text_only"] = (
    "LlavaForConditionalGeneration",
    {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": None},
)
# Voxtral: a Llama (GQA, a head_dim of its own) behind a Whisper-style audio encoder, served
# text only (the encoder and projector skipped)
VISION_LANGUAGE_MODELS["voxtral_text_only"] = (
    "VoxtralForConditionalGeneration",
    {"num_key_value_heads": 2, "head_dim": 16},
)
# Kimi K2.5 and K2.6: DeepSeek-V3's case behind a vision tower and projector, in transformers
# 5's module names (its save_pretrained renames the language model's layers to `blocks` on the
# way back to the Hub's layout, which the releases do not have; their `language_model.model.`
# is the Hub layout every wrapper reads)
VISION_LANGUAGE_MODELS["kimi_k25_text_only"] = (
    "Kimi_K25ForConditionalGeneration",
    {**MOE_MODELS["deepseek_v3_mla"][1], "module_names": True},
)
# Qwen2.5-VL and Qwen2-VL served text only: Qwen2's layers under the Hub's plain names beside
# `visual.` (and transformers 5's module names), the multimodal rope's sections (of the tiny
# head's 8 frequencies) all turning by the text position
_MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
VISION_LANGUAGE_MODELS["qwen2_5_vl_text_only"] = (
    "Qwen2_5_VLForConditionalGeneration",
    {"rope_parameters": _MROPE, "max_position_embeddings": 256},
)
VISION_LANGUAGE_MODELS["qwen2_vl_module_names"] = (
    "Qwen2VLForConditionalGeneration",
    {"rope_parameters": _MROPE, "max_position_embeddings": 256, "module_names": True},
)
# Qwen3-VL (dense) text only: Qwen3's layers, its interleaved multimodal rope and deepstack
# features idle without images
VISION_LANGUAGE_MODELS["qwen3_vl_text_only"] = (
    "Qwen3VLForConditionalGeneration",
    {"max_position_embeddings": 256},
)
# Qwen3-VL-MoE text only: Qwen3-MoE's layers nested under model.language_model., the experts
# stacked (transformers 5's [E, 2I, H] here; tests/shard/test_moe_layer.py rewrites them as the
# Hub's files hold them, input dimension first)
VISION_LANGUAGE_MODELS["qwen3_vl_moe_text_only"] = (
    "Qwen3VLMoeForConditionalGeneration",
    {**MOE_MODELS["qwen3_moe_norm_topk"][1], "max_position_embeddings": 256},
)
# GLM-4.1V and GLM-4.5V served text only: GLM-4's and GLM-4.5's layers under transformers 5's
# names beside `model.visual.`, the multimodal rope's sections (of the tiny rotary's 4
# frequencies) all turning by the text position; GLM-4.1V's rotary in interleaved pairs over
# half of each head (its config's partial_rotary_factor), GLM-4.5V's in halves (half of each
# head by default)
_GLM4V_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
VISION_LANGUAGE_MODELS["glm4v_text_only"] = (
    "Glm4vForConditionalGeneration",
    {"rope_parameters": {**_GLM4V_ROPE, "partial_rotary_factor": 0.5},
     "max_position_embeddings": 256},
)  # fmt: skip
VISION_LANGUAGE_MODELS["glm4v_moe_text_only"] = (
    "Glm4vMoeForConditionalGeneration",
    {
        **{k: v for k, v in MOE_MODELS["glm4_moe_grouped"][1].items() if k != "use_qk_norm"},
        "rope_parameters": _GLM4V_ROPE,
        "max_position_embeddings": 256,
    },
)
# GLM-4.6V's own wrapper around GLM-4.5V's language model
VISION_LANGUAGE_MODELS["glm46v_moe_text_only"] = (
    "Glm46VForConditionalGeneration",
    VISION_LANGUAGE_MODELS["glm4v_moe_text_only"][1],
)
# Phi-3.5-MoE: the sparsemixer's top-2 of 6 (a jitter wide enough to mask some experts out of
# each softmax), LayerNorms, q/k/v/o and head biases, longrope (short factors at every length,
# as transformers) scaled by the mscale, prompts past the original 32 positions
_PHIMOE_HALF = 8  # head_dim 16
MOE_MODELS["phimoe_sparsemixer_longrope"] = (
    "PhimoeForCausalLM",
    {
        "num_local_experts": 6, "num_experts_per_tok": 2, "intermediate_size": 48,
        "head_dim": 16, "attention_bias": True, "lm_head_bias": True,
        "router_jitter_noise": 0.3, "max_position_embeddings": 256,
        "rope_parameters": {
            "rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0 + i / 16 for i in range(_PHIMOE_HALF)],
            "long_factor": [2.0 + i / 4 for i in range(_PHIMOE_HALF)],
            "short_mscale": 1.2, "long_mscale": 1.2, "original_max_position_embeddings": 32,
        },
    },
)  # fmt: skip
# Kolibri: EXAONE 4's attention (a 7-token window in the sliding layers, NoPE in the full one)
# in GLM-4's four-norm layer, top-3 of 8 experts by logit plus correction bias, weighted by
# sigmoid and renormalised, a shared expert added ungated
MOE_MODELS["kolibri_logit_bias_router"] = (
    "Kolibri1ForCausalLM",
    {"num_hidden_layers": 3, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 3,
     "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "sliding_window": 7,
     "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
     "max_position_embeddings": 256},
)  # fmt: skip
# Command A+: Command A's parallel layers (RMSNorms), the first dense (96 wide, full attention
# that rotates: prefix_dense_sliding_window_pattern 1), then top-2 of 6 experts by softmax over
# their logits with a shared expert averaged in; windows of 7 in the sliding layers
MOE_MODELS["cohere2_moe_shared_average"] = (
    "Cohere2MoeForCausalLM",
    {"num_hidden_layers": 4, "head_dim": 16, "num_experts": 6, "num_experts_per_tok": 2,
     "num_shared_experts": 1, "shared_expert_combination_strategy": "average",
     "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
     "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
     "prefix_dense_intermediate_size": 96, "rms_norm_eps": 1e-5, "sliding_window": 7,
     "logit_scale": 0.5, "max_position_embeddings": 256},
)  # fmt: skip
# ... sigmoid selection renormalised, the shared expert summed, Cohere's LayerNorms
MOE_MODELS["cohere2_moe_sigmoid_sum"] = (
    "Cohere2MoeForCausalLM",
    {**MOE_MODELS["cohere2_moe_shared_average"][1], "expert_selection_fn": "sigmoid",
     "shared_expert_combination_strategy": "sum", "rms_norm_eps": None},
)  # fmt: skip
# Flint: Qwen3-MoE's attention with sinks, 7-token windows in the sliding layers (which alone
# rotate), the first layer dense, then top-3 of 8 by sigmoid renormalised beside a shared expert
MOE_MODELS["flint_sinks_sigmoid"] = (
    "FlintForCausalLM",
    {"num_hidden_layers": 3, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 3,
     "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "mlp_only_layers": [0],
     "sliding_window": 7,
     "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
     "max_position_embeddings": 256},
)  # fmt: skip
# LFM2-MoE: LFM2's layers, the first MLP dense (intermediate_size wide), then experts: top-3 of
# 8 by sigmoid score plus a per-expert bias, renormalised, scaled by 1.5
MOE_MODELS["lfm2_moe_expert_bias"] = (
    "Lfm2MoeForCausalLM",
    {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
     "num_dense_layers": 1, "num_experts": 8, "num_experts_per_tok": 3,
     "moe_intermediate_size": 32, "routed_scaling_factor": 1.5, "max_position_embeddings": 256},
)  # fmt: skip
MOE_MODELS["lfm2_moe_stacked"] = (
    "Lfm2MoeForCausalLM",
    {**MOE_MODELS["lfm2_moe_expert_bias"][1], "stacked_experts": True},
)
# ... in transformers 5's own names (GLM-4's norms, the bias under mlp.gate), experts stacked
MOE_MODELS["kolibri_stacked"] = (
    "Kolibri1ForCausalLM",
    {**MOE_MODELS["kolibri_logit_bias_router"][1], "stacked_experts": True},
)
# Laguna: each layer its own query heads (4, 8, 2, 6 over 2 KV heads), a softplus gate a head on
# attention's output, windows of 7 in the sliding layers (full rope) and rope over half of each
# head in the full ones; the first MLP dense, then top-3 of 8 by sigmoid of soft-capped logits
# plus a correction bias, renormalised, times 1.5, beside a shared expert
MOE_MODELS["laguna_head_counts_softcapped"] = (
    "LagunaForCausalLM",
    {"num_hidden_layers": 4, "head_dim": 16, "num_attention_heads_per_layer": [4, 8, 2, 6],
     "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
     "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "sliding_window": 7,
     "num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
     "shared_expert_intermediate_size": 48, "moe_routed_scaling_factor": 1.5,
     "moe_router_logit_softcapping": 2.0, "max_position_embeddings": 256},
)  # fmt: skip
# ... a softplus gate for every dim of each head, the middle MLP dense, transformers 5's own
# names (stacked experts, shared_experts, the bias under the router)
MOE_MODELS["laguna_per_element_stacked"] = (
    "LagunaForCausalLM",
    {"num_hidden_layers": 3, "head_dim": 16, "num_attention_heads_per_layer": [6, 2, 4],
     "gating": "per-element",
     "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
     "mlp_layer_types": ["sparse", "dense", "sparse"], "sliding_window": 7, "num_experts": 8,
     "num_experts_per_tok": 3, "moe_intermediate_size": 32,
     "shared_expert_intermediate_size": 48, "max_position_embeddings": 256,
     "stacked_experts": True},
)  # fmt: skip
# Mellum 2: Qwen3-MoE's attention with windows of 7 in the sliding layers, each layer type its
# own rope base; the first MLP dense, then top-3 of 8 experts by softmax, renormalised
MOE_MODELS["mellum_sliding_dense_first"] = (
    "MellumForCausalLM",
    {"num_hidden_layers": 3, "head_dim": 16,
     "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
     "mlp_layer_types": ["dense", "sparse", "sparse"], "sliding_window": 7, "num_experts": 8,
     "num_experts_per_tok": 3, "moe_intermediate_size": 32, "norm_topk_prob": True,
     "max_position_embeddings": 256,
     "rope_parameters": {
         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
         "full_attention": {"rope_type": "default", "rope_theta": 500000.0}}},
)  # fmt: skip
