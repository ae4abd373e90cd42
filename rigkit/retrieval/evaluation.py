"""Retrieval quality on a QA set: recall@k of the supporting paragraphs and MRR, per mode.

The setting of `data/README.md`'s reference figures: the question text is the query; a hit
counts when its document is a supporting one, matched by title (the reference) or by paragraph
id (`by="pid"`, stricter on MuSiQue, which repeats titles). recall@k = share of a question's
distinct supporting keys found among the top-k hits' keys, averaged over questions; MRR is the
mean reciprocal rank of the first supporting hit within the top max(k) hits (0 if none).
Question embeddings are computed in one batch; all modes share each question's two rankings.
Mode `hybrid+rerank` reranks the hybrid's best `rerank.candidates` hits (a `RerankedRetriever`)
and also reports `added_ms_per_query`: the reranker's own time (deduplication and scoring).
Modes `multi` and `multi+q` search several queries per question (`subqueries(question)`, e.g.
the multi-query builder with the question as the need) and merge the hybrid lists by RRF; `multi+q`
merges the question's own list in too (RAG-Fusion). Their `added_ms_per_query` is the time to
write the queries (the model) and to search and merge them. With both a reranker and sub-queries,
`multi+rerank` and `multi+q+rerank` rerank each search's candidates by that search before the merge,
as the loop does with `--query-mode multi --rerank` (the question's list is `hybrid+rerank`'s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from rigkit.config import RetrievalConfig
from rigkit.errors import InputError
from rigkit.retrieval.hybrid import fuse_hit_lists
from rigkit.retrieval.ranking import hits_from_scored
from rigkit.trace import Hit

__all__ = ["supporting_keys", "score_hits", "evaluate_retrieval", "RERANKED_MODE", "MULTI_MODES",
           "MULTI_RERANKED_MODES"]

RERANKED_MODE = "hybrid+rerank"
MULTI_MODES = ("multi", "multi+q")  # several queries per question; +q: the question's list too
MULTI_RERANKED_MODES = ("multi+rerank", "multi+q+rerank")  # each search reranked, then merged


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
    rerank: Any = None,
    subqueries: Callable[[str], Sequence[str]] | None = None,
) -> dict[str, dict[str, float]]:
    """{mode: {"recall@1", "recall@5", "recall@10", "mrr"}} averaged over questions with gold.

    `rerank`: a `RerankedRetriever` for mode `hybrid+rerank` (its inner retriever is not used);
    `subqueries`: question -> its searches, for the modes `multi` and `multi+q`; both for
    `multi+rerank` and `multi+q+rerank`."""
    rows = [r for r in rows if supporting_keys(r, by)]
    if not rows:
        raise InputError(f"no question has supporting {by}s to score against")
    multi = [m for m in modes if m in MULTI_MODES + MULTI_RERANKED_MODES]
    reranked = [m for m in modes if m == RERANKED_MODE or m in MULTI_RERANKED_MODES]
    if reranked and rerank is None:
        raise InputError(f"mode {reranked[0]} needs a reranker (--rerank upr|MODEL)")
    if multi and subqueries is None:
        raise InputError(f"mode {multi[0]} needs sub-queries (--multi-query N)")
    rerank_seconds = multi_seconds = multi_rerank_seconds = 0.0
    multi_queries = 0
    if set(modes) == {"dense"}:  # needs no BM25 (an attached faiss index has none)
        hybrid, bm25, dense = None, None, index.dense()
        depth = max(max(ks) * 2, RetrievalConfig.dense_top_k)  # the hybrid's dense depth, as below
    else:
        index.bm25(bm25_backend)  # an index without BM25 says so here
        hybrid = index.retriever("hybrid", bm25_backend=bm25_backend)
        bm25, dense = hybrid.retrievers["bm25"], hybrid.retrievers["dense"]
        depth = max(max(ks) * 2, *hybrid.top_ks.values())
    vectors = (
        dense.embed_queries([r["question"] for r in rows])
        if {"dense", "hybrid", RERANKED_MODE, *multi} & set(modes)
        else None
    )
    totals = {mode: dict.fromkeys([*(f"recall@{k}" for k in ks), "mrr"], 0.0) for mode in modes}
    for i, row in enumerate(rows):
        gold = supporting_keys(row, by)
        scored = (
            {"bm25": bm25.scored(row["question"], depth)}
            if {"bm25", "hybrid", RERANKED_MODE, *multi} & set(modes) else {}
        )
        if vectors is not None:
            scored["dense"] = dense.scored(row["question"], depth, vector=vectors[i])
        hybrid_hits = (hybrid.fuse([scored["bm25"], scored["dense"]], max(ks))
                       if {"hybrid", *multi} & set(modes) else [])
        question_reranked: list[Hit] = []
        if reranked:
            candidates = hybrid.fuse([scored["bm25"], scored["dense"]], max(rerank.candidates, max(ks)))
            started = time.perf_counter()
            question_reranked = rerank.rerank(row["question"], candidates, max(ks))
            rerank_seconds += time.perf_counter() - started
        merged = {}
        if multi:
            started = time.perf_counter()
            searches = list(subqueries(row["question"]))
            merged = _merged(hybrid, searches, max(ks), multi, hybrid_hits)
            multi_seconds += time.perf_counter() - started
            multi_queries += len(searches)
            if set(MULTI_RERANKED_MODES) & set(multi):
                started = time.perf_counter()
                merged.update(_merged(rerank, searches, max(ks), multi, question_reranked, "+rerank"))
                multi_rerank_seconds += time.perf_counter() - started
        for mode in modes:
            if mode in merged:
                hits = merged[mode]
            elif mode == "hybrid":
                hits = hybrid_hits
            elif mode == RERANKED_MODE:
                hits = question_reranked
            elif mode in scored:
                hits = hits_from_scored(scored[mode], index.chunks, max(ks))
            else:
                raise InputError(f"unknown retrieval mode {mode!r}")
            for key, value in score_hits(hits, gold, by, ks).items():
                totals[mode][key] += value
    result = {
        mode: {k: round(v / len(rows), 4) for k, v in vals.items()} for mode, vals in totals.items()
    }
    if RERANKED_MODE in result:
        result[RERANKED_MODE]["added_ms_per_query"] = round(1000 * rerank_seconds / len(rows), 1)
    for mode in multi:
        seconds = multi_seconds + (mode in MULTI_RERANKED_MODES) * (
            multi_rerank_seconds + rerank_seconds * ("+q" in mode))  # the question's own rerank
        result[mode]["added_ms_per_query"] = round(1000 * seconds / len(rows), 1)
        result[mode]["queries_per_question"] = round(multi_queries / len(rows), 2)
    return result


def _merged(retriever, searches: Sequence[str], top_k: int, modes: Sequence[str],
            question_hits: list[Hit], suffix: str = "") -> dict[str, list[Hit]]:
    """{mode: hits} for the multi modes named `multi{suffix}` and `multi+q{suffix}`: each search's
    list from `retriever` (one batch), merged by RRF; +q merges `question_hits` in too."""
    lists = {f"q{i}": hits for i, hits in enumerate(retriever.search_many(searches, top_k), start=1)}
    alone = fuse_hit_lists(lists, top_k) if len(lists) > 1 else next(iter(lists.values()), [])
    out = {f"multi{suffix}": alone}
    if f"multi+q{suffix}" in modes:
        out[f"multi+q{suffix}"] = fuse_hit_lists({"q0": question_hits, **lists}, top_k)
    return out
