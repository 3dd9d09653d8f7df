from router.stopping import FinishReason, StoppingCriteria


def test_length_first_then_eos_then_stop_sequence():
    s = StoppingCriteria(max_new_tokens=1, eos_token_ids=[2], stop_sequences=["x"])
    assert s.step(2, "x") == FinishReason.LENGTH
    s = StoppingCriteria(max_new_tokens=5, eos_token_ids=[2], stop_sequences=["x"])
    assert s.step(2, "x") == FinishReason.EOS_TOKEN
    s = StoppingCriteria(max_new_tokens=5, eos_token_ids=[2], stop_sequences=["x"])
    assert s.step(7, "x") == FinishReason.STOP_SEQUENCE


def test_stopped_records_an_eos_or_stop_sequence_on_the_last_allowed_token():
    """TGI's reason is "length" there; `stopped` lets OpenAI's routes say "stop", as vLLM."""
    for token, text, stopped in [(2, "a", True), (7, "y", True), (7, "a", False)]:
        s = StoppingCriteria(max_new_tokens=2, eos_token_ids=[2], stop_sequences=["xy"])
        assert s.step(7, "x") is None and not s.stopped  # "x" alone is not the stop yet
        assert s.step(token, text) == FinishReason.LENGTH
        assert s.stopped is stopped
    s = StoppingCriteria(max_new_tokens=1, eos_token_ids=[2], ignore_eos=True)
    assert s.step(2, "</s>") == FinishReason.LENGTH and not s.stopped


def test_max_new_tokens_counts_every_token():
    s = StoppingCriteria(max_new_tokens=3)
    assert s.step(5, "a") is None
    assert s.step(5, "") is None
    assert s.step(5, "b") == FinishReason.LENGTH
    assert s.generated == 3


def test_ignore_eos():
    s = StoppingCriteria(max_new_tokens=5, eos_token_ids=[2], ignore_eos=True)
    assert s.step(2, "</s>") is None


def test_stop_sequence_across_token_boundaries():
    s = StoppingCriteria(max_new_tokens=100, stop_sequences=["World!"])
    assert s.step(1, "Hello Wo") is None
    assert s.step(2, "") is None  # held-back bytes emit no text
    assert s.step(3, "rld") is None
    assert s.step(4, "!!") == FinishReason.STOP_SEQUENCE


def test_stop_sequence_inside_one_chunk_and_several_sequences():
    s = StoppingCriteria(max_new_tokens=100, stop_sequences=["\n\n", "END"])
    assert s.step(1, "abc\n") is None
    assert s.step(2, "x\n") is None
    assert s.step(3, "\n tail") == FinishReason.STOP_SEQUENCE
    s = StoppingCriteria(max_new_tokens=100, stop_sequences=["\n\n", "END"])
    assert s.step(1, "the END of it") == FinishReason.STOP_SEQUENCE


def test_no_false_match_from_old_text():
    s = StoppingCriteria(max_new_tokens=100, stop_sequences=["ab"])
    assert s.step(1, "a") is None
    assert s.step(2, "x") is None
    assert s.step(3, "b") is None  # "a" was not right before "b"


def test_multibyte_stop_sequence():
    s = StoppingCriteria(max_new_tokens=100, stop_sequences=["日本"])
    assert s.step(1, "こんにちは日") is None
    assert s.step(2, "本語") == FinishReason.STOP_SEQUENCE
