"""Tool calling on /v1/chat/completions: the request's `tools`, the parsers that find calls in
the model's text (`--tool-call-parser`), and the grammars that enforce `tool_choice`."""
