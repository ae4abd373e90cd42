"""Metadata filters: restrict a search to the chunks whose metadata passes every condition.

A chunk's metadata is every field of its JSONL line beyond id/title/text (plus what ingestion
adds: `source`, `page`, `section`, `modified`); `doc_id` and `title` can be filtered too. Conditions
are ANDed. Forms, the same from the command line, a config file and a JSON request:

    key=value   key=a,b (any of)   key!=value   key>=N  key>N  key<=N  key<N
    {"key": value}  {"key": [a, b]}  {"key": {"gte": .., "lt": .., "ne": .., "in": [..]}}

N is a number or an ISO 8601 date (`2024-01-01`, `2024-01-01T12:00:00+00:00`; a date alone is
that day's first instant; a time without a zone is read as UTC when the other side has one).
Equality compares numbers as numbers and dates as dates (`year=1990` matches the integer 1990), a
list-valued field matches when any element does, and a chunk without the field matches no
condition on it but `!=`. Filtering happens inside the retrievers, before `top_k` is cut, so a
filtered search still returns `top_k` hits when that many chunks pass (`ChunkFilter.mask`).
"""

from __future__ import annotations

import difflib
import inspect
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from rigkit.errors import InputError

__all__ = [
    "FilterError",
    "MasksOwnChunks",
    "Condition",
    "Filters",
    "parse_filters",
    "ChunkFilter",
    "accepts_filters",
    "check_accepts",
    "search_filtered",
    "FilteredRetriever",
    "compared_as",
    "FORMS",
]

FORMS = ("key=value, key=a,b (any of), key!=value, key>=N, key>N, key<=N or key<N "
         "(N a number or an ISO 8601 date such as 2024-01-01)")
_OPS = {">=": "gte", "<=": "lte", "!=": "ne", ">": "gt", "<": "lt", "=": "eq"}
_SYMBOLS = {name: symbol for symbol, name in _OPS.items()} | {"in": "="}
_RANGES = ("gt", "gte", "lt", "lte")
_TEXT = re.compile(r"^\s*([^=<>!]*?)\s*(>=|<=|!=|=|>|<)\s*(.*?)\s*$", re.S)
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
_BUILT_IN = ("doc_id", "title")  # chunk fields that are not in its metadata but can be filtered
_MASKS_KEPT = 32  # filters whose chunk masks a retriever keeps (one per distinct request filter)


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
                raise FilterError(f"a filter list holds strings or objects, not {_shown(item)}; forms: {FORMS}")
    else:
        raise FilterError(f"filters are a mapping, a list or a string, not {_shown(spec)}; forms: {FORMS}")
    return Filters(tuple(conditions)) or None


def _parse_text(text: str) -> Condition:
    match = _TEXT.match(text)
    key, symbol, value = match.groups() if match else ("", "", "")
    if not key or not value or value[0] in "=<>!":
        raise FilterError(f"malformed filter {text!r}; accepted forms: {FORMS}")
    op = _OPS[symbol]
    if op == "eq" and "," in value:
        return Condition(key, "in", tuple(v.strip() for v in value.split(",") if v.strip()))
    if op in _RANGES:
        return Condition(key, op, _bound(key, symbol, value), value)
    return Condition(key, op, value)


def _parse_entry(key: Any, value: Any) -> list[Condition]:
    if not isinstance(key, str) or not key.strip():
        raise FilterError(f"a filter key is a non-empty string, not {_shown(key)}")
    if isinstance(value, Mapping):
        conditions = []
        for op, bound in value.items():
            if op not in (*_RANGES, "eq", "ne", "in"):
                raise FilterError(f"filter {key}: unknown operator {op!r}; use eq, ne, in, gt, gte, lt or lte")
            if op == "in":
                conditions.append(Condition(key, "in", _values(key, bound)))
            elif op in _RANGES:
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
        raise FilterError(f"filter {key}: 'in' takes a non-empty list of values, not {_shown(values)}")
    return tuple(_scalar(key, v) for v in values)


