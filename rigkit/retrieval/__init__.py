"""Hybrid retrieval for RIG: BM25 + dense vectors fused by Reciprocal Rank Fusion, saved indexes.

`open_retriever(config)` is what the RIG loop calls; `Index.build` / `Index.load` manage saved
indexes (vectors in faiss, or in a Milvus collection: `MilvusRetriever`); the three retrievers can
also be built directly from a chunk list. A `Reranker` (cross-encoder, or the generator's own
query likelihood) reorders a retriever's candidates behind `RerankedRetriever`.
"""

from __future__ import annotations

from rigkit.retrieval.base import NoRetriever, Retriever, ScoresChunks
from rigkit.retrieval.bm25 import BM25Retriever
from rigkit.retrieval.dense import DenseRetriever
from rigkit.retrieval.factory import RETRIEVERS, demo_corpus_path, open_index, open_retriever
from rigkit.retrieval.hybrid import HybridRetriever, rrf_scores
from rigkit.retrieval.index import Index
from rigkit.retrieval.milvus import MilvusRetriever
from rigkit.retrieval.rerank import (
    CrossEncoderReranker,
    QueryLikelihoodReranker,
    RerankedRetriever,
    Reranker,
)

__all__ = [
    "Retriever",
    "ScoresChunks",
    "NoRetriever",
    "RETRIEVERS",
    "Index",
    "open_retriever",
    "open_index",
    "demo_corpus_path",
    "BM25Retriever",
    "DenseRetriever",
    "MilvusRetriever",
    "HybridRetriever",
    "rrf_scores",
    "Reranker",
    "RerankedRetriever",
    "QueryLikelihoodReranker",
    "CrossEncoderReranker",
]
