"""Fields more than one API declares: each once, with its limits and what its errors say.

Limits that depend on the server's flags (stop sequences, top-n tokens, prompt and total
lengths, best_of, grammar sizes) are checked by router/validation.py; their descriptions say
which flag.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field

from router.api.says import Says
from shard.lora.names import MAX_ADAPTER_NAME_CHARS

# The shards compute in 32-bit floats: a larger value would become infinity there.
F32_MAX = 3.4028234663852886e38
# OpenAI's `model` names the served model, whose name defaults to its directory: PATH_MAX.
MAX_MODEL_NAME_CHARS = 4096

# Bodies are JSON: no type coercion ("5" is not 5, 1 is not true), and a misspelled field is an
# error (unlike TGI, which ignores unknown fields): a typo such as `max_new_token` must not
# silently fall back to the default length.
BODY = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

POSITIVE = Says("must be strictly positive")


def wire_int(bits: int, *, ge: int, description: str, below: str) -> Any:
    """An integer field at least `ge` that the shards' wire carries in `bits` unsigned bits: a
    larger one is refused here, never left to fail the step that sends it."""
    return Annotated[
        int,
        Field(ge=ge, le=2**bits - 1, description=f"{description} ({bits} bits)"),
        Says(
            rules={
                "greater_than_equal": below,
                "less_than_equal": f"must fit in {bits} bits, got {{value}}",
            }
        ),
    ]


# A positive float the shards can hold (TGI reads these as 32-bit floats too).
POSITIVE_F32 = Says(
    rules={
        "greater_than": "must be strictly positive",
        "less_than_equal": f"must be at most {F32_MAX:.8g} (a 32-bit float). Given: {{value}}",
    }
)
Temperature = Annotated[
    float,
    Field(gt=0.0, le=F32_MAX, description="Softmax temperature; > 0 (below 1e-5: greedy)"),
    POSITIVE_F32,
]
RepetitionPenalty = Annotated[
    float,
    Field(gt=0.0, le=F32_MAX, description="HF's repetition penalty; 1.0 is off"),
    POSITIVE_F32,
]
# OpenAI's additive penalties count the generated tokens only (not the prompt), as vLLM.
FrequencyPenalty = Annotated[
    float,
    Field(
        ge=-2.0,
        le=2.0,
        description="OpenAI's frequency penalty: penalty x times the token was generated",
    ),
    Says("must be >= -2.0 and <= 2.0"),
]
PresencePenalty = Annotated[
    float,
    Field(
        ge=-2.0,
        le=2.0,
        description="OpenAI's presence penalty: subtracted once if the token was generated",
    ),
    Says("must be >= -2.0 and <= 2.0"),
]
TopK = wire_int(
    32, ge=1, description="Keep the k most likely tokens", below="must be strictly positive"
)
# 1.0 is the "disabled" value on the wire, not a value to ask for (TGI's rule).
UnitOpen = Says("must be > 0.0 and < 1.0")
TopP = Annotated[float, Field(gt=0.0, lt=1.0, description="Nucleus sampling mass"), UnitOpen]
TypicalP = Annotated[float, Field(gt=0.0, lt=1.0, description="Typical sampling mass"), UnitOpen]
MaxNewTokens = Annotated[
    int,
    Field(gt=0, description="Tokens to generate at most; prompt + this <= --max-total-tokens"),
    POSITIVE,
]
Seed = wire_int(
    64,
    ge=0,
    description="Random seed; random when unset",
    below="must be an integer >= 0, got {value}",
)
# Their length is bounded by --max-stop-sequence-length (router/validation.py).
StopSequence = Annotated[str, Field(min_length=1)]
STOP_SAYS = Says(
    kind="a list of strings",
    rules={"string_too_short": "sequences must not be empty strings"},
)
STOP_DESCRIPTION = (
    "Stop when one is generated; at most --max-stop-sequences, each at most "
    "--max-stop-sequence-length characters"
)
Stop = Annotated[list[StopSequence], Field(description=STOP_DESCRIPTION), STOP_SAYS]


def bounded_name(limit: int, description: str) -> Any:
    """A name the server looks up (a model, an adapter): refused past `limit` characters, so that
    no error or log line echoes a longer one."""
    return Annotated[
        str,
        Field(max_length=limit, description=f"{description}; at most {limit} characters"),
        Says(rules={"string_too_long": f"must be at most {limit} characters. Given: {{length}}"}),
    ]


AdapterName = bounded_name(MAX_ADAPTER_NAME_CHARS, "A loaded LoRA adapter; empty: the base model")
ModelName = bounded_name(MAX_MODEL_NAME_CHARS, "The served model or a LoRA adapter")
