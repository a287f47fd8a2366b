"""Typed JSON records: the field types of the frames and the worker events (stdlib only).

A record is a frozen dataclass whose fields are declared with :func:`wire`: the field's JSON
key and its :class:`FieldType` (what JSON value it accepts, how that becomes the Python value
and back). :func:`dump` and :func:`load` are the only way between a record and its JSON
object; :func:`load` checks every field and raises :class:`FieldError` naming the field and
what it should have been. `zlaunch/wire/frames.py` and `zlaunch/wire/events.py` build on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, field, fields
from typing import Any

__all__ = [
    "FieldType",
    "FieldError",
    "wire",
    "nullable",
    "list_of",
    "is_int",
    "is_finite_number",
    "json_kind",
    "dump",
    "load",
    "INT",
    "COUNT",
    "NUMBER",
    "STR",
    "TRUE",
    "BOOL",
    "STR_LIST",
    "INT_LIST",
    "NUMBER_LIST",
    "JSON_LIST",
    "JSON_OBJECT",
    "ENV",
]


class FieldError(Exception):
    """A field of a record (or of a nested record) that is missing or of the wrong type."""


class FieldType:
    """What JSON value a field accepts on decode (``what`` says it in an error) and how it
    becomes the Python value (a nested record is built from its object) and back."""

    __slots__ = ("what", "accepts", "load", "dump")

    def __init__(
        self,
        what: str,
        accepts: Callable[[Any], bool],
        load: Callable[[Any, str], Any] | None = None,
        dump: Callable[[Any], Any] | None = None,
    ) -> None:
        self.what = what
        self.accepts = accepts
        self.load = load or (lambda value, _where: value)
        self.dump = dump or (lambda value: value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not 1


_FLOAT_MAX = 1e308


def is_finite_number(value: Any) -> bool:
    """A JSON number that is a finite float: an integer of 400 digits would overflow float()."""
    if is_int(value):
        return abs(value) <= _FLOAT_MAX
    return isinstance(value, float) and math.isfinite(value)


def list_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(test(item) for item in value)


def nullable(kind: FieldType) -> FieldType:
    return FieldType(
        f"{kind.what} or null",
        lambda value: value is None or kind.accepts(value),
        lambda value, where: None if value is None else kind.load(value, where),
        lambda value: None if value is None else kind.dump(value),
    )


INT = FieldType("an integer", is_int)
COUNT = FieldType("a count (an integer, 0 or more)", lambda v: is_int(v) and 0 <= v <= 2**53)
NUMBER = FieldType("a number (finite)", is_finite_number, lambda v, _w: float(v))
STR = FieldType("a string", lambda v: isinstance(v, str))
TRUE = FieldType("true", lambda v: v is True)
BOOL = FieldType("true or false", lambda v: isinstance(v, bool))
STR_LIST = FieldType("a list of strings", list_of(lambda v: isinstance(v, str)))
INT_LIST = FieldType("a list of integers", list_of(is_int))
NUMBER_LIST = FieldType(
    "a list of numbers (finite)", list_of(is_finite_number), lambda v, _w: [float(x) for x in v]
)
JSON_LIST = FieldType("a list", lambda v: isinstance(v, list))
JSON_OBJECT = FieldType("an object", lambda v: isinstance(v, dict))
ENV = FieldType(
    "an object of strings",
    lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
)


def wire(key: str, kind: FieldType, *, omit_default: bool = False, **default: Any) -> Any:
    """A record field: its JSON key and type. A field with a default may be absent on the wire;
    with ``omit_default`` it is left out when it holds its default (optional flags)."""
    meta = {"key": key, "type": kind, "omit": omit_default}
    return field(metadata=meta, **default)


def dump(record: Any) -> dict[str, Any]:
    """The record's JSON object (its wire keys), without the fields left at an omitted default."""
    obj = {}
    for spec in fields(record):
        if "key" not in spec.metadata:
            continue  # not carried on the wire (a decoder's finding)
        value = getattr(record, spec.name)
        if spec.metadata["omit"] and value == spec.default:
            continue
        obj[spec.metadata["key"]] = spec.metadata["type"].dump(value)
    return obj


def load(cls: type, obj: Any, where: str) -> Any:
    """The record ``cls`` from its JSON object, checked field by field; keys it does not know
    are ignored. ``where`` prefixes the field names in errors (a nested record's path)."""
    if not isinstance(obj, dict):
        raise FieldError(f"{where} must be an object")
    values = {}
    for spec in fields(cls):
        if "key" not in spec.metadata:
            continue
        key, kind = spec.metadata["key"], spec.metadata["type"]
        name = f"{where}.{key}" if where else key
        if key not in obj:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise FieldError(f"field {name!r} is missing")
            continue
        value = obj[key]
        if not kind.accepts(value):
            raise FieldError(f"field {name!r} must be {kind.what}, not {json_kind(value)}")
        values[spec.name] = kind.load(value, name)
    return cls(**values)


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)  # fmt: skip
