"""Structured output as the APIs spell it, onto the one GrammarSpec (router/structured.py).

- TGI's `parameters.grammar` (and TGI's chat `response_format`): `{"type": "json", "value":
  <JSON schema, as an object or as JSON text>}`, `{"type": "regex", "value": "<regex>"}`, or
  `{"type": "json_schema", "value": {"name": ..., "schema": {...}}}`.
- OpenAI's `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`
  (any JSON object), `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...},
  "strict": ...}}`. The schema is always enforced, `strict` or not.
- vLLM's `structured_outputs` (`{"json": ...}`, `{"regex": ...}`, `{"choice": [...]}`,
  `{"json_object": true}`) and its older `guided_json`, `guided_regex`, `guided_choice`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from router.api.fields import BODY
from router.errors import ValidationError
from router.structured import GrammarSpec, choice_grammar


def json_schema_text(schema: object, field: str) -> str:
    """A JSON schema given as an object or as JSON text, as text (422 unless it is an object)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as err:
            raise ValidationError(f"`{field}` must be a JSON schema: {err}") from None
        except RecursionError:
            raise ValidationError(
                f"`{field}` must be a JSON schema: it is nested too deeply"
            ) from None
    if not isinstance(schema, dict):
        raise ValidationError(f"`{field}` must be a JSON schema (a JSON object)")
    return json.dumps(schema)


# What OpenAI's json_object asks for: some JSON object.
ANY_JSON_OBJECT = '{"type": "object"}'


class NamedSchema(BaseModel):
    """OpenAI's `json_schema` member, and the `value` of TGI's json_schema grammar."""

    model_config = BODY

    name: Annotated[str, Field(description="The schema's name (not used)")] | None = None
    description: Annotated[str, Field(description="Not used")] | None = None
    schema_: Annotated[
        dict[str, Any], Field(alias="schema", description="The JSON schema the output follows")
    ]
    strict: Annotated[bool, Field(description="Ignored: the schema is always enforced")] | None = (
        None
    )


class TgiGrammar(BaseModel):
    """TGI's GrammarType."""

    model_config = BODY

    type: Literal["json", "regex", "json_schema"]
    value: Annotated[
        Any,
        Field(
            description="json: a JSON schema (object or text); regex: the regular expression; "
            "json_schema: {name, schema}"
        ),
    ]

    def spec(self, field: str) -> GrammarSpec:
        where = f"{field}.value"
        if self.type == "regex":
            if not isinstance(self.value, str):
                raise ValidationError(f"`{where}` must be a string (the regular expression)")
            return GrammarSpec("regex", self.value, where)
        if self.type == "json_schema":
            if not isinstance(self.value, dict):
                raise ValidationError(f"`{where}` must be an object with a `schema`")
            try:
                named = NamedSchema.model_validate(self.value)
            except ValueError:
                raise ValidationError(f"`{where}` must be an object with a `schema`") from None
            return GrammarSpec("json", json_schema_text(named.schema_, f"{where}.schema"), where)
        return GrammarSpec("json", json_schema_text(self.value, where), where)


class ResponseFormat(BaseModel):
    """OpenAI's response_format, and TGI's chat spelling of a grammar (`type` + `value`)."""

    model_config = BODY

    type: Literal["text", "json_object", "json_schema", "json", "regex"]
    json_schema: NamedSchema | None = None
    value: Annotated[Any, Field(description="TGI's spelling: as in its `grammar`")] = None

    def spec(self, field: str = "response_format") -> GrammarSpec | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return GrammarSpec("json", ANY_JSON_OBJECT, field)
        if self.type == "json_schema" and self.json_schema is not None:
            where = f"{field}.json_schema.schema"
            return GrammarSpec("json", json_schema_text(self.json_schema.schema_, where), where)
        if self.value is None:
            member = "json_schema" if self.type == "json_schema" else "value"
            raise ValidationError(f"`{field}` of type {self.type!r} needs `{member}`")
        return TgiGrammar(type=self.type, value=self.value).spec(field)


Choices = Annotated[list[str], Field(min_length=1, description="The output is one of these")]


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs: one constraint."""

    model_config = BODY

    json_: Annotated[
        dict[str, Any] | str | None,
        Field(alias="json", description="A JSON schema (object or text)"),
    ] = None
    regex: str | None = None
    choice: Choices | None = None
    json_object: bool | None = None

    def spec(self, field: str = "structured_outputs") -> GrammarSpec | None:
        given = {
            "json": self.json_,
            "regex": self.regex,
            "choice": self.choice,
            "json_object": self.json_object or None,
        }
        named = [k for k, v in given.items() if v is not None]
        if len(named) > 1:
            raise ValidationError(f"`{field}` takes one constraint. Given: {', '.join(named)}")
        return vllm_spec(field, self.json_, self.regex, self.choice, bool(self.json_object))


def vllm_spec(
    field: str,
    json: dict[str, Any] | str | None = None,
    regex: str | None = None,
    choice: list[str] | None = None,
    json_object: bool = False,
) -> GrammarSpec | None:
    if json is not None:
        return GrammarSpec("json", json_schema_text(json, f"{field}.json"), f"{field}.json")
    if regex is not None:
        return GrammarSpec("regex", regex, f"{field}.regex")
    if choice is not None:
        return GrammarSpec("lark", choice_grammar(choice), f"{field}.choice")
    if json_object:
        return GrammarSpec("json", ANY_JSON_OBJECT, f"{field}.json_object")
    return None
