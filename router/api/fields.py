"""Fields more than one API declares: each once, with its limits and what its errors say.

Limits that depend on the server's flags (stop sequences, top-n tokens, prompt and total
lengths, best_of) are checked by router/validation.py; their descriptions say which flag.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field

from router.api.says import Says

# The shards compute in 32-bit floats: a larger value would become infinity there.
F32_MAX = 3.4028234663852886e38
# Every step scans a window as long as the longest stop sequence: bound it so one request cannot
# make every step of the batch slow (TGI has no such bound; no real stop sequence comes close).
MAX_STOP_SEQUENCE_CHARS = 1024

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
StopSequence = Annotated[str, Field(min_length=1, max_length=MAX_STOP_SEQUENCE_CHARS)]
STOP_SAYS = Says(
    kind="a list of strings",
    rules={
        "string_too_short": "sequences must not be empty strings",
        "string_too_long": f"sequences must be at most {MAX_STOP_SEQUENCE_CHARS} characters long. "
        "Given: {length}",
    },
)
Stop = Annotated[
    list[StopSequence],
    Field(description="Stop when one is generated; at most --max-stop-sequences"),
    STOP_SAYS,
]
