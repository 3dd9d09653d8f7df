"""Incremental detokenization on a byte-level BPE tokenizer: never half a UTF-8 character."""

import random

import pytest

from router.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from router.tokenizer import Tokenizer

TEXTS = [
    "日本語のテキストと中文文本以及한국어 텍스트",
    "Emoji: 🚀🔥✨🙂 and symbols ∑ ∫ √ ∞ ≠ ≤ ≥ π",
    "Ünïcödé façade naïve café résumé — “quotes” and ‘apostrophes’ …",
    "mixed: The quick 🦊 jumps over 怠惰な犬 🐶🐕‍🦺 (ZWJ) and 👩‍👩‍👧‍👦 family",
]


@pytest.fixture(scope="module")
def tok(tokenizer) -> Tokenizer:
    return Tokenizer.from_object(tokenizer)


def _run(tok: Tokenizer, prompt: list[int], generated: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt)
    chunks = [detok.push(i) for i in generated]
    chunks.append(detok.flush())
    return chunks


@pytest.mark.parametrize("text", TEXTS)
def test_chunks_are_whole_characters_and_concatenate_to_the_full_decode(tok, text):
    ids = tok.decoder.encode(text, add_special_tokens=False)
    # The test only means something if single tokens do hold partial characters.
    assert any(REPLACEMENT_CHAR in tok.decode([i]) for i in ids)
    chunks = _run(tok, [], ids)
    assert all(REPLACEMENT_CHAR not in c for c in chunks), chunks
    assert "".join(chunks) == tok.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS)
def test_with_a_prompt_only_the_generated_text_comes_out(tok, text):
    prompt_text = "Prompt: 日本"
    prompt = tok.decoder.encode(prompt_text, add_special_tokens=False)
    generated = tok.decoder.encode(text, add_special_tokens=False)
    chunks = _run(tok, prompt, generated)
    assert all(REPLACEMENT_CHAR not in c for c in chunks)
    assert "".join(chunks) == text


def test_long_generation_trims_its_window(tok):
    text = " ".join(TEXTS) * 8
    ids = tok.decoder.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    out = "".join(detok.push(i) for i in ids) + detok.flush()
    assert out == text
    assert len(detok._ids) < 200  # bounded, not the whole history


def test_random_byte_sequences_still_concatenate_to_the_full_decode(tok):
    rng = random.Random(0)
    normal = [i for i in range(len(tok.decoder)) if not tok.is_special(i)]
    for _ in range(50):
        ids = [rng.choice(normal) for _ in range(rng.randint(1, 30))]
        assert "".join(_run(tok, [], ids)) == tok.decode(ids)


def test_special_tokens_emit_nothing_and_split_characters_still_join(tok):
    """As in the final text (decoded at once, special tokens skipped): a special token between
    the bytes of one character neither breaks it nor shows, streamed or not."""
    eos = tok.eos_token_id
    assert tok.is_special(eos) and not tok.is_special(tok.decoder.encode("Hi")[0])
    char = next(
        ids
        for ids in (tok.decoder.encode(c, add_special_tokens=False) for c in "日本語🚀🔥")
        if len(ids) > 1
    )
    ids = tok.decoder.encode("Hi", add_special_tokens=False) + char[:1] + [eos] + char[1:]
    chunks = _run(tok, [], ids)
    assert chunks[2] == "" and all(REPLACEMENT_CHAR not in c for c in chunks), chunks
    assert "".join(chunks) == tok.decode(ids, skip_special_tokens=True)
    assert REPLACEMENT_CHAR not in tok.decode(ids, skip_special_tokens=True)


def test_random_sequences_with_special_tokens_concatenate_to_the_final_decode(tok):
    rng = random.Random(1)
    vocab = range(len(tok.decoder))
    specials = [i for i in vocab if tok.is_special(i)]
    assert specials
    for _ in range(50):
        ids = [rng.choice(specials) if rng.random() < 0.2 else rng.choice(vocab)
               for _ in range(rng.randint(1, 30))]  # fmt: skip
        assert "".join(_run(tok, [], ids)) == tok.decode(ids, skip_special_tokens=True)
