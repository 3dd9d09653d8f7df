"""How errors about a field read, declared next to the field, and the errors a field's own
validator raises.

A message names the field as the caller spelled it (the alias in pydantic's error location), so
no message is ever rewritten for another API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

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


class Unsupported:
    """Annotated metadata for a feature the server does not implement: refused unless its value
    is one that changes nothing (OpenAI clients often send the neutral value of every field
    they know). The schema lists those values, so the document refuses what the parser does."""

    def __init__(self, *allowed: Any, why: str = "") -> None:
        self.allowed, self.why = allowed, why

    def check(self, value: Any) -> Any:
        # Types compared too: in Python False == 0 and 1 == True.
        if not any(type(value) is type(a) and value == a for a in self.allowed):
            raise field_error(f" is not supported{self.why}")
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> Any:
        out = dict(handler(schema))
        out["enum"] = list(self.allowed)
        out["description"] = f"Not supported: only {', '.join(map(repr, self.allowed))}"
        return out
