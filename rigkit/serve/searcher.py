"""The served index, shared fairly between the RIG loop's searches and batch search calls.

The indexes (faiss, bm25s, the query encoder) are not safe to use from several threads, so one
search runs at a time. A `/retrieve` or `rig.search` call of many queries (at most `MAX_QUERIES`)
does not hold the index for its whole batch: it searches `SEARCH_SLICE` queries at a time, taking
its turn again for each slice. The model worker's searches (one per RIG round) go first whenever
they wait, so a RIG answer waits for at most the one slice already running; batch calls take
their slices in turn, so one big call does not starve the others either.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rigkit.errors import InputError
from rigkit.retrieval.filters import accepts_filters, check_accepts, parse_filters
from rigkit.trace import Hit

__all__ = ["SEARCH_SLICE", "SearchTurns", "SharedSearcher"]

SEARCH_SLICE = 16  # queries a batch searches per turn: a few tens of milliseconds on the CPU index


class SearchTurns:
    """A lock with two queues: `turn(urgent=True)` waiters go before the others, each in order."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._busy = False
        self._urgent: deque[object] = deque()
        self._batch: deque[object] = deque()

    @contextmanager
    def turn(self, urgent: bool = False) -> Iterator[None]:
        ticket, line = object(), self._urgent if urgent else self._batch
        with self._cv:
            line.append(ticket)
            self._cv.wait_for(lambda: not self._busy and self._next() is ticket)
            line.popleft()
            self._busy = True
        try:
            yield
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    @property
    def waiting(self) -> int:
        """Searches waiting for their turn."""
        with self._cv:
            return len(self._urgent) + len(self._batch)

    def _next(self) -> object | None:
        line = self._urgent or self._batch
        return line[0] if line else None


class SharedSearcher:
    """The served retriever: `search` for the loop's rounds, `search_many` for batch calls."""

    def __init__(self, inner: Any, slice_size: int = SEARCH_SLICE):
        self.inner, self.slice_size = inner, slice_size
        self.turns = SearchTurns()
        self.name = getattr(inner, "name", type(inner).__name__)
        if callable(getattr(inner, "route", None)):  # several knowledge bases: searches may name one
            self.route = inner.route

    def search(self, query: str, top_k: int = 5, **options: Any) -> list[Hit]:
        """The inner retriever's search; `options` (filters, source) pass through as given."""
        with self.turns.turn(urgent=True):
            return self.inner.search(query, top_k, **options)

    def search_many(self, queries: list[str], top_k: int = 5, filters: Any = None,
                    source: str | None = None) -> list[list[Hit]]:
        """Hits per query; `filters` (checked before any turn is taken) reach the retriever
        only when given, so a retriever without a `filters` parameter serves unfiltered calls;
        `source` names one knowledge base of several (an error for a single one)."""
        filters = parse_filters(filters)
        if filters:
            check_accepts(self.inner)
        many = getattr(self.inner, "search_many", None)  # a remote index takes a batch in one request
        if many is not None and filters and not accepts_filters(many):
            many = None  # a batch method that cannot filter: search query by query
        extra: dict[str, Any] = {"filters": filters} if filters else {}
        if source:
            if not callable(getattr(self, "route", None)):
                raise InputError(f"source {source!r}: this server has one knowledge base")
            self.inner.route("", source)  # an unknown name fails before any turn is taken
            many, extra["source"] = None, source
        hits: list[list[Hit]] = []
        for start in range(0, len(queries), self.slice_size):
            part = queries[start:start + self.slice_size]
            with self.turns.turn():
                hits.extend(many(part, top_k, **extra) if many is not None
                            else [self.inner.search(q, top_k, **extra) for q in part])
        return hits
