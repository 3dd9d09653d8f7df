"""Reasoning on /v1/chat/completions (`--reasoning-parser`): the model's think block goes to
`reasoning_content`, the answer to `content`; grammars apply once reasoning ends."""
