"""Hybrid retrieval by Reciprocal Rank Fusion (Cormack, Clarke & Buettcher, SIGIR 2009).

fused(d) = sum over retrievers r of  w_r / (k + rank_r(d)),  for d in r's top `top_k_r` list.
RRF needs no score calibration between BM25 and cosine similarity, which live on unrelated
scales; k = 60 damps the head of each list as in the paper. Every hit carries its exact rank and
raw score in *each* retriever (also where a retriever ranked it below its fused list, which then
did not count towards `fused`), so a notebook can show why it landed where it did.
Near-duplicates (overlapping windows of one document, copied text) collapse after fusion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rigkit.errors import InputError
from rigkit.retrieval.ranking import Scored, collapse_near_duplicates, make_hit
from rigkit.trace import Hit

__all__ = ["rrf_scores", "HybridRetriever"]


def rrf_scores(
    ranked_lists: Mapping[str, Sequence[int]],
    weights: Mapping[str, float] | None = None,
    k: int = 60,
) -> dict[int, float]:
    """RRF score of every listed item. ranked_lists: retriever name -> item ids, best first."""
    fused: dict[int, float] = {}
    for name, items in ranked_lists.items():
        weight = 1.0 if weights is None else weights.get(name, 1.0)
        for rank, item in enumerate(items, start=1):
            fused[item] = fused.get(item, 0.0) + weight / (k + rank)
    return fused


class HybridRetriever:
    """Fuses retrievers that share one chunk list (same positions) with weighted RRF."""

    name = "hybrid"

    def __init__(
        self,
        retrievers: Mapping[str, object],
        weights: Mapping[str, float] | None = None,
        top_ks: Mapping[str, int] | None = None,
        rrf_k: int = 60,
    ):
        if not retrievers:
            raise InputError("a hybrid retriever needs at least one retriever")
        sizes = {name: len(r.chunks) for name, r in retrievers.items()}
        if len(set(sizes.values())) != 1:
            raise InputError(f"retrievers must share one chunk list; sizes differ: {sizes}")
        if rrf_k < 0:
            raise InputError("rrf_k must be >= 0")
        self.retrievers = dict(retrievers)
        self.chunks = next(iter(self.retrievers.values())).chunks
        self.weights = {name: 1.0 for name in self.retrievers} | dict(weights or {})
        self.top_ks = {name: 20 for name in self.retrievers} | dict(top_ks or {})
        self.rrf_k = rrf_k

    def search(self, query: str, top_k: int = 5) -> list[Hit]:
        scored = [r.scored(query, self.top_ks[name]) for name, r in self.retrievers.items()]
        return self.fuse(scored, top_k)

    def fuse(self, scored: Sequence[Scored], top_k: int) -> list[Hit]:
        """Fused hits from each retriever's answer (see `scored` on BM25/Dense retrievers)."""
        lists = {s.name: [i for i, _ in s.ranked[: self.top_ks.get(s.name, 20)]] for s in scored}
        fused = rrf_scores(lists, self.weights, self.rrf_k)
        best_rank = {}
        for items in lists.values():
            for rank, item in enumerate(items, start=1):
                best_rank[item] = min(rank, best_rank.get(item, rank))
        # Ties: the better single-list rank first, then chunk position (deterministic).
        order = sorted(fused, key=lambda i: (-fused[i], best_rank[i], i))
        hits: list[Hit] = []
        for position, (idx, collapsed) in enumerate(
            collapse_near_duplicates(order, self.chunks)[:top_k], start=1
        ):
            ranks: dict[str, int] = {}
            raw: dict[str, float] = {}
            for s in scored:
                ranks[s.name], raw[s.name] = s.rank_and_score(idx)
            ranks[self.name], raw[self.name] = position, fused[idx]
            hit = make_hit(self.chunks[idx], fused[idx], ranks, raw)
            if collapsed:
                hit.metadata["collapsed"] = collapsed
            hits.append(hit)
        return hits