def _scalar(key: str, value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise FilterError(f"filter {key}: {value!r} is not a finite number")
    if value is None or not isinstance(value, str | int | float | bool):
        raise FilterError(f"filter {key}: a value is text, a number or true/false, not {_shown(value)}")
    return value


def _bound(key: str, symbol: str, bound: Any) -> float | datetime:
    found = None if isinstance(bound, bool) else _ordered(bound)
    if found is not None:
        return found[1]
    raise FilterError(f"filter {key}{symbol}{bound}: the bound {bound!r} is neither a number nor an "
                      "ISO 8601 date (e.g. 2024-01-01)")


# -- comparing values -----------------------------------------------------------------------------


def _ordered(value: Any) -> tuple[str, Any] | None:
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
    a, b = _ordered(have), _ordered(want)
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
    found = _ordered(value)
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
    a, b = _ordered(have), _ordered(bound)
    if a is None or b is None or a[0] != b[0]:
        return False
    x, y = a[1], b[1]
    return x > y if op == "gt" else x >= y if op == "gte" else x < y if op == "lt" else x <= y


# -- over a chunk list ----------------------------------------------------------------------------


class ChunkFilter:
    """Which chunks of a list pass a filter, as a boolean mask over chunk positions.

    Masks are cached per `Filters` (a retriever asked for the same filter again pays nothing).
    A filter is checked against the chunks first: a key no chunk has, a range over a field that
    holds no number or date, and a filter no chunk passes are `FilterError`s saying what the
    index does hold, e.g. "no chunk has year>=3000 (year in the index: 1950 to 2019)"."""

    def __init__(self, chunks: Sequence[Any]):
        self.chunks, self.n = chunks, len(chunks)
        self._keys: list[str] | None = None
        # per field asked about: its distinct values, and each chunk's code into them (-1: no
        # such field), so a condition is tested once per distinct value, not once per chunk
        self._columns: dict[str, tuple[list[Any], np.ndarray]] = {}
        self._masks: dict[Filters, np.ndarray] = {}

    @property
    def keys(self) -> list[str]:
        """The fields some chunk has (metadata keys, and `doc_id` / `title`)."""
        if self._keys is None:
            found = {name for name in _BUILT_IN if any(getattr(c, name, None) for c in self.chunks)}
            for chunk in self.chunks:
                found.update(k for k, v in (getattr(chunk, "metadata", None) or {}).items() if v is not None)
            self._keys = sorted(found)
        return self._keys

    def column(self, key: str) -> tuple[list[Any], np.ndarray] | None:
        """(distinct values, (n_chunks,) codes into them, -1 where missing), or None: no chunk has it."""
        if key not in self._columns:
            if key not in self.keys:
                return None
            values: list[Any] = []
            seen: dict[Any, int] = {}
            codes = np.full(self.n, -1, dtype=np.int64)
            for position, chunk in enumerate(self.chunks):
                value = _field(chunk, key)
                if value is None:
                    continue
                kind = type(value)
                slot = (kind, value) if kind in (str, int, float, bool) else _slot(value)
                code = seen.get(slot)
                if code is None:
                    code = seen[slot] = len(values)
                    values.append(value)
                codes[position] = code
            self._columns[key] = (values, codes)
        return self._columns[key]

    def mask(self, filters: Filters) -> np.ndarray:
        """(n_chunks,) bool: True where the chunk passes every condition."""
        if filters in self._masks:
            return self._masks[filters]
        masks = [self._condition_mask(c) for c in filters.conditions]
        mask = np.logical_and.reduce(masks) if masks else np.ones(self.n, dtype=bool)
        if not mask.any():
            raise FilterError(self._no_match(filters, masks))
        if len(self._masks) >= _MASKS_KEPT:
            self._masks.pop(next(iter(self._masks)))
        self._masks[filters] = mask
        return mask

    def _condition_mask(self, condition: Condition) -> np.ndarray:
        column = self.column(condition.key)
        if column is None:
            close = difflib.get_close_matches(condition.key, self.keys, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise FilterError(f"unknown filter key {condition.key!r}{hint}; the index's chunks have: "
                              f"{', '.join(self.keys)}")
        if condition.op in _RANGES:
            kind = "date" if isinstance(condition.value, datetime) else "number"
            held = {k for k in map(_kind, column[0]) if k}
            if kind not in held:
                hint = "; give the bound as a date, e.g. 2024-01-01" if held == {"date"} else ""
                raise FilterError(f"filter {condition}: a range needs {kind}s, and {condition.key} holds "
                                  f"{' and '.join(k + 's' for k in sorted(held)) or 'text'} "
                                  f"({self.describe(condition.key)}){hint}")
        values, codes = column
        passes = np.fromiter((condition.test(v) for v in values), dtype=bool, count=len(values))
        missing = condition.test(None)  # a chunk without the field (code -1)
        return np.append(passes, missing)[codes]

    def _no_match(self, filters: Filters, masks: list[np.ndarray]) -> str:
        if len(masks) == 1 or any(not m.any() for m in masks):
            c, _ = next((c, m) for c, m in zip(filters.conditions, masks) if not m.any())
            return f"no chunk has {c} ({c.key} in the index: {self.describe(c.key)})"
        alone = ", ".join(f"{c} {int(m.sum())}" for c, m in zip(filters.conditions, masks))
        return f"no chunk has {filters} together (chunks passing each alone: {alone})"

    def describe(self, key: str, shown: int = 8) -> str:
        """What the field holds: a range of numbers or dates, or some of its distinct values."""
        distinct = (self.column(key) or ([], None))[0]
        values = [x for v in distinct for x in (v if isinstance(v, list | tuple) else [v])]
        ordered = [o for o in map(_ordered, values) if o is not None]
        if ordered and len(ordered) == len(values) and len({k for k, _ in ordered}) == 1:
            low, high = min(values, key=lambda v: _ordered(v)[1]), max(values, key=lambda v: _ordered(v)[1])
            return f"{low} to {high}" if low != high else f"only {low}"
        distinct = sorted({str(v) for v in values})
        more = f", ... ({len(distinct)} values)" if len(distinct) > shown else ""
        return ", ".join(distinct[:shown]) + more


def _field(chunk: Any, key: str) -> Any:
    metadata = getattr(chunk, "metadata", None) or {}
    if key in metadata or key not in _BUILT_IN:
        return metadata.get(key)
    return getattr(chunk, key, None) or None


def _slot(value: Any) -> Any:
    """A hashable key telling distinct field values apart (1, 1.0, True and "1" are four)."""
    if isinstance(value, list | tuple):
        return ("list", tuple(_slot(v) for v in value))
    if isinstance(value, dict):
        return ("dict", json.dumps(value, sort_keys=True, default=str))
    try:
        hash(value)
    except TypeError:
        return ("text", repr(value))
    return (type(value).__name__, value)


def _kind(value: Any) -> str | None:
    if isinstance(value, list | tuple):
        return next((k for k in map(_kind, value) if k), None)
    found = _ordered(value)
    return found[0] if found else None


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


# -- retrievers -----------------------------------------------------------------------------------


def accepts_filters(retriever: Any) -> bool:
    """Whether `retriever.search` (or the method given) takes a `filters` keyword (built-ins
    do; a custom one may not)."""
    try:
        parameters = inspect.signature(getattr(retriever, "search", retriever)).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "filters" or p.kind is p.VAR_KEYWORD for p in parameters)


def check_accepts(retriever: Any) -> None:
    if not accepts_filters(retriever):
        name = getattr(retriever, "name", type(retriever).__name__)
        raise FilterError(f"the retriever {name!r} takes no filters (its search has no `filters` "
                          "parameter); drop the filter, or give its search a `filters=None` keyword")


def search_filtered(retriever: Any, query: str, top_k: int, filters: Filters | None) -> list:
    """`retriever.search(query, top_k)`, with `filters=` only when there are some, so a
    retriever without the parameter keeps working unfiltered."""
    if not filters:
        return retriever.search(query, top_k)
    check_accepts(retriever)
    return retriever.search(query, top_k, filters=filters)


class MasksOwnChunks:
    """For a retriever over `self.chunks`: `filter_mask`, with its `ChunkFilter` built on first use."""

    chunks: Sequence[Any]
    _chunk_filter: ChunkFilter | None = None

    @property
    def chunk_filter(self) -> ChunkFilter:
        if self._chunk_filter is None:
            self._chunk_filter = ChunkFilter(self.chunks)
        return self._chunk_filter

    def filter_mask(self, filters: Filters) -> np.ndarray:
        """(n_chunks,) bool: the chunks passing `filters` (cached per filter)."""
        return self.chunk_filter.mask(filters)


class FilteredRetriever:
    """A retriever with filters bound to every search (`retrieval.filters`); filters given to
    `search` as well are ANDed with them."""

    def __init__(self, inner: Any, filters: Filters):
        check_accepts(inner)
        self.inner, self.filters = inner, filters
        self.name = getattr(inner, "name", type(inner).__name__)
        # the retrievers underneath, for code that looks through a hybrid (its dense model)
        self.retrievers = dict(getattr(inner, "retrievers", None) or {self.name: inner})
        for chunks in _chunk_lists(inner):  # fail now, not at the first search of a run
            ChunkFilter(chunks).mask(filters)

    def search(self, query: str, top_k: int = 5, filters: Any = None) -> list:
        return self.inner.search(query, top_k, filters=self.filters & parse_filters(filters))

    def search_many(self, queries: Iterable[str], top_k: int = 5, filters: Any = None) -> list[list]:
        combined = self.filters & parse_filters(filters)
        many = getattr(self.inner, "search_many", None)
        if many is not None:
            return many(list(queries), top_k, filters=combined)
        return [self.inner.search(q, top_k, filters=combined) for q in queries]


def _chunk_lists(retriever: Any) -> list[Sequence[Any]]:
    """The chunk lists a built-in retriever (or a hybrid of them) searches."""
    if getattr(retriever, "chunks", None) is not None:
        return [retriever.chunks]
    members = getattr(retriever, "retrievers", None)
    if isinstance(members, Mapping):
        return [m.chunks for m in members.values() if getattr(m, "chunks", None) is not None][:1]
    return []
