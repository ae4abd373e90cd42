"""Hybrid retrieval by Reciprocal Rank Fusion (Cormack, Clarke & Buettcher, SIGIR 2009).

fused(d) = sum over retrievers r of  w_r / (k + rank_r(d)),  for d in r's top `top_k_r` list.
RRF needs no score calibration between BM25 and cosine similarity, which live on unrelated
scales; k = 60 damps the head of each list as in the paper. Lists are fused by *chunk id*, so
any `Retriever` can take part (an external search service, a retriever over another corpus),
not only retrievers sharing one chunk list. Every hit carries its exact rank and raw score in
each retriever that can say (built-in retrievers score any of their chunks, also where they
ranked it below their fused list, which then did not count towards `fused`), so a notebook can
show why it landed where it did. Near-duplicates (overlapping windows of one document, copied
text) collapse after fusion.

The same fusion merges the hit lists of several queries for one need (multi-query retrieval, as
in RAG-Fusion): `search_queries` retrieves each, in one `search_many` call where the retriever
has one, and `fuse_hit_lists` ranks by RRF over the lists, each hit naming the queries that
found it (`ranks["q1"]`, ...).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from rigkit.config import RetrievalConfig
from rigkit.errors import InputError
from rigkit.retrieval.base import Retriever, ScoresChunks
from rigkit.retrieval.dense import EmbedsQueries
from rigkit.retrieval.filters import FilterError, accepts_filters, parse_filters, search_filtered
from rigkit.retrieval.ranking import Scored, collapse_hits, make_hit
from rigkit.trace import Hit

__all__ = ["rrf_scores", "HybridRetriever", "fuse_hit_lists", "search_queries"]


def rrf_scores(
    ranked_lists: Mapping[str, Sequence[Hashable]],
    weights: Mapping[str, float] | None = None,
    k: int = 60,
) -> dict[Hashable, float]:
    """RRF score of every listed item. ranked_lists: retriever name -> item ids, best first."""
    fused: dict[Hashable, float] = {}
    for name, items in ranked_lists.items():
        weight = 1.0 if weights is None else weights.get(name, 1.0)
        for rank, item in enumerate(items, start=1):
            fused[item] = fused.get(item, 0.0) + weight / (k + rank)
    return fused


def _scored(retriever: ScoresChunks, query: str, depth: int, filters, **extra) -> Scored:
    """`retriever.scored(...)`, given `filters=` only when there are some (a chunk-scoring
    retriever of your own may not take them: then a clear error, not a TypeError)."""
    if filters:
        if not accepts_filters(retriever.scored):
            raise FilterError(f"the retriever {type(retriever).__name__!r} takes no filters (its `scored` has "
                              "no `filters` parameter); drop the filter, or give it a `filters=None` keyword")
        extra["filters"] = filters
    return retriever.scored(query, depth, **extra)


@dataclass
class _Ranked:
    """One retriever's answer keyed by chunk id: its list, a hit per id, exact rank on demand."""

    ids: list[str]
    hit: Callable[[str], Hit | None]
    rank_and_score: Callable[[str], tuple[int, float] | None]
    position: Callable[[str], float]  # chunk position for deterministic ties (inf: none)


class HybridRetriever:
    """Fuses any retrievers with weighted RRF over chunk ids."""

    name = "hybrid"

    def __init__(
        self,
        retrievers: Mapping[str, Retriever],
        weights: Mapping[str, float] | None = None,
        top_ks: Mapping[str, int] | None = None,
        rrf_k: int = RetrievalConfig.rrf_k,
    ):
        if not retrievers:
            raise InputError("a hybrid retriever needs at least one retriever")
        if rrf_k < 0:
            raise InputError("rrf_k must be >= 0")
        self.retrievers = dict(retrievers)
        self.weights = {name: 1.0 for name in self.retrievers} | dict(weights or {})
        self.top_ks = {name: 20 for name in self.retrievers} | dict(top_ks or {})
        self.rrf_k = rrf_k
        self._positions: dict[str, dict[str, int]] = {}

    def search(self, query: str, top_k: int = 5, filters=None) -> list[Hit]:
        """Fused hits best first; `filters` (any form `parse_filters` takes) go to every member."""
        filters = parse_filters(filters)
        answers = {
            name: self._ranked(name, _scored(r, query, self.top_ks[name], filters))
            if isinstance(r, ScoresChunks)
            else self._listed(search_filtered(r, query, self.top_ks[name], filters))
            for name, r in self.retrievers.items()
        }
        return self._fuse(answers, top_k)

    def fuse(self, scored: Sequence[Scored], top_k: int) -> list[Hit]:
        """Fused hits from the built-in members' answers (`scored` on BM25/Dense retrievers)."""
        return self._fuse({s.name: self._ranked(s.name, s) for s in scored}, top_k)

    # -- one member's answer, keyed by chunk id -----------------------------------------------
    def _ranked(self, name: str, scored: Scored) -> _Ranked:
        chunks = self.retrievers[name].chunks  # type: ignore[attr-defined]
        if name not in self._positions:
            self._positions[name] = {c.chunk_id: i for i, c in enumerate(chunks)}
        where = self._positions[name]

        def rank_and_score(cid: str) -> tuple[int, float] | None:
            return scored.rank_and_score(where[cid]) if cid in where else None

        def hit(cid: str) -> Hit | None:
            found = scored.rank_and_score(where[cid]) if cid in where else None
            if found is None:
                return None
            rank, score = found
            return make_hit(chunks[where[cid]], score, {name: rank}, {name: score})

        return _Ranked([chunks[i].chunk_id for i, _ in scored.ranked], hit, rank_and_score,
                       lambda cid: where.get(cid, math.inf))

    @staticmethod
    def _listed(hits: list[Hit]) -> _Ranked:
        by_id = {h.chunk_id: (rank, h) for rank, h in reversed(list(enumerate(hits, start=1)))}

        def rank_and_score(cid: str) -> tuple[int, float] | None:
            return (by_id[cid][0], by_id[cid][1].score) if cid in by_id else None

        return _Ranked(list(dict.fromkeys(h.chunk_id for h in hits)),
                       lambda cid: by_id[cid][1] if cid in by_id else None, rank_and_score,
                       lambda cid: math.inf)

    def search_many(self, queries: Sequence[str], top_k: int = 5, filters=None) -> list[list[Hit]]:
        """`search` for each query; dense members embed all the queries in one batch."""
        filters = parse_filters(filters)
        vectors = {name: r.embed_queries(list(queries)) for name, r in self.retrievers.items()
                   if isinstance(r, EmbedsQueries)}
        answers = []
        for i, query in enumerate(queries):
            answers.append({
                name: self._ranked(name, _scored(r, query, self.top_ks[name], filters, vector=vectors[name][i])
                                   if name in vectors else _scored(r, query, self.top_ks[name], filters))
                if isinstance(r, ScoresChunks)
                else self._listed(search_filtered(r, query, self.top_ks[name], filters))
                for name, r in self.retrievers.items()
            })
        return [self._fuse(a, top_k) for a in answers]

    # -- fusion -----------------------------------------------------------------------------
    def _fuse(self, answers: Mapping[str, _Ranked], top_k: int) -> list[Hit]:
        return _fuse(answers, top_k, self.weights, self.top_ks, self.rrf_k, self.name)

    @staticmethod
    def _first_hit(answers: Mapping[str, _Ranked], cid: str) -> Hit:
        """The hit for `cid` from the first member that knows the chunk."""
        for answer in answers.values():
            hit = answer.hit(cid)
            if hit is not None:
                return hit
        raise AssertionError(f"chunk {cid} came from no retriever")  # fused ids come from lists


