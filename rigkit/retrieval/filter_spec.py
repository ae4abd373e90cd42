"""A metadata filter as written and as tested: parsing its forms into conditions, and comparing
a field's value with a condition's (numbers as numbers, dates as dates, lists by any element).
Applying filters to chunks and retrievers: `rigkit.retrieval.filters`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rigkit.errors import InputError

__all__ = ["FORMS", "RANGES", "Condition", "FilterError", "Filters", "compared_as", "ordered_key", "parse_filters",
           "shown_value"]

FORMS = ("key=value, key=a,b (any of), key!=value, key>=N, key>N, key<=N or key<N "
         "(N a number or an ISO 8601 date such as 2024-01-01)")
_OPS = {">=": "gte", "<=": "lte", "!=": "ne", ">": "gt", "<": "lt", "=": "eq"}
_SYMBOLS = {name: symbol for symbol, name in _OPS.items()} | {"in": "="}
RANGES = ("gt", "gte", "lt", "lte")
_TEXT = re.compile(r"^\s*([^=<>!]*?)\s*(>=|<=|!=|=|>|<)\s*(.*?)\s*$", re.S)
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


class FilterError(InputError):
    """A filter that cannot be used: malformed, an unknown key, a range on text, or no match."""


@dataclass(frozen=True)
class Condition:
    """One test on one metadata field. `op`: eq | in | ne | gt | gte | lt | lte."""

    key: str
    op: str
    value: Any  # a scalar; a tuple for "in"; a float or an aware datetime for a range
    given: Any = field(default=None, compare=False)  # a range's bound as written (shown, sent)

    def __str__(self) -> str:
        shown = ",".join(map(str, self.value)) if self.op == "in" else str(self.written)
        return f"{self.key}{_SYMBOLS[self.op]}{shown}"

    @property
    def written(self) -> Any:
        return self.value if self.given is None else self.given

    def test(self, have: Any) -> bool:
        """Whether a chunk whose field holds `have` (None: the chunk lacks it) passes."""
        if have is None:
            return self.op == "ne"
        if self.op == "eq":
            return _equal(have, self.value)
        if self.op == "in":
            return any(_equal(have, v) for v in self.value)
        if self.op == "ne":
            return not _equal(have, self.value)
        return _in_range(have, self.op, self.value)


@dataclass(frozen=True)
class Filters:
    """Conditions that must all hold (frozen and hashable: retrievers cache a mask per filter)."""

    conditions: tuple[Condition, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.conditions)

    def __str__(self) -> str:
        return " and ".join(map(str, self.conditions))

    def __and__(self, other: Filters | None) -> Filters:
        return self if not other else Filters(self.conditions + other.conditions)

    @property
    def keys(self) -> list[str]:
        return list(dict.fromkeys(c.key for c in self.conditions))

    def matches(self, fields: Mapping[str, Any]) -> bool:
        return all(c.test(fields.get(c.key)) for c in self.conditions)

    def to_json(self) -> list[dict[str, Any]]:
        """The JSON form a server reads back with `parse_filters` (one object per condition)."""
        def plain(value: Any) -> Any:
            return value.isoformat() if isinstance(value, datetime) else value

        return [{c.key: {c.op: [plain(v) for v in c.value] if c.op == "in" else plain(c.written)}}
                for c in self.conditions]


def parse_filters(spec: Any) -> Filters | None:
    """Filters from any accepted form: None, `Filters`, a `key>=N` string, a list of strings
    and/or mappings, or a mapping `{key: value | [values] | {op: bound}}`. None when empty."""
    if spec is None or isinstance(spec, Filters):
        return spec or None
    if isinstance(spec, str):
        conditions = [_parse_text(spec)]
    elif isinstance(spec, Mapping):
        conditions = [c for key, value in spec.items() for c in _parse_entry(key, value)]
    elif isinstance(spec, Sequence):
        conditions = []
        for item in spec:
            if isinstance(item, str):
                conditions.append(_parse_text(item))
            elif isinstance(item, Mapping):
                conditions.extend(c for key, value in item.items() for c in _parse_entry(key, value))
            else:
                raise FilterError(f"a filter list holds strings or objects, not {shown_value(item)}; forms: {FORMS}")
    else:
        raise FilterError(f"filters are a mapping, a list or a string, not {shown_value(spec)}; forms: {FORMS}")
    return Filters(tuple(conditions)) or None


def _parse_text(text: str) -> Condition:
    match = _TEXT.match(text)
    key, symbol, value = match.groups() if match else ("", "", "")
    if not key or not value or value[0] in "=<>!":
        raise FilterError(f"malformed filter {text!r}; accepted forms: {FORMS}")
    op = _OPS[symbol]
    if op == "eq" and "," in value:
        return Condition(key, "in", tuple(v.strip() for v in value.split(",") if v.strip()))
    if op in RANGES:
        return Condition(key, op, _bound(key, symbol, value), value)
    return Condition(key, op, value)


def _parse_entry(key: Any, value: Any) -> list[Condition]:
    if not isinstance(key, str) or not key.strip():
        raise FilterError(f"a filter key is a non-empty string, not {shown_value(key)}")
    if isinstance(value, Mapping):
        conditions = []
        for op, bound in value.items():
            if op not in (*RANGES, "eq", "ne", "in"):
                raise FilterError(f"filter {key}: unknown operator {op!r}; use eq, ne, in, gt, gte, lt or lte")
            if op == "in":
                conditions.append(Condition(key, "in", _values(key, bound)))
            elif op in RANGES:
                conditions.append(Condition(key, op, _bound(key, _SYMBOLS[op], bound), bound))
            else:
                conditions.append(Condition(key, op, _scalar(key, bound)))
        if not conditions:
            raise FilterError(f"filter {key}: an empty condition {{}}; give e.g. {{\"gte\": 1990}}")
        return conditions
    if isinstance(value, list | tuple):
        return [Condition(key, "in", _values(key, value))]
    return [Condition(key, "eq", _scalar(key, value))]


def _values(key: str, values: Any) -> tuple[Any, ...]:
    if not isinstance(values, list | tuple) or not values:
        raise FilterError(f"filter {key}: 'in' takes a non-empty list of values, not {shown_value(values)}")
    return tuple(_scalar(key, v) for v in values)


def _scalar(key: str, value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise FilterError(f"filter {key}: {value!r} is not a finite number")
    if value is None or not isinstance(value, str | int | float | bool):
        raise FilterError(f"filter {key}: a value is text, a number or true/false, not {shown_value(value)}")
    return value


def _bound(key: str, symbol: str, bound: Any) -> float | datetime:
    found = None if isinstance(bound, bool) else ordered_key(bound)
    if found is not None:
        return found[1]
    raise FilterError(f"filter {key}{symbol}{bound}: the bound {bound!r} is neither a number nor an "
                      "ISO 8601 date (e.g. 2024-01-01)")


# -- comparing values -----------------------------------------------------------------------------


def ordered_key(value: Any) -> tuple[str, Any] | None:
    """("number", float) or ("date", aware datetime) when `value` is one, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return ("number", float(value)) if math.isfinite(value) else None
    if isinstance(value, datetime):
        return "date", value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, str):
        text = value.strip()
        if _NUMBER.match(text):
            number = float(text)
            return ("number", number) if math.isfinite(number) else None
        if _DATE.match(text):
            try:
                moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                return None
            return "date", moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return None


