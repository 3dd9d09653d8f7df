"""How errors about a field read, declared next to the field, and the errors a field's own
validator raises.

A message names the field as the caller spelled it (the alias in pydantic's error location), so
no message is ever rewritten for another API.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

# pydantic's error type for the errors our own validators raise: their text follows the name.
FIELD_ERROR = "switchyard"


# eq=False: hashed by identity, as typing hashes Annotated metadata (`rules` is a dict).
@dataclass(frozen=True, eq=False)
class Says:
    """Annotated metadata: what a field's errors say after its name.

    `rule` answers any broken constraint (`gt`, `min_length`, a literal...), `rules` a specific
    pydantic error type; `kind` is what a wrongly typed value should have been. Templates may
    use {value} (the caller's value as JSON), {given} (the Python value) and {length}.
    """

    rule: str | None = None
    kind: str | None = None
    rules: Mapping[str, str] = field(default_factory=dict)


def field_error(text: str) -> PydanticCustomError:
    """An error whose text follows the field's name (` must be...`, `: only...`)."""
    return PydanticCustomError(FIELD_ERROR, "{text}", {"text": text})


def unsupported(harmless: Callable[[Any], bool], why: str = "") -> AfterValidator:
    """A feature the server does not implement: refused unless its value changes nothing
    (OpenAI clients often send the neutral value of every field they know)."""

    def check(value: Any) -> Any:
        if not harmless(value):
            raise field_error(f" is not supported{why}")
        return value

    return AfterValidator(check)
