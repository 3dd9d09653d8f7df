"""GGUF files as a model format: checks (torch-free, the launcher runs them before spawning),
the name table, a weight source that dequantizes at load, and conversion to an HF directory."""
