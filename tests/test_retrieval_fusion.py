"""Reciprocal Rank Fusion arithmetic, per-retriever ranks on every hit, near-duplicate collapse."""

from __future__ import annotations

import numpy as np
import pytest

from rigkit.corpus import Chunk
from rigkit.retrieval import HybridRetriever, rrf_scores
from rigkit.retrieval.ranking import Scored, collapse_near_duplicates, rank_of, top_indices


def chunk(
    i: int, doc: str | None = None, start: int = 0, end: int = 10, text: str | None = None
) -> Chunk:
    return Chunk(f"c{i}", doc or f"d{i}", f"T{i}", text or f"text number {i}", 0, start, end)


class FixedRetriever:
    """Scores every chunk from a fixed array; lists the best `depth`, like BM25Retriever.scored."""

    def __init__(self, name: str, chunks, scores):
        self.name, self.chunks, self.scores = name, chunks, np.asarray(scores, dtype=float)

    def scored(self, query: str, depth: int) -> Scored:
        top = top_indices(self.scores, depth)
        return Scored(self.name, [(int(i), float(self.scores[i])) for i in top], full=self.scores)


def test_rrf_arithmetic():
    fused = rrf_scores({"a": [1, 2, 3], "b": [3, 1]}, k=60)
    assert fused[1] == pytest.approx(1 / 61 + 1 / 62)
    assert fused[2] == pytest.approx(1 / 62)
    assert fused[3] == pytest.approx(1 / 63 + 1 / 61)
    weighted = rrf_scores({"a": [1, 2], "b": [2, 1]}, weights={"a": 2.0, "b": 0.5}, k=0)
    assert weighted == {1: pytest.approx(2 / 1 + 0.5 / 2), 2: pytest.approx(2 / 2 + 0.5 / 1)}


def make_hybrid(**kwargs):
    chunks = [chunk(i) for i in range(6)]
    bm25 = FixedRetriever("bm25", chunks, [9, 8, 7, 0.5, 0.4, 0.0])  # order 0 1 2 3 4 5
    dense = FixedRetriever("dense", chunks, [0.1, 0.9, 0.2, 0.8, 0.7, 0.3])  # order 1 3 4 5 2 0
    return HybridRetriever({"bm25": bm25, "dense": dense}, **kwargs)


def test_fused_order_scores_and_every_rank():
    hits = make_hybrid(rrf_k=60).search("q", top_k=6)
    bm25_rank = {0: 1, 1: 2, 2: 3, 3: 4, 4: 5, 5: 6}
    dense_rank = {1: 1, 3: 2, 4: 3, 5: 4, 2: 5, 0: 6}
    expected = {i: 1 / (60 + bm25_rank[i]) + 1 / (60 + dense_rank[i]) for i in range(6)}
    want = sorted(expected, key=lambda i: -expected[i])
    assert [h.chunk_id for h in hits] == [f"c{i}" for i in want]
    for position, hit in enumerate(hits, start=1):
        i = int(hit.chunk_id[1:])
        assert hit.score == pytest.approx(expected[i]) == pytest.approx(hit.scores["hybrid"])
        assert hit.ranks == {"bm25": bm25_rank[i], "dense": dense_rank[i], "hybrid": position}
        assert set(hit.scores) == {"bm25", "dense", "hybrid"}


def test_per_retriever_top_k_limits_fusion_but_ranks_stay_exact():
    hits = make_hybrid(top_ks={"bm25": 2, "dense": 2}).search("q", top_k=10)
    # Only chunks 0 and 1 (bm25 top 2) and 1 and 3 (dense top 2) take part.
    assert [h.chunk_id for h in hits] == ["c1", "c0", "c3"]
    c3 = hits[2]
    assert c3.ranks["bm25"] == 4  # shown although bm25's list stopped at 2
    assert c3.score == pytest.approx(1 / 62)  # ... and it did not count
    assert c3.scores["bm25"] == pytest.approx(0.5)


def test_weights_change_the_order():
    dense_heavy = make_hybrid(weights={"bm25": 0.1, "dense": 1.0}).search("q", top_k=2)
    bm25_heavy = make_hybrid(weights={"bm25": 1.0, "dense": 0.1}).search("q", top_k=2)
    assert [h.chunk_id for h in dense_heavy] == ["c1", "c3"]
    assert [h.chunk_id for h in bm25_heavy] == ["c0", "c1"]


def test_rank_helpers_break_ties_by_position():
    scores = np.array([1.0, 3.0, 3.0, 2.0, 3.0])
    assert list(top_indices(scores, 4)) == [1, 2, 4, 3]
    assert [rank_of(scores, i) for i in range(5)] == [5, 1, 2, 4, 3]


