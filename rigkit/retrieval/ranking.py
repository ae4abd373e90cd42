"""Shared ranking helpers: deterministic top-k, exact ranks, near-duplicate collapse.

Every ordering in rigkit retrieval breaks score ties by chunk position (the order of the chunk
file), so runs are reproducible and two BM25 backends can be compared id for id. Near-duplicate
collapse works on chunk lists (`collapse_near_duplicates`) and on hits of any retriever
(`collapse_hits`, keyed by chunk id) with one rule.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rigkit.corpus import Chunk
from rigkit.trace import Hit

__all__ = [
    "top_indices",
    "rank_of",
    "Scored",
    "make_hit",
    "collapse_near_duplicates",
    "collapse_hits",
    "hits_from_scored",
]


def top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best scores, best first, ties by index. scores: (n,)."""
    n = scores.shape[0]
    k = min(k, n)
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if k < n:
        # The k-th best from the top: numpy's introselect degrades on long runs of equal values
        # at the selected end (BM25's zero scores), 8 ms vs 0.7 ms at 50k scores (bench/retrieval.py).
        kth = -np.partition(-scores, k - 1)[k - 1]
        candidates = np.flatnonzero(scores >= kth)
    else:
        candidates = np.arange(n)
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order][:k]


def rank_of(scores: np.ndarray, index: int) -> int:
    """1-based rank of `index` in the full ordering (score desc, then index)."""
    s = scores[index]
    return int(np.count_nonzero(scores > s) + np.count_nonzero(scores[:index] == s) + 1)


@dataclass
class Scored:
    """One retriever's answer to one query: its ranked list plus exact rank/score for any chunk."""

    name: str
    ranked: list[tuple[int, float]]  # (chunk index, score), best first
    full: np.ndarray | None = None  # (n_chunks,) every chunk's score, when cheap to have
    _lazy_full: object = field(default=None, repr=False)  # callable computing `full` on demand

    def rank_and_score(self, index: int) -> tuple[int, float] | None:
        """(rank, score) of chunk `index`; None where the retriever scored only its list (Milvus)."""
        for rank, (i, score) in enumerate(self.ranked, start=1):
            if i == index:
                return rank, score
        if self.full is None and self._lazy_full is not None:
            self.full = self._lazy_full()
        if self.full is None:
            return None
        return rank_of(self.full, index), float(self.full[index])


def make_hit(chunk: Chunk, score: float, ranks: dict[str, int], scores: dict[str, float]) -> Hit:
    meta = {"position": chunk.position, "start": chunk.start, "end": chunk.end}
    if chunk.headings:
        meta["headings"] = list(chunk.headings)
    meta.update(chunk.metadata)
    return Hit(
        chunk_id=chunk.chunk_id,
        doc_id=chunk.doc_id,
        title=chunk.title,
        text=chunk.text,
        score=float(score),
        ranks=dict(ranks),
        scores={k: float(v) for k, v in scores.items()},
        metadata=meta,
    )


def _fingerprint(text: str) -> str:
    return hashlib.sha1(re.sub(r"\W+", " ", text.lower()).strip().encode()).hexdigest()


def collapse_near_duplicates(
    order: Sequence[int], chunks: Sequence[Chunk]
) -> list[tuple[int, list[str]]]:
    """Keep the first of hits that are the same slice: same document with overlapping character
    spans (neighbouring windows), or the same text up to case/punctuation (a copied document).
    Returns (kept index, chunk ids collapsed into it), in the given order."""
    slices = [_Slice(c.chunk_id, c.doc_id, c.start, c.end, c.text) for c in (chunks[i] for i in order)]
    return [(order[k], collapsed) for k, collapsed in _collapse(slices)]


def collapse_hits(hits: Sequence[Hit]) -> list[tuple[Hit, list[str]]]:
    """`collapse_near_duplicates` for hits from any retriever, keyed by chunk id: character
    spans come from `metadata["start"/"end"]` where the retriever recorded them."""
    slices = [
        _Slice(h.chunk_id, h.doc_id, h.metadata.get("start"), h.metadata.get("end"), h.text)
        for h in hits
    ]
    return [(hits[k], collapsed) for k, collapsed in _collapse(slices)]


@dataclass(frozen=True)
class _Slice:
    chunk_id: str
    doc_id: str
    start: int | None
    end: int | None
    text: str


def _collapse(slices: Sequence[_Slice]) -> list[tuple[int, list[str]]]:
    """(position of each kept slice, chunk ids collapsed into it), in order."""
    kept: list[tuple[int, list[str]]] = []
    prints: dict[str, int] = {}
    for pos, item in enumerate(slices):
        into = None
        for slot, (k, _) in enumerate(kept):
            other = slices[k]
            if other.doc_id == item.doc_id and _overlap(item, other):
                into = slot
                break
        fp = _fingerprint(item.text)
        if into is None:
            into = prints.get(fp)
        if into is None:
            prints[fp] = len(kept)
            kept.append((pos, []))
        else:
            kept[into][1].append(item.chunk_id)
    return kept


def _overlap(a: _Slice, b: _Slice) -> bool:
    if None in (a.start, a.end, b.start, b.end):
        return False
    return a.start < b.end and b.start < a.end  # type: ignore[operator]


def hits_from_scored(scored: Scored, chunks: Sequence[Chunk], top_k: int) -> list[Hit]:
    """One retriever's hits: its ranked list with near-duplicates collapsed, cut to top_k."""
    by_index = dict(scored.ranked)
    rank = {i: r for r, (i, _) in enumerate(scored.ranked, start=1)}
    hits = []
    for idx, collapsed in collapse_near_duplicates([i for i, _ in scored.ranked], chunks)[:top_k]:
        score = by_index[idx]
        hit = make_hit(chunks[idx], score, {scored.name: rank[idx]}, {scored.name: score})
        if collapsed:
            hit.metadata["collapsed"] = collapsed
        hits.append(hit)
    return hits
