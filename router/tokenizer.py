"""The model's tokenizer, as the router uses it.

Encoding runs on a worker thread with its own tokenizer instance: long prompts must not stall
the event loop, and HF tokenizer objects are not meant to be shared across threads while the
scheduler decodes on the loop thread with the other instance.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from router.chat_encoding import ChatEncoding, encoding_of


@dataclass(frozen=True)
class Encoding:
    ids: list[int]
    # Character offsets (start, stop) of each token in the input text.
    offsets: list[tuple[int, int]]


def processor_chat_template(model_dir: Path) -> str | None:
    """A vision-language checkpoint's chat template where only its processor states it
    (`chat_template.json`, which AutoTokenizer does not read); vLLM falls back to it too."""
    path = model_dir / "chat_template.json"
    if not path.is_file():
        return None
    template = json.loads(path.read_text()).get("chat_template")
    if not isinstance(template, str):
        raise ValueError(f"{path} has no chat_template string")
    return template


class Tokenizer:
    def __init__(
        self,
        decoder: PreTrainedTokenizerBase,
        encoder: PreTrainedTokenizerBase,
        chat_encoding: ChatEncoding | None = None,
    ) -> None:
        """`chat_encoding`: renders conversations where the tokenizer has no chat template."""
        self.decoder = decoder
        self._encoder = encoder
        has_template = bool(getattr(encoder, "chat_template", None))
        self._chat_encoding = None if has_template else chat_encoding
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
        self._piece_cache: dict[int, str] = {}
        self._special_cache: dict[int, bool] = {}

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        decoder, encoder = (AutoTokenizer.from_pretrained(model_dir) for _ in range(2))
        template = processor_chat_template(Path(model_dir))
        if template is not None and not getattr(encoder, "chat_template", None):
            decoder.chat_template = encoder.chat_template = template
        return cls(decoder, encoder, encoding_of(Path(model_dir)))

    @classmethod
    def from_object(cls, tokenizer: PreTrainedTokenizerBase) -> Tokenizer:
        """Tests build tokenizers in memory; a deep copy gives the encoder its own instance."""
        import copy

        return cls(tokenizer, copy.deepcopy(tokenizer))

    @property
    def eos_token_id(self) -> int | None:
        return self.decoder.eos_token_id

    def _encode_sync(self, text: str, add_special_tokens: bool) -> Encoding:
        if not self._encoder.is_fast:  # slow tokenizers cannot report offsets
            ids = self._encoder.encode(text, add_special_tokens=add_special_tokens)
            return Encoding(ids=list(ids), offsets=[(0, 0)] * len(ids))
        out = self._encoder(
            text, add_special_tokens=add_special_tokens, return_offsets_mapping=True
        )
        return Encoding(
            ids=list(out["input_ids"]), offsets=[tuple(o) for o in out["offset_mapping"]]
        )

    async def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._encode_sync, text, add_special_tokens)

    @property
    def has_chat_template(self) -> bool:
        """Whether conversations can be rendered: a Jinja template or a Python encoding."""
        template = getattr(self._encoder, "chat_template", None)
        return self._chat_encoding is not None or bool(template)

    def chat_template_reads(self, name: str, tools: list[dict[str, Any]] | None) -> bool:
        """Whether the chat template chosen for a conversation (with or without tools: a
        tokenizer may have a `tool_use` template of its own) mentions `name` at all (`tools`,
        `tool_calls`): a template that does not would drop it without a word. (The Python
        encodings render both.)"""
        if self._chat_encoding is not None:
            return True
        source = self._encoder.get_chat_template(None, tools)
        return name in source

    def _render_chat(
        self,
        messages: list[dict[str, Any]],
        variables: dict[str, Any],
        tools: list[dict[str, Any]] | None,
    ) -> str:
        if self._chat_encoding is not None:
            return self._chat_encoding(messages, variables, tools)
        return self._encoder.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, **variables
        )

    async def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        variables: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt for a conversation, rendered by the tokenizer's own (Jinja) chat template
        (or the model's Python encoding, router/chat_encoding);
        `variables` are extra template variables (e.g. Qwen3's `enable_thinking`), `tools` the
        functions offered (OpenAI's shape, as transformers' templates take them).

        Raises what the template raises (jinja2.TemplateError, e.g. on a role order it refuses).
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, self._render_chat, messages, dict(variables or {}), tools
        )

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        # No space clean-up: it would make incremental decoding disagree with the full decode.
        return self.decoder.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def piece(self, token_id: int) -> str:
        """One token's own text (prefill and top-n tokens); cached, vocabularies are finite."""
        text = self._piece_cache.get(token_id)
        if text is None:
            text = self.decode([token_id])
            self._piece_cache[token_id] = text
        return text

    def is_special(self, token_id: int) -> bool:
        """Whether decoding with skip_special_tokens leaves the token out. The final text skips
        exactly these, so the stream must too (and TGI's `special` flag names them): asked of
        the decoder itself, since its skip set and `all_special_ids` can differ."""
        special = self._special_cache.get(token_id)
        if special is None:
            special = bool(self.piece(token_id)) and not self.decode([token_id], True)
            self._special_cache[token_id] = special
        return special

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
