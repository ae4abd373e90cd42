"""BM25 (Robertson & Zaragoza 2009) over the chunk file, with two interchangeable backends.

`bm25s` (Lù 2024) precomputes every document's term scores in a sparse matrix, so a query is a
sum of a few sparse rows: the fast path, and the one saved with an index. `rank_bm25` is the
reference implementation most people know; it is offered for parity checks and comparison.
Both use the same tokens (`rigkit.retrieval.tokenize`) and the same variant and (k1, b):
- "lucene" (default): idf = log(1 + (N - df + .5) / (df + .5)); reproduces the reference figures.
- "robertson": idf = log((N - df + .5) / (df + .5)) floored at 0 (= BM25Okapi with epsilon=0).
rank_bm25 scores are (k1 + 1) times bm25s's; we divide them back so both report the same numbers.
Metadata filters (`rigkit.retrieval.filters`) zero the scores of the chunks that fail them before
the top list is cut (what bm25s's `weight_mask` does), so a filtered search is exact and full.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rigkit.config import RetrievalConfig
from rigkit.corpus import Chunk
from rigkit.errors import InputError
from rigkit.retrieval.filters import Filters, MasksOwnChunks, parse_filters
from rigkit.retrieval.ranking import Scored, hits_from_scored, top_indices
from rigkit.retrieval.tokenize import tokenize, tokenize_many
from rigkit.trace import Hit

__all__ = ["BM25_BACKENDS", "BM25_METHODS", "BM25Retriever"]

BM25_BACKENDS = ("bm25s", "rank_bm25")
BM25_METHODS = ("lucene", "robertson")


class _Bm25sEngine:
    def __init__(self, model):
        self.model = model

    @classmethod
    def build(cls, tokens: list[list[str]], method: str, k1: float, b: float) -> _Bm25sEngine:
        import bm25s

        model = bm25s.BM25(method=method, k1=k1, b=b)
        model.index(tokens, show_progress=False)
        return cls(model)

    def scores(self, query_tokens: list[str]) -> np.ndarray:
        ids = self.model.get_tokens_ids(query_tokens)
        if not ids:
            return np.zeros(self.model.scores["num_docs"], dtype=np.float32)
        return self.model.get_scores_from_ids(ids)

    def save(self, folder: Path) -> None:
        self.model.save(str(folder), show_progress=False)

    @classmethod
    def load(cls, folder: Path) -> _Bm25sEngine:
        import bm25s

        return cls(bm25s.BM25.load(str(folder), show_progress=False))


class _RankBm25Engine:
    def __init__(self, tokens: list[list[str]], method: str, k1: float, b: float):
        from rank_bm25 import BM25Okapi

        class LuceneOkapi(BM25Okapi):
            """BM25Okapi with Lucene's always-positive idf."""

            def _calc_idf(self, nd):
                for word, freq in nd.items():
                    self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))

        engine = LuceneOkapi if method == "lucene" else BM25Okapi
        # rank_bm25 divides by the token count; an all-stop-word corpus would divide by zero.
        safe = [t if t else [""] for t in tokens] if not any(tokens) else tokens
        self.model = engine(safe, k1=k1, b=b, epsilon=0.0)
        self.k1 = k1

    def scores(self, query_tokens: list[str]) -> np.ndarray:
        return self.model.get_scores(query_tokens) / (self.k1 + 1)


class BM25Retriever(MasksOwnChunks):
    """Lexical retriever over chunks. `search` returns hits ranked by BM25, zero scores dropped."""

    name = "bm25"

    def __init__(
        self, chunks: Sequence[Chunk], engine, backend: str, method: str, k1: float, b: float
    ):
        self.chunks = chunks
        self.engine = engine
        self.backend, self.method, self.k1, self.b = backend, method, k1, b

    @classmethod
    def build(
        cls,
        chunks: Sequence[Chunk],
        backend: str = RetrievalConfig.bm25_backend,
        method: str = RetrievalConfig.bm25_method,
        k1: float = RetrievalConfig.k1,
        b: float = RetrievalConfig.b,
        tokens: list[list[str]] | None = None,
    ) -> BM25Retriever:
        """Index `chunks` (their `index_text`); `tokens` may pass a precomputed tokenisation."""
        if backend not in BM25_BACKENDS:
            raise InputError(f"unknown BM25 backend {backend!r}; choose from {BM25_BACKENDS}")
        if method not in BM25_METHODS:
            raise InputError(f"unknown BM25 method {method!r}; choose from {BM25_METHODS}")
        tokens = tokens if tokens is not None else tokenize_many(c.index_text for c in chunks)
        if backend == "bm25s":
            engine = _Bm25sEngine.build(tokens, method, k1, b)
        else:
            engine = _RankBm25Engine(tokens, method, k1, b)
        return cls(chunks, engine, backend, method, k1, b)

    def save(self, folder: str | Path) -> None:
        if self.backend != "bm25s":
            raise InputError("only the bm25s backend is saved; rank_bm25 is rebuilt from chunks")
        self.engine.save(Path(folder))

    @classmethod
    def load(cls, folder: str | Path, chunks: Sequence[Chunk], method: str, k1: float, b: float):
        return cls(chunks, _Bm25sEngine.load(Path(folder)), "bm25s", method, k1, b)

    def scored(self, query: str, depth: int, filters: Filters | None = None) -> Scored:
        """Scores of every chunk for `query` (shape (n_chunks,)) and the best `depth` non-zero;
        chunks failing `filters` score 0."""
        scores = np.asarray(self.engine.scores(tokenize(query)), dtype=np.float64)
        if filters:
            scores = np.where(self.filter_mask(filters), scores, 0.0)
        ranked = [(int(i), float(scores[i])) for i in top_indices(scores, depth) if scores[i] > 0]
        return Scored(self.name, ranked, full=scores)

    def search(self, query: str, top_k: int = 5, filters=None) -> list[Hit]:
        """Hits best first; `filters` (any form `parse_filters` takes) restricts the chunks."""
        scored = self.scored(query, top_k * 2, parse_filters(filters))  # room for near-duplicates
        return hits_from_scored(scored, self.chunks, top_k)
