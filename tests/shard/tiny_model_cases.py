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
