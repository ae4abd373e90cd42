"""JSON into the trace's dataclasses, checked field by field against their annotations.

A saved run comes back from outside (a file, an HTTP client), so nothing in it is trusted: an
unknown field, a missing one, a value of the wrong type or nesting past `MAX_DEPTH` is one
`SchemaError` naming where it is, never a TypeError or RecursionError from deep inside.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from enum import Enum
from typing import Any, TypeVar, Union

__all__ = ["MAX_DEPTH", "SchemaError", "checked", "loads"]

MAX_DEPTH = 40  # a run state nests about 8 deep; anything far past that is not one
T = TypeVar("T")


class SchemaError(ValueError):
    """A value that does not fit its field; the message says where (`rounds[2].segment.text`)."""


def loads(text: str | bytes) -> Any:
    """JSON text, or a `SchemaError` (malformed, or nested too deep to read)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise SchemaError(f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, TypeError) as err:
        raise SchemaError(f"not JSON ({err})") from None


def checked(cls: type[T], data: Any, where: str = "") -> T:
    """`data` (parsed JSON) as a `cls`, every field checked; `where` prefixes the messages."""
    return _value(cls, data, where, 0)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return {str: "a string", int: "an integer", float: "a number", bool: "true or false",
                list: "a list", dict: "an object"}.get(tp, f"a {tp.__name__}")
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_name(a) for a in typing.get_args(tp))
    return _name(origin) if origin else str(tp)


def _fail(where: str, tp: Any, value: Any) -> SchemaError:
    got = type(value).__name__ if not isinstance(value, (dict, list)) else ("an object" if isinstance(value, dict)
                                                                           else "a list")
    return SchemaError(f"{where or 'the value'} should be {_name(tp)}, not {got}")


def _value(tp: Any, value: Any, where: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise SchemaError(f"{where or 'the value'} is nested deeper than {MAX_DEPTH} levels")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return _plain(value, where, depth)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _value(arg, value, where, depth)
            except SchemaError:
                continue
        raise _fail(where, tp, value)
    if origin is list:
        if not isinstance(value, list):
            raise _fail(where, tp, value)
        return [_value(args[0], v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _fail(where, tp, value)
        return {k: _value(args[1], v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _dataclass(tp, value, where, depth)
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            words = ", ".join(repr(m.value) for m in tp)
            raise SchemaError(f"{where} should be one of {words}, not {str(value)[:40]!r}") from None
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool) or not isinstance(value, tp):
        raise _fail(where, tp, value)
    return value


def _dataclass(cls: type, value: Any, where: str, depth: int) -> Any:
    if not isinstance(value, dict):
        raise _fail(where, cls, value)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise SchemaError(f"{where or cls.__name__} has no field {str(unknown[0])[:40]!r}")
    missing = [n for n, f in fields.items() if n not in value and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise SchemaError(f"{where or cls.__name__} lacks its field {missing[0]!r}")
    hints = _hints(cls)
    dot = f"{where}." if where else ""
    return cls(**{k: _value(hints[k], v, f"{dot}{k}", depth + 1) for k, v in value.items()})


def _plain(value: Any, where: str, depth: int) -> Any:
    """Free-form JSON (a decider's evidence, a run's config), only bounded in depth."""
    if depth > MAX_DEPTH:
        raise SchemaError(f"{where or 'the value'} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        return {k: _plain(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    return value
