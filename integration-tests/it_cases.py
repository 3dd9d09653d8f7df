"""Prompts and tiny model shapes shared by the integration tests."""

# Prompts of different lengths whose prompts and generations cross 16-token KV blocks.
PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention reads keys and values through a block table, and tensor parallelism "
    "splits every layer across several devices.",
    "Ünïcödé façade naïve café — 日本語のテキスト 🚀🔥 and numbers 42 2048 65536",
]

# Mistral and Qwen2 attend through sliding windows shorter than the longer prompts (and than the
# prefill chunks), so windows start inside cached prefixes and move during decoding; Qwen2 slides
# only in its second layer (max_window_layers), as its real configs do.
TINY_MODELS = {
    "llama": dict(architecture="LlamaForCausalLM", num_key_value_heads=2),
    "mistral": dict(architecture="MistralForCausalLM", num_key_value_heads=1, sliding_window=12),
    "qwen2": dict(
        architecture="Qwen2ForCausalLM",
        num_key_value_heads=2,
        tie_word_embeddings=True,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=1,
    ),
    "qwen3": dict(architecture="Qwen3ForCausalLM", num_key_value_heads=2, head_dim=32),
}
