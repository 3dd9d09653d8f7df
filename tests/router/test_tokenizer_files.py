"""The router's tokenizer read from a checkpoint directory: a vision-language checkpoint whose
chat template only its processor states (chat_template.json) still chats with it."""

import asyncio
import json

import pytest

from launcher.tiny_models import CHAT_TEMPLATE, build_tokenizer
from router.tokenizer import Tokenizer

MESSAGES = [{"role": "user", "content": "Hi"}]


def _save(tmp_path, template: str | None):
    tokenizer = build_tokenizer(300)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_the_processors_template_is_used_when_the_tokenizer_has_none(tmp_path):
    model_dir = _save(tmp_path, None)
    assert not Tokenizer.from_dir(model_dir).has_chat_template
    (model_dir / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    tokenizer = Tokenizer.from_dir(model_dir)
    prompt = asyncio.run(tokenizer.apply_chat_template(MESSAGES))
    assert prompt == "<|user|>\nHi<|end|>\n<|assistant|>\n"


def test_the_tokenizers_own_template_wins(tmp_path):
    model_dir = _save(tmp_path, "{{ 'own:' + messages[0]['content'] }}")
    (model_dir / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    prompt = asyncio.run(Tokenizer.from_dir(model_dir).apply_chat_template(MESSAGES))
    assert prompt == "own:Hi"


def test_a_processor_file_without_a_template_is_refused_naming_it(tmp_path):
    model_dir = _save(tmp_path, None)
    (model_dir / "chat_template.json").write_text(json.dumps({"template": CHAT_TEMPLATE}))
    with pytest.raises(ValueError, match="chat_template.json has no chat_template"):
        Tokenizer.from_dir(model_dir)