def fuse_hit_lists(lists: Mapping[str, Sequence[Hit]], top_k: int, rrf_k: int = RetrievalConfig.rrf_k,
                   label: str = "merged") -> list[Hit]:
    """RRF over ranked hit lists of any origin (one per query), deduplicated by chunk id and
    near-duplicates collapsed as a hybrid's; a hit's `ranks` / `scores` hold its rank and raw
    score in each list that has it and its place in the merged list under `label`."""
    answers = {name: HybridRetriever._listed(list(hits)) for name, hits in lists.items()}
    return _fuse(answers, top_k, {}, {name: len(hits) for name, hits in lists.items()}, rrf_k, label)


def search_queries(retriever: Retriever, queries: Sequence[str], top_k: int,
                   rrf_k: int = RetrievalConfig.rrf_k, source: str | None = None) -> list[Hit]:
    """The hits for several queries of one need: each retrieved (`search_many` in one call where
    the retriever has it), lists merged by `fuse_hit_lists` as q1, q2, ... One query: `search`.
    `source` names the knowledge base to search (a retriever over `retrieval.sources`)."""
    if source:
        if not callable(getattr(retriever, "route", None)):
            raise InputError(f"the search names the source {source!r}, but this run has one knowledge base "
                             "(several: --index NAME=PATH / retrieval.sources)")
        lists = [retriever.search(q, top_k, source=source) for q in queries]
        return lists[0] if len(lists) == 1 else fuse_hit_lists(
            {f"q{i}": hits for i, hits in enumerate(lists, start=1)}, top_k, rrf_k)
    if len(queries) == 1:
        return retriever.search(queries[0], top_k)
    many = getattr(retriever, "search_many", None)
    lists = many(list(queries), top_k) if many is not None else [retriever.search(q, top_k) for q in queries]
    return fuse_hit_lists({f"q{i}": hits for i, hits in enumerate(lists, start=1)}, top_k, rrf_k)


def _fuse(answers: Mapping[str, _Ranked], top_k: int, weights: Mapping[str, float],
          depths: Mapping[str, int], rrf_k: int, label: str) -> list[Hit]:
    """Weighted RRF over the members' answers (each cut to its depth), near-duplicates collapsed."""
    lists = {name: a.ids[: depths.get(name, 20)] for name, a in answers.items()}
    fused = rrf_scores(lists, weights, rrf_k)
    best_rank: dict[Hashable, int] = {}
    for items in lists.values():
        for rank, item in enumerate(items, start=1):
            best_rank[item] = min(rank, best_rank.get(item, rank))

    def position(cid: str) -> float:
        return min(a.position(cid) for a in answers.values())

    # Ties: the better single-list rank first, then chunk position, then id (deterministic).
    order = sorted(fused, key=lambda c: (-fused[c], best_rank[c], position(c), c))
    candidates = [HybridRetriever._first_hit(answers, cid) for cid in order]
    hits: list[Hit] = []
    for place, (hit, collapsed) in enumerate(collapse_hits(candidates)[:top_k], start=1):
        ranks: dict[str, int] = {}
        raw: dict[str, float] = {}
        for name, answer in answers.items():
            found = answer.rank_and_score(hit.chunk_id)
            if found is not None:
                ranks[name], raw[name] = found[0], float(found[1])
        ranks[label], raw[label] = place, fused[hit.chunk_id]
        metadata = dict(hit.metadata)
        if collapsed:
            metadata["collapsed"] = collapsed
        hits.append(dataclasses.replace(hit, score=float(fused[hit.chunk_id]), ranks=ranks,
                                        scores=raw, metadata=metadata))
    return hits
