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
condition on it but `!=` (parsing and comparing: `rigkit.retrieval.filter_spec`). Filtering
happens inside the retrievers, before `top_k` is cut, so a filtered search still returns `top_k`
hits when that many chunks pass (`ChunkFilter.mask`).
"""

from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from rigkit.retrieval.filter_spec import (
    FORMS,
    RANGES,
    Condition,
    FilterError,
    Filters,
    compared_as,
    ordered_key,
    parse_filters,
)

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

_BUILT_IN = ("doc_id", "title")  # chunk fields that are not in its metadata but can be filtered
_MASKS_KEPT = 32  # filters whose chunk masks a retriever keeps (one per distinct request filter)


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
        if condition.op in RANGES:
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
        ordered = [o for o in map(ordered_key, values) if o is not None]
        if ordered and len(ordered) == len(values) and len({k for k, _ in ordered}) == 1:
            low, high = min(values, key=lambda v: ordered_key(v)[1]), max(values, key=lambda v: ordered_key(v)[1])
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
    found = ordered_key(value)
    return found[0] if found else None




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
