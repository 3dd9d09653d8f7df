"""Chat encodings written in Python, for checkpoints that ship an encoder instead of a Jinja
chat template (DeepSeek-V3.2). router/tokenizer.py renders with the model's Jinja template where
it has one, with the encoding of its `model_type` where it has none."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from router.chat_encoding import deepseek_v32

# messages, template variables, tools -> the prompt (ValueError: a conversation refused).
ChatEncoding = Callable[[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]] | None], str]

ENCODINGS: dict[str, ChatEncoding] = {"deepseek_v32": deepseek_v32.render}


def encoding_of(model_dir: Path) -> ChatEncoding | None:
    """The encoding for the checkpoint's `model_type`, if it has one."""
    path = model_dir / "config.json"
    if not path.is_file():
        return None
    model_type = json.loads(path.read_text()).get("model_type")
    return ENCODINGS.get(model_type) if isinstance(model_type, str) else None
