"""Reasoning on /v1/chat/completions (`--reasoning-parser`): the model's think block (gpt-oss's
analysis channel) goes to `reasoning_content`, the answer to `content`; grammars apply once a
think block ends (under harmony, from the answer's first token)."""
