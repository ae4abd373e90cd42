"""Retrieval quality on a QA set: recall@k of the supporting paragraphs and MRR, per mode.

The setting of `data/README.md`'s reference figures: the question text is the query; a hit
counts when its document is a supporting one, matched by title (the reference) or by paragraph
id (`by="pid"`, stricter on MuSiQue, which repeats titles). recall@k = share of a question's
distinct supporting keys found among the top-k hits' keys, averaged over questions; MRR is the
mean reciprocal rank of the first supporting hit within the top max(k) hits (0 if none).
Question embeddings are computed in one batch; all modes share each question's two rankings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rigkit.config import RetrievalConfig
from rigkit.errors import InputError
from rigkit.retrieval.dense import embed_texts
from rigkit.retrieval.ranking import hits_from_scored
from rigkit.trace import Hit

__all__ = ["supporting_keys", "score_hits", "evaluate_retrieval"]


def supporting_keys(row: dict[str, Any], by: str) -> set[str]:
    if by == "title":
        return set(row.get("supporting_titles") or [])
    if by == "pid":
        return {p["pid"] for p in row.get("paragraphs", []) if p.get("is_supporting")}
    raise InputError(f"unknown relevance key {by!r}; choose title or pid")


def score_hits(hits: Sequence[Hit], gold: set[str], by: str, ks: Sequence[int]) -> dict[str, float]:
    keys = [h.title if by == "title" else h.doc_id for h in hits]
    out = {f"recall@{k}": len(gold & set(keys[:k])) / len(gold) for k in ks}
    first = next((rank for rank, key in enumerate(keys[: max(ks)], start=1) if key in gold), None)
    out["mrr"] = 1.0 / first if first else 0.0
    return out


def evaluate_retrieval(
    index,
    rows: Sequence[dict[str, Any]],
    modes: Sequence[str] = ("bm25", "dense", "hybrid"),
    ks: Sequence[int] = (1, 5, 10),
    by: str = "title",
    bm25_backend: str = RetrievalConfig.bm25_backend,
) -> dict[str, dict[str, float]]:
    """{mode: {"recall@1", "recall@5", "recall@10", "mrr"}} averaged over questions with gold."""
    rows = [r for r in rows if supporting_keys(r, by)]
    if not rows:
        raise InputError(f"no question has supporting {by}s to score against")
    hybrid = index.retriever("hybrid", bm25_backend=bm25_backend)
    bm25, dense = hybrid.retrievers["bm25"], hybrid.retrievers["dense"]
    depth = max(max(ks) * 2, *hybrid.top_ks.values())
    vectors = (
        embed_texts(dense.embedder, [r["question"] for r in rows])
        if "dense" in modes or "hybrid" in modes
        else None
    )
    totals = {mode: dict.fromkeys([*(f"recall@{k}" for k in ks), "mrr"], 0.0) for mode in modes}
    for i, row in enumerate(rows):
        gold = supporting_keys(row, by)
        scored = (
            {"bm25": bm25.scored(row["question"], depth)} if {"bm25", "hybrid"} & set(modes) else {}
        )
        if vectors is not None:
            scored["dense"] = dense.scored(row["question"], depth, vector=vectors[i])
        for mode in modes:
            if mode == "hybrid":
                hits = hybrid.fuse([scored["bm25"], scored["dense"]], max(ks))
            elif mode in scored:
                hits = hits_from_scored(scored[mode], index.chunks, max(ks))
            else:
                raise InputError(f"unknown retrieval mode {mode!r}")
            for key, value in score_hits(hits, gold, by, ks).items():
                totals[mode][key] += value
    return {
        mode: {k: round(v / len(rows), 4) for k, v in vals.items()} for mode, vals in totals.items()
    }