def _equal(have: Any, want: Any) -> bool:
    if isinstance(have, list | tuple):
        return any(_equal(h, want) for h in have)
    if isinstance(have, bool) or isinstance(want, bool):
        return _truth(have) is not None and _truth(have) == _truth(want)
    a, b = ordered_key(have), ordered_key(want)
    if a is not None and b is not None and a[0] == b[0]:
        return a[1] == b[1]
    return str(have) == str(want)


def compared_as(value: Any) -> str:
    """How a filter compares `value` (stored or asked for): "bool" (a boolean, or text reading
    true/false), "number" or "date" (text that reads as one too), "list", "text", or "other"."""
    if isinstance(value, bool) or (isinstance(value, str) and _truth(value) is not None):
        return "bool"
    if isinstance(value, list | tuple):
        return "list"
    found = ordered_key(value)
    if found is not None:
        return found[0]
    return "text" if isinstance(value, str) else "other"


def _truth(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    return {"true": True, "false": False}.get(str(value).strip().lower())


def _in_range(have: Any, op: str, bound: Any) -> bool:
    if isinstance(have, list | tuple):
        return any(_in_range(h, op, bound) for h in have)
    a, b = ordered_key(have), ordered_key(bound)
    if a is None or b is None or a[0] != b[0]:
        return False
    x, y = a[1], b[1]
    return x > y if op == "gt" else x >= y if op == "gte" else x < y if op == "lt" else x <= y


def shown_value(value: Any) -> str:
    """A value with its type, for a message."""
    return f"{type(value).__name__} {value!r}"
