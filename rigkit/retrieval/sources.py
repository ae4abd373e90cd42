"""Several knowledge bases in one run: `SourcesRetriever` routes each search to one of its sources
or searches them all at once and merges their lists by RRF.

Routing, the first that applies:
1. the search names a source (`source=`): a marker phrase's `@name` prefix, a tool call's `source`;
2. a source's `route` rule, a regular expression, matches the query (sources in order);
3. every source, searched in parallel, lists merged by RRF (`fuse_hit_lists`).
Every hit carries its source's name (`Hit.source`) and a chunk id prefixed with it (`name:id`), so
two indexes that both number their chunks `d1#0` stay apart in the context and its citations. Ids
a corpus would refuse (`[[`, `]]`, control characters) become `passage-<hash>` here
(`held_to_corpus_rules`), as a single remote server's do.

A source that fails (a server that is down) does not fail a search another source answered: the
failure goes to the notes `collect_notes()` gathers, which the controller records in the result's
warnings. A failed source is then left out for `DOWN_SECONDS` (noted too), so a server that is
down costs one search its retries, not every search. When no source answers, the search fails as
any retriever's would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from rigkit.config import RetrievalConfig, SourceConfig
from rigkit.corpus import held_to_corpus_rules
from rigkit.errors import InputError, UpstreamError
from rigkit.retrieval.base import Retriever
from rigkit.retrieval.filters import parse_filters, search_filtered
from rigkit.retrieval.hybrid import fuse_hit_lists
from rigkit.trace import Hit

__all__ = ["Source", "SourcesRetriever", "SourcesDownError", "open_sources", "collect_notes",
           "parse_named", "SOURCE_NAME"]

DOWN_SECONDS = 30.0  # how long a source that failed is left out before it is asked again
SOURCE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_NOTES: ContextVar[list[str] | None] = ContextVar("rigkit_source_notes", default=None)


class SourcesDownError(UpstreamError, ConnectionError):
    """No source of a search answered: a server rigkit calls failed (`rigkit serve` answers 502)."""


@contextlib.contextmanager
def collect_notes() -> Iterator[list[str]]:
    """The notes (one line per source that did not answer) of the searches made inside."""
    notes: list[str] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def _note(line: str) -> None:
    notes = _NOTES.get()
    if notes is not None and line not in notes:
        notes.append(line)


def parse_named(value: str, flag: str) -> tuple[str | None, str]:
    """`NAME=LOCATION` -> (NAME, LOCATION); a plain location (no name before an `=`) -> (None, it)."""
    name, sep, location = value.partition("=")
    if not sep or not SOURCE_NAME.fullmatch(name):
        return None, value
    if not location:
        raise InputError(f"{flag} {value}: nothing after {name}=")
    return name, location


@dataclass(frozen=True)
class Source:
    """One knowledge base: its name, its retriever and its routing rule (None: no rule)."""

    name: str
    retriever: Retriever
    route: re.Pattern[str] | None = None


class SourcesRetriever:
    """A `Retriever` over named sources (module docstring): `search(query, top_k, filters, source)`."""

    name = "sources"

    def __init__(self, sources: Sequence[Source], rrf_k: int = RetrievalConfig.rrf_k):
        check_names([s.name for s in sources])
        self.sources = {s.name: s for s in sources}
        self.rrf_k = rrf_k
        self._down: dict[str, tuple[float, str]] = {}  # name -> (asked again from, why it failed)
        self._lock = threading.Lock()

    def route(self, query: str, source: str | None = None) -> list[str]:
        """The names of the sources `query` goes to."""
        if source:
            if source not in self.sources:
                raise InputError(f"unknown source {source!r}; known: {', '.join(self.sources)}")
            return [source]
        ruled = next((s.name for s in self.sources.values() if s.route and s.route.search(query)), None)
        return [ruled] if ruled else list(self.sources)

    def search(self, query: str, top_k: int = 5, filters: Any = None, source: str | None = None) -> list[Hit]:
        names = self.route(query, source)
        filters = parse_filters(filters)
        if len(names) == 1:
            answers, failed = self._ask_one(names[0], query, top_k, filters)
        else:
            with ThreadPoolExecutor(max_workers=len(names)) as pool:
                replies = list(pool.map(lambda n: self._ask_one(n, query, top_k, filters), names))
            answers = {k: v for a, _ in replies for k, v in a.items()}
            failed = [f for _, fs in replies for f in fs]
        if not answers:
            raise SourcesDownError("no source answered: " + "; ".join(failed))
        for line in failed:
            _note(f"source {line}: its passages are missing")
        if len(answers) == 1:
            return next(iter(answers.values()))
        return fuse_hit_lists(answers, top_k, self.rrf_k, label="sources")  # ranks name each source

    def _ask_one(self, name: str, query: str, top_k: int, filters) -> tuple[dict[str, list[Hit]], list[str]]:
        with self._lock:
            until, why = self._down.get(name, (0.0, ""))
        if time.monotonic() < until:
            return {}, [f"{name!r} left out: it did not answer {DOWN_SECONDS:g} s ago or less ({why})"]
        try:
            hits = search_filtered(self.sources[name].retriever, query, top_k, filters)
        except InputError:
            raise  # a bad filter or query is the caller's to fix, not a source that is down
        except Exception as err:  # noqa: BLE001 - one source down must not lose the others' answer
            why = f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
            with self._lock:
                self._down[name] = (time.monotonic() + DOWN_SECONDS, why)
            return {}, [f"{name!r} did not answer ({why})"]
        with self._lock:
            self._down.pop(name, None)
        return {name: [_tagged(h, name) for h in hits]}, []

    def close(self) -> None:
        for source in self.sources.values():
            close = getattr(source.retriever, "close", None)
            if callable(close):
                close()


def _tagged(hit: Hit, name: str) -> Hit:
    # held to a corpus's id rules as a single retriever's hits are: /retrieve, rig.search and MCP
    # hand them on as they are, so a forged id never leaves here
    return held_to_corpus_rules(dataclasses.replace(hit, chunk_id=f"{name}:{hit.chunk_id}", source=name))


def check_names(names: Sequence[str]) -> None:
    """Every source named, with a name of its own."""
    if not names:
        raise InputError("retrieval.sources is empty")
    seen: set[str] = set()
    for name in names:
        if not SOURCE_NAME.fullmatch(name or ""):
            raise InputError(f"source name {name!r}: use a letter then letters, digits, '_', '.' or '-'")
        if name in seen:
            raise InputError(f"two sources are named {name!r}: give each source a name of its own")
        seen.add(name)


def open_sources(config: RetrievalConfig, open_one: Callable[[RetrievalConfig], Retriever]) -> SourcesRetriever:
    """The sources of `config.sources`, each opened by `open_one` with the retrieval section's
    settings and its own `index` (a folder or a /retrieve URL)."""
    check_names([s.name for s in config.sources])
    if config.index or config.corpus:
        raise InputError("retrieval.sources replaces retrieval.index and retrieval.corpus: set one or the other")
    sources = []
    for spec in config.sources:
        if not spec.index:
            raise InputError(f"source {spec.name!r}: no index (a saved index folder or a /retrieve URL)")
        sub = dataclasses.replace(config, index=spec.index, corpus=None, sources=())
        sources.append(Source(spec.name, open_one(sub), _rule(spec)))
    return SourcesRetriever(sources, rrf_k=config.rrf_k)


def _rule(spec: SourceConfig) -> re.Pattern[str] | None:
    if not spec.route:
        return None
    try:
        return re.compile(spec.route, re.IGNORECASE)
    except re.error as err:
        raise InputError(f"source {spec.name!r}: route {spec.route!r} is not a regular expression ({err})") from None
