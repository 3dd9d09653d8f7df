"""Validation with TGI's rules and messages: a table of bad requests and the 422 each gets."""

import asyncio

import pytest

from router.api.tgi import parse_generate
from router.errors import ValidationError
from router.structured import Grammars
from router.tokenizer import Tokenizer
from router.validation import ValidationLimits, Validator, parse_json_body

LIMITS = ValidationLimits(
    max_input_tokens=16, max_total_tokens=32, max_stop_sequences=2, max_best_of=2
)


@pytest.fixture(scope="module")
def validator(tokenizer) -> Validator:
    return Validator(Tokenizer.from_object(tokenizer), LIMITS, grammars=Grammars(tokenizer, {2}))


def validate(validator, payload, stream=False):
    return asyncio.run(validator.validate(parse_generate(payload, stream=stream)))


def req(**params):
    return {"inputs": "Hello", "parameters": params}


BAD = [
    (req(temperature=0), "`temperature` must be strictly positive"),
    (req(temperature=-1.5), "`temperature` must be strictly positive"),
    (req(top_k=0), "`top_k` must be strictly positive"),
    (req(top_k=-3), "`top_k` must be strictly positive"),
    # The wire's top_k is 32 bits: a larger one must be refused here, not fail the shard step.
    (req(top_k=2**32), "`top_k` must fit in 32 bits, got 4294967296"),
    (req(temperature=1e39), "`temperature` must be at most 3.4028235e+38 (a 32-bit float)"),
    (req(repetition_penalty=1e300), "`repetition_penalty` must be at most 3.4028235e+38"),
    (req(top_p=1.0), "`top_p` must be > 0.0 and < 1.0"),
    (req(top_p=0), "`top_p` must be > 0.0 and < 1.0"),
    (req(typical_p=1.0), "`typical_p` must be > 0.0 and < 1.0"),
    (req(typical_p=-0.1), "`typical_p` must be > 0.0 and < 1.0"),
    (req(repetition_penalty=0), "`repetition_penalty` must be strictly positive"),
    (req(frequency_penalty=2.5), "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    (req(frequency_penalty=-2.01), "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    (req(max_new_tokens=0), "`max_new_tokens` must be strictly positive"),
    (req(max_new_tokens=-4), "`max_new_tokens` must be strictly positive"),
    (
        req(max_new_tokens=31),
        "`inputs` tokens + `max_new_tokens` must be <= 32. "
        "Given: 4 `inputs` tokens and 31 `max_new_tokens`",
    ),
    (req(stop=["a", "b", "c"]), "`stop` supports up to 2 stop sequences. Given: 3"),
    (req(stop=[""]), "`stop` sequences must not be empty"),
    (req(stop=["ab" * 513]), "`stop` sequences must be at most 1024 characters long. Given: 1026"),
    (req(truncate=0), "`truncate` must be strictly positive and less than 16. Given: 0"),
    (req(truncate=17), "`truncate` must be strictly positive and less than 16. Given: 17"),
    (req(top_n_tokens=6), "`top_n_tokens` must be >= 0 and <= 5. Given: 6"),
    (req(best_of=3, do_sample=True), "`best_of` must be > 0 and <= 2. Given: 3"),
    (req(best_of=0), "`best_of` must be > 0 and <= 2. Given: 0"),
    (req(best_of=2), "you must use sampling when `best_of` is > 1"),
    (req(best_of=2, do_sample=True, seed=3), "`seed` must not be set when `best_of` > 1"),
    (req(seed=-1), "`seed` must be an integer >= 0"),
    (req(seed=2**64), "`seed` must fit in 64 bits"),
    (req(watermark=True), "`watermark` is not supported"),
    (req(grammar={"type": "regex", "value": "a("}), "`parameters.grammar.value` is not valid: "),
    (
        req(grammar={"type": "json", "value": {"type": "strin"}}),
        "`parameters.grammar.value` is not valid: ",
    ),
    (req(grammar={"type": "regex", "value": 5}), "`parameters.grammar.value` must be a string"),
    # No text matches it: refused here, not as a failed generation.
    (req(grammar={"type": "regex", "value": "[^\\s\\S]"}), "`parameters.grammar.value` is not"),
    (
        req(grammar={"type": "json", "value": "[" * 5000 + "]" * 5000}),
        "`parameters.grammar.value` must be a JSON schema: it is nested too deeply",
    ),
    (req(grammar={"type": "json", "value": "{nope"}), "`parameters.grammar.value` must be a JSON"),
    (req(grammar={"type": "json", "value": [1]}), "`parameters.grammar.value` must be a JSON"),
    (
        req(grammar={"type": "json_schema", "value": {"name": "x"}}),
        "`parameters.grammar.value` must be an object with a `schema`",
    ),
    ({"inputs": ""}, "`inputs` cannot be empty"),
    (
        {"inputs": "a " * 18, "parameters": {"max_new_tokens": 1}},
        "`inputs` must have less than 16 tokens. Given: 19",
    ),
    # Without max_new_tokens the prompt, not the total, is what is too long.
    ({"inputs": "a " * 40}, "`inputs` must have less than 16 tokens. Given: 41"),
    ({"parameters": {}}, "missing field `inputs`"),
    ({"inputs": 5}, "`inputs` must be a string"),
    ({"inputs": "x", "parameters": []}, "`parameters` must be a JSON object"),
    (req(temperature="hot"), '`temperature` must be a number, got "hot"'),
    (req(top_k=1.5), "`top_k` must be an integer, got 1.5"),
    (req(max_new_tokens="5"), "`max_new_tokens` must be an integer"),
    (req(do_sample="yes"), "`do_sample` must be a boolean"),
    (req(details=1), "`details` must be a boolean"),
    (req(stop="END"), "`stop` must be a list of strings"),
    (req(stop=[1]), "`stop` must be a list of strings"),
    # Unknown fields, unlike TGI: a typo must not fall back to the default length.
    (
        req(max_new_token=5),
        "unknown field `parameters.max_new_token`; did you mean `max_new_tokens`?",
    ),
    (req(frobnicate=1), "unknown field `parameters.frobnicate`"),
    ({"inputs": "x", "paramters": {}}, "unknown field `paramters`; did you mean `parameters`?"),
    ({"inputs": "x", "stream": True}, "`stream` is true: streams come from /generate_stream"),
    ({"inputs": "x", "stream": "no"}, "`stream` must be a boolean"),
    (req(adapter_id="my-lora"), "`adapter_id` 'my-lora': no LoRA adapters are loaded"),
]


@pytest.mark.parametrize("payload,message", BAD)
def test_bad_requests_name_the_field_and_limit(validator, payload, message):
    with pytest.raises(ValidationError) as info:
        validate(validator, payload)
    err = info.value
    assert err.status == 422
    body = err.to_json("req-1")
    assert body["error_type"] == "validation" and body["request_id"] == "req-1"
    assert body["error"].startswith("Input validation error: ")
    assert message in body["error"]


def test_streaming_only_rules(validator):
    with pytest.raises(ValidationError, match="`stream` is false: single answers come from"):
        validate(validator, {"inputs": "x", "stream": False}, stream=True)
    with pytest.raises(ValidationError, match="`best_of` != 1 is not supported when streaming"):
        validate(validator, req(best_of=2, do_sample=True), stream=True)
    with pytest.raises(ValidationError, match="`decoder_input_details` == true is not supported"):
        validate(validator, req(decoder_input_details=True), stream=True)


def test_defaults(validator):
    v = validate(validator, {"inputs": "Hello"})
    assert v.input_ids == tuple(validator.tokenizer.decoder.encode("Hello"))
    assert v.max_new_tokens == 32 - len(v.input_ids)  # TGI: up to max_total_tokens (cap 1024)
    s = v.sampling
    assert (s.temperature, s.top_k, s.top_p, s.typical_p) == (1.0, 0, 1.0, 1.0)
    assert not s.do_sample
    assert (s.repetition_penalty, s.frequency_penalty) == (1.0, 0.0)
    assert 0 <= s.seed < 2**64
    assert not (v.details or v.decoder_input_details or v.return_full_text)
    assert v.stop == () and v.top_n_tokens == 0 and v.best_of == 1


def test_seed_is_random_when_unset_and_kept_when_set(validator):
    seeds = {validate(validator, req(max_new_tokens=1)).sampling.seed for _ in range(5)}
    assert len(seeds) == 5
    assert validate(validator, req(max_new_tokens=1, seed=2**64 - 1)).sampling.seed == 2**64 - 1


@pytest.mark.parametrize(
    "params,sample",
    [
        ({}, False),
        ({"do_sample": True}, True),
        ({"temperature": 1.0}, False),  # TGI: 1.0 is no warper
        ({"temperature": 0.7}, True),
        ({"top_k": 5}, True),
        ({"top_p": 0.9}, True),
        ({"typical_p": 0.5}, True),
        ({"repetition_penalty": 1.3}, False),  # a penalty alone stays greedy
    ],
)
def test_warpers_imply_sampling_like_tgi(validator, params, sample):
    assert validate(validator, req(max_new_tokens=2, **params)).sampling.do_sample is sample


@pytest.mark.parametrize("temperature", [1e-300, 1e-40, 9.9e-6])
def test_a_vanishing_temperature_decodes_greedily(validator, temperature):
    # As in vLLM: the limit of the tempered distribution, which float32 logits / temperature
    # cannot compute (inf, then NaN probabilities, for the smallest).
    params = {"temperature": temperature, "top_k": 5, "top_p": 0.5, "do_sample": True}
    s = validate(validator, req(max_new_tokens=2, **params)).sampling
    assert not s.do_sample
    assert (s.temperature, s.top_k, s.top_p, s.typical_p) == (1.0, 0, 1.0, 1.0)
    s = validate(validator, req(max_new_tokens=2, temperature=1e-5, do_sample=True)).sampling
    assert s.do_sample and s.temperature == 1e-5


def test_truncate_keeps_the_end_of_the_prompt(validator):
    text = "one two three four five six seven eight"
    full = validator.tokenizer.decoder.encode(text)
    assert len(full) > 16
    v = validate(validator, {"inputs": text, "parameters": {"truncate": 5, "max_new_tokens": 3}})
    assert v.input_ids == tuple(full[-5:])


def test_valid_full_request(validator):
    v = validate(
        validator,
        req(
            max_new_tokens=10,
            temperature=0.5,
            top_k=4,
            top_p=0.8,
            typical_p=0.9,
            repetition_penalty=1.1,
            frequency_penalty=-0.5,
            stop=["\n", "END"],
            seed=7,
            details=True,
            decoder_input_details=True,
            return_full_text=True,
            top_n_tokens=5,
            watermark=False,
            grammar=None,
            adapter_id=None,  # TGI's clients send every field, null when unset
        ),
    )
    assert v.max_new_tokens == 10 and v.stop == ("\n", "END") and v.sampling.seed == 7
    assert v.details and v.decoder_input_details and v.return_full_text and v.top_n_tokens == 5
    assert v.sampling.do_sample
    # The fields TGI's `text-generation` client sends around the parameters.
    full = {"inputs": "Hello", "parameters": {}, "stream": False, "add_special_tokens": True}
    assert validate(validator, full).input_ids == validate(validator, {"inputs": "Hello"}).input_ids


@pytest.mark.parametrize(
    "body,message",
    [
        (b"{not json", "request body is not valid JSON"),
        (b'{"inputs": NaN}', "request body is not valid JSON"),
        (b"[1, 2]", "request body must be a JSON object"),
        (b"\xff\xfe", "request body is not valid JSON"),
    ],
)
def test_malformed_bodies(body, message):
    with pytest.raises(ValidationError, match=message):
        parse_json_body(body)
