"""A request body into its pydantic model; the first error becomes a 422 naming the field.

Fields are named as the caller spelled them, relative to the object the caller thinks in: TGI's
`parameters` and OpenAI's `stream_options` are option objects whose members are named alone
(`temperature`), list items by their index (`messages[0].role`); a model that sets
`named_in_full = True` is named by its whole path instead (`tools[0].function.name`). Unknown
fields come first, as a typo explains any other error; then the first field in declaration
order.
"""

from __future__ import annotations

import difflib
import json
import typing
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel

from router.api.says import FIELD_ERROR, Says
from router.errors import ValidationError

M = TypeVar("M", bound=BaseModel)

# What a wrongly typed value should have been, by pydantic's error type.
KINDS = {
    "float_type": "a number",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_type": "a boolean",
    "string_type": "a string",
    "list_type": "a list",
}
OBJECT_ERRORS = frozenset({"model_type", "dict_type", "model_attributes_type"})


def parse(model: type[M], payload: dict[str, Any]) -> M:
    try:
        return model.model_validate(payload)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
    # Unknown fields first: a misspelled name explains whatever else went wrong.
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    raise describe(model, payload, errors[0]) from None


def describe(model: type[BaseModel], payload: Any, error: dict[str, Any]) -> ValidationError:
    where = _Where.find(model, payload, tuple(error["loc"]))
    kind = error["type"]
    if kind == "extra_forbidden":
        return ValidationError(f"unknown field `{where.unknown_name()}`{where.hint()}")
    if kind == "missing":
        return ValidationError(f"missing field `{where.name}`")
    if kind in OBJECT_ERRORS:
        return ValidationError(f"`{where.name}` must be a JSON object")
    if kind == FIELD_ERROR:
        return ValidationError(f"`{where.name}`{error['msg']}")
    says = where.says or Says()
    rule = says.rules.get(kind) or (None if kind in KINDS else says.rule)
    if rule is not None:
        given = error["input"]
        text = rule.format(
            value=json.dumps(given),
            given=given,
            length=len(given) if isinstance(given, (str, list)) else 0,
        )
        return ValidationError(f"`{where.name}` {text}")
    if kind in KINDS:
        what = says.kind or KINDS[kind]
        return ValidationError(f"`{where.name}` must be {what}, got {json.dumps(where.value)}")
    return ValidationError(f"`{where.name}`: {error['msg']}")


class _Where:
    """Walks an error's location through the models (and the payload, for the caller's value)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.model: type[BaseModel] | None = None  # whose field the last name is (or was not)
        self.last = ""
        self.says: Says | None = None
        self.value: Any = None

    @classmethod
    def find(cls, model: type[BaseModel], payload: Any, loc: tuple[Any, ...]) -> _Where:
        where, current, value = cls(), model, payload
        direct = False  # the previous step entered an option object (not a list item)
        for step in loc:
            if isinstance(step, int):
                value = value[step] if isinstance(value, list) and step < len(value) else None
                if current is not None and where.parts:
                    where.parts[-1] += f"[{step}]"
                direct = False
                continue
            fields = _aliases(current) if current is not None else {}
            if step not in fields:
                if current is not None and where.model is not current:  # an unknown field
                    where.model, where.last = current, str(step)
                    where.parts = [*([] if direct else where.parts), str(step)]
                continue  # or a union member's tag: the field stays the same
            name, annotation = fields[step]
            where.parts = [*([] if direct else where.parts), step]
            where.model, where.last = current, step
            where.says = _says(annotation)
            value = value.get(step) if isinstance(value, dict) else None
            where.value = value
            nested = _nested_model(annotation)
            direct = (
                nested is not None
                and not _is_list(annotation)
                and not getattr(nested, "named_in_full", False)
            )
            current = nested
        return where

    @property
    def name(self) -> str:
        return ".".join(self.parts)

    def unknown_name(self) -> str:
        prefix = getattr(self.model, "unknown_field_prefix", "")
        return f"{prefix}{self.last}"

    def hint(self) -> str:
        close = difflib.get_close_matches(self.last, sorted(_aliases(self.model)), n=1)
        return f"; did you mean `{close[0]}`?" if close else ""


def _aliases(model: type[BaseModel] | None) -> dict[str, tuple[str, Any]]:
    if model is None:
        return {}
    hints = typing.get_type_hints(model, include_extras=True)
    return {(info.alias or name): (name, hints[name]) for name, info in model.model_fields.items()}


def _walk(annotation: Any):
    """The annotation and every type and metadata inside it."""
    yield annotation
    for arg in typing.get_args(annotation):
        yield from _walk(arg)
    yield from getattr(annotation, "__metadata__", ())


def _says(annotation: Any) -> Says | None:
    return next((m for m in _walk(annotation) if isinstance(m, Says)), None)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    for t in _walk(annotation):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def _is_list(annotation: Any) -> bool:
    return any(typing.get_origin(t) is list for t in _walk(annotation))
