"""Adapter lists as the launcher, the router and the shards take them (`NAME=DIR[,NAME=DIR...]`,
repeatable), and the rules for adapter names: one definition for the three command lines.

Torch-free: the launcher and the router import it without loading the shard's model code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# The base model's value of the router's metrics label `adapter`: no adapter may take it.
BASE_LABEL = "base"
# Names travel in `NAME=DIR,NAME=DIR` lists and in metric labels.
FORBIDDEN_NAME_CHARS = frozenset(",= \t\n")
# Names are echoed in errors, log lines and metric labels: a hub id ("org/name", each part at
# most 96 characters) fits with room to spare.
MAX_ADAPTER_NAME_CHARS = 256


class AdapterListError(ValueError):
    """A malformed adapter list or name; the message says which entry and why."""


def split_adapter_list(
    values: Iterable[str], *, allow_bare: bool = False, what: str = "DIR"
) -> list[tuple[str, str]]:
    """(name, path) pairs in order. `allow_bare`: an entry without `NAME=` is served under its
    own text (TGI's LORA_ADAPTERS=org/adapter); `what` names the path part in messages."""
    pairs: list[tuple[str, str]] = []
    for value in values:
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            name, sep, path = item.partition("=")
            if not sep and allow_bare:
                name, path = item, item
            name, path = name.strip(), path.strip()
            if not (sep or allow_bare) or not name or not path:
                raise AdapterListError(f"{item!r} is not NAME={what}")
            pairs.append((name, path))
    return pairs


def check_adapter_names(names: Sequence[str], served_name: str | None = None) -> None:
    """Names must say unambiguously which weights a request gets."""
    seen: set[str] = set()
    for name in names:
        if len(name) > MAX_ADAPTER_NAME_CHARS:  # first: the messages below echo the name
            raise AdapterListError(
                f"adapter name {name[:32]!r}... is {len(name)} characters; at most "
                f"{MAX_ADAPTER_NAME_CHARS} are allowed"
            )
        bad = sorted(FORBIDDEN_NAME_CHARS.intersection(name))
        if not name or bad:
            raise AdapterListError(f"adapter name {name!r} must be non-empty, without {bad}")
        if not name.isprintable():  # control characters would garble log lines
            raise AdapterListError(f"adapter name {name!r} must hold printable characters only")
        if name == BASE_LABEL:
            raise AdapterListError(f"adapter name {name!r} is reserved for the base model")
        if served_name is not None and name == served_name:
            # OpenAI's `model` could then mean either the base model or the adapter.
            raise AdapterListError(f"adapter name {name!r} is the served model name")
        if name in seen:
            raise AdapterListError(f"adapter name {name!r} is given twice")
        seen.add(name)