def test_near_duplicates_collapse_into_the_best_ranked():
    chunks = [
        chunk(0, doc="a", start=0, end=100),
        chunk(1, doc="a", start=80, end=180),  # overlaps chunk 0: neighbouring window
        chunk(2, doc="a", start=200, end=300),  # same document, no overlap: kept
        chunk(3, doc="b", text="Text number 0!"),  # copy of chunk 0's text up to case/punct
        chunk(4, doc="c"),
    ]
    chunks[0].text = "text number 0"
    kept = collapse_near_duplicates([1, 0, 2, 3, 4], chunks)
    assert kept == [(1, ["c0"]), (2, []), (3, []), (4, [])]  # c3 copies c0, which was not kept
    kept = collapse_near_duplicates([0, 1, 2, 3, 4], chunks)
    assert kept == [(0, ["c1", "c3"]), (2, []), (4, [])]


def test_hybrid_hits_collapse_and_keep_top_k():
    chunks = [
        chunk(0, doc="a", start=0, end=100),
        chunk(1, doc="a", start=50, end=150),
        chunk(2),
        chunk(3),
    ]
    bm25 = FixedRetriever("bm25", chunks, [4, 3, 2, 1])
    dense = FixedRetriever("dense", chunks, [0.9, 0.8, 0.7, 0.6])
    hits = HybridRetriever({"bm25": bm25, "dense": dense}).search("q", top_k=3)
    assert [h.chunk_id for h in hits] == ["c0", "c2", "c3"]
    assert hits[0].metadata["collapsed"] == ["c1"]
    assert [h.ranks["hybrid"] for h in hits] == [1, 2, 3]


class WebSearch:
    """An external retriever: plain `search`, hits from outside the index's chunk list."""

    name = "web"

    def search(self, query: str, top_k: int = 5):
        from rigkit.trace import Hit

        hits = [Hit("web:1", "web:1", "Apache licence FAQ", "The NOTICE file must ship.", 7.0),
                Hit("c1", "d1", "T1", "text number 1", 5.0)]  # also a chunk of the index
        return hits[:top_k]


def test_an_external_retriever_fuses_with_bm25_by_chunk_id():
    from rigkit.retrieval import BM25Retriever

    chunks = [chunk(i, text=t) for i, t in enumerate(
        ["apache licence notice file", "text number 1 apache", "mit licence", "gpl copyleft"])]
    bm25 = BM25Retriever.build(chunks)
    hybrid = HybridRetriever({"bm25": bm25, "web": WebSearch()})
    hits = hybrid.search("apache notice", top_k=4)
    by_id = {h.chunk_id: h for h in hits}
    assert "web:1" in by_id and by_id["web:1"].title == "Apache licence FAQ"
    assert by_id["web:1"].ranks == {"web": 1, "hybrid": list(by_id).index("web:1") + 1}
    # a chunk both found gets both ranks and both RRF terms
    both = by_id["c1"]
    assert set(both.ranks) == {"bm25", "web", "hybrid"} and both.ranks["web"] == 2
    assert both.score == pytest.approx(1 / (60 + both.ranks["bm25"]) + 1 / 62)
    assert both.scores["web"] == 5.0
    assert [h.ranks["hybrid"] for h in hits] == list(range(1, len(hits) + 1))


def test_retriever_registry_builds_a_registered_retriever():
    from rigkit.config import RetrievalConfig
    from rigkit.retrieval import RETRIEVERS, open_retriever
    from rigkit.retrieval.base import NoRetriever

    RETRIEVERS["web"] = lambda config: WebSearch()
    try:
        assert isinstance(open_retriever(RetrievalConfig(mode="web")), WebSearch)
    finally:
        del RETRIEVERS["web"]
    assert isinstance(open_retriever(RetrievalConfig(mode="none")), NoRetriever)
    from rigkit.errors import InputError

    with pytest.raises(InputError, match="unknown retrieval mode"):
        open_retriever(RetrievalConfig(mode="nope"))


def test_a_retrieval_server_url_opens_the_registered_remote_retriever():
    """`--retriever URL` sets `retrieval.index` to the URL: the registry's `remote` entry opens it."""
    from rigkit.config import RetrievalConfig
    from rigkit.errors import InputError
    from rigkit.retrieval import RETRIEVERS, open_retriever
    from rigkit.retrieval.remote import RemoteRetriever

    url = "http://127.0.0.1:9/retrieve"  # nothing is contacted until a search
    for mode in ("hybrid", "bm25", "remote"):
        retriever = open_retriever(RetrievalConfig(index=url, mode=mode))
        assert isinstance(retriever, RemoteRetriever) and retriever.url == url
    assert RETRIEVERS["remote"] is not None
    with pytest.raises(InputError, match="needs the server's URL"):
        open_retriever(RetrievalConfig(mode="remote"))
    saved = RETRIEVERS["remote"]
    RETRIEVERS["remote"] = lambda config: WebSearch()  # a replaced entry is what a URL opens
    try:
        assert isinstance(open_retriever(RetrievalConfig(index=url)), WebSearch)
    finally:
        RETRIEVERS["remote"] = saved
