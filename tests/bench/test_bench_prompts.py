"""Benchmark prompts have exactly the asked token count under the model's own tokenizer."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from bench.serve_prompts import PromptFactory

# Partial UTF-8 pieces and punctuation-glued words: the factory must steer around both.
CORPUS = [
    "the quick brown fox jumps over the lazy dog, again and again!",
    "café naïve résumé — “quotes” 日本語のテキスト 🚀🔥",
    "tokens/s and ms/token: 42 100 2048",
] * 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # tokenizers alone (no transformers import): a byte-level BPE like the benchmark model's.
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    path = tmp_path_factory.mktemp("bench-tokenizer")
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.mark.parametrize("length", [1, 7, 64, 300])
def test_prompts_have_exact_token_counts(model_dir, length):
    factory = PromptFactory(model_dir, seed=3)
    reference = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in factory.many(length, 5):
        assert len(reference.encode(text).ids) == length


def test_pieces_round_trip(model_dir):
    factory = PromptFactory(model_dir)
    for i in factory.pieces:
        assert factory.tokenizer.encode(factory.tokenizer.decode([i])).ids == [i]


def test_prompts_are_deterministic_and_distinct(model_dir):
    a, b = PromptFactory(model_dir, seed=1), PromptFactory(model_dir, seed=1)
    assert a.many(32, 4) == b.many(32, 4)
    assert len(set(a.many(32, 4))) == 4
    assert a.make(32, 0) != PromptFactory(model_dir, seed=2).make(32, 0)
