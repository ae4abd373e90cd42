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
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from rigkit.config import RetrievalConfig
from rigkit.errors import InputError
from rigkit.retrieval.base import Retriever, ScoresChunks
from rigkit.retrieval.ranking import Scored, collapse_hits, make_hit
from rigkit.trace import Hit

__all__ = ["rrf_scores", "HybridRetriever"]


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

    def search(self, query: str, top_k: int = 5) -> list[Hit]:
        answers = {
            name: self._ranked(name, r.scored(query, self.top_ks[name]))
            if isinstance(r, ScoresChunks)
            else self._listed(r.search(query, self.top_ks[name]))
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
            if cid not in where:
                return None
            rank, score = scored.rank_and_score(where[cid])
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

    # -- fusion -----------------------------------------------------------------------------
    def _fuse(self, answers: Mapping[str, _Ranked], top_k: int) -> list[Hit]:
        lists = {name: a.ids[: self.top_ks.get(name, 20)] for name, a in answers.items()}
        fused = rrf_scores(lists, self.weights, self.rrf_k)
        best_rank: dict[Hashable, int] = {}
        for items in lists.values():
            for rank, item in enumerate(items, start=1):
                best_rank[item] = min(rank, best_rank.get(item, rank))

        def position(cid: str) -> float:
            return min(a.position(cid) for a in answers.values())

        # Ties: the better single-list rank first, then chunk position, then id (deterministic).
        order = sorted(fused, key=lambda c: (-fused[c], best_rank[c], position(c), c))
        candidates = [self._first_hit(answers, cid) for cid in order]
        hits: list[Hit] = []
        for place, (hit, collapsed) in enumerate(collapse_hits(candidates)[:top_k], start=1):
            ranks: dict[str, int] = {}
            raw: dict[str, float] = {}
            for name, answer in answers.items():
                found = answer.rank_and_score(hit.chunk_id)
                if found is not None:
                    ranks[name], raw[name] = found[0], float(found[1])
            ranks[self.name], raw[self.name] = place, fused[hit.chunk_id]
            metadata = dict(hit.metadata)
            if collapsed:
                metadata["collapsed"] = collapsed
            hits.append(dataclasses.replace(hit, score=float(fused[hit.chunk_id]), ranks=ranks,
                                            scores=raw, metadata=metadata))
        return hits

    @staticmethod
    def _first_hit(answers: Mapping[str, _Ranked], cid: str) -> Hit:
        """The hit for `cid` from the first member that knows the chunk."""
        for answer in answers.values():
            hit = answer.hit(cid)
            if hit is not None:
                return hit
        raise AssertionError(f"chunk {cid} came from no retriever")  # fused ids come from lists
