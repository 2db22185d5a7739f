"""Typed JSON documents one process writes and another reads (a driver's status, a lease's holder, a standby's status).

The writer builds a frozen dataclass and stores :func:`to_json`; every reader gets the same dataclass back from
:func:`from_json` and reads attributes, never string keys. Reading is forgiving in the one way files written by
another version of the platform need: a field the document lacks takes its default, a field the dataclass does
not know is ignored. Nested documents are rebuilt by their field's declared type: a dataclass, ``X | None``,
``Mapping[str, X]``, ``tuple[X, ...]``, ``list[X]``, enums and datetimes (ISO 8601).

A row of a Delta table is such a document too: :func:`to_row` writes it (datetimes kept for the table's
timestamp columns) and :func:`from_json` reads it back.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def to_json(document: object) -> dict[str, Any]:
    """The document as JSON-ready data (enums by value)."""
    return _plain(dataclasses.asdict(document))


def to_row(document: object) -> dict[str, Any]:
    """The document as a row of an Arrow/Delta table: as :func:`to_json`, but datetimes stay datetimes (a
    timestamp column takes them). :func:`from_json` reads such a row back."""
    return _plain(dataclasses.asdict(document), keep_datetimes=True)


def from_json(cls: type[T], data: Mapping[str, Any] | None) -> T:
    """``cls`` rebuilt from :func:`to_json`'s output (missing fields: defaults; unknown fields: ignored)."""
    data = data or {}
    hints = typing.get_type_hints(cls)
    values = {f.name: _typed(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.name in data}
    return cls(**values)


def _typed(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _typed(options[0], value) if len(options) == 1 else value
    if dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if hint is dt.datetime and isinstance(value, str):
        return dt.datetime.fromisoformat(value)
    if origin in (dict, Mapping, typing.Mapping) and isinstance(value, Mapping):
        key_type, value_type = typing.get_args(hint) or (Any, Any)
        return {_key(key_type, k): _typed(value_type, v) for k, v in value.items()}
    if origin in (tuple, list) and isinstance(value, list):
        item_type = (typing.get_args(hint) or (Any,))[0]
        return origin(_typed(item_type, v) for v in value)
    return value


def _key(hint: Any, key: str) -> Any:
    """JSON object keys are text; a ``Mapping[int, ...]`` gets its ints back."""
    return int(key) if hint is int else key


def _plain(value: Any, keep_datetimes: bool = False) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dt.datetime):
        return value if keep_datetimes else value.isoformat()
    if isinstance(value, Mapping):
        return {k: _plain(v, keep_datetimes) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, keep_datetimes) for v in value]
    return value
