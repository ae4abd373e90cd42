"""Reranking: a second, slower look at a retriever's candidates before `top_k` are kept.

The `Reranker` extension point is one verb, `rerank(query, hits) -> hits best first`.
`RerankedRetriever` asks its inner retriever for `candidates` hits, removes near-duplicates
(cosine > 0.95 under the embedder, else the context manager's word fingerprint), reranks the
rest and keeps `top_k`; every hit records where it stood (`ranks["before_rerank"]`), where it
landed (`ranks["rerank"]`) and its rerank score (`scores["rerank"]`, also `hit.score`).

Two rerankers:
- `CrossEncoderReranker`: a sentence-transformers `CrossEncoder` reads query and passage
  together (any hub cross-encoder by name, e.g. cross-encoder/ms-marco-MiniLM-L6-v2, online).
- `QueryLikelihoodReranker`: UPR (Sachan et al., "Improving Passage Retrieval with Zero-Shot
  Question Generation", EMNLP 2022): the run's own generator scores each passage by the mean
  log-probability of the query's tokens after "Passage: ...  Please write a question based on
  this passage.  Question:". It needs no extra weights, which makes it the offline default
  (no installable package ships cross-encoder weights). Concession: one forward pass per
  candidate (batched), so it costs about `candidates` passage pre-fills per search.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from rigkit.config import RetrievalConfig
from rigkit.errors import InputError
from rigkit.retrieval.base import Retriever, layers
from rigkit.retrieval.filters import check_accepts, parse_filters, search_filtered
from rigkit.trace import Hit

__all__ = [
    "Reranker",
    "ScoresContinuations",
    "RerankedRetriever",
    "QueryLikelihoodReranker",
    "CrossEncoderReranker",
    "UPR_PROMPT",
    "drop_near_duplicates",
    "reranker_from_config",
    "embedder_of",
]

UPR_PROMPT = "Passage: {title}. {text}\nPlease write a question based on this passage.\nQuestion:"
DUPLICATE_COSINE = 0.95  # candidates this similar to a better-ranked one are the same passage


@runtime_checkable
class Reranker(Protocol):
    """Candidates for `query` in a new order, best first (a subset is allowed)."""

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]: ...


@runtime_checkable
class ScoresContinuations(Protocol):
    """A generator that scores text after a prompt (mean log-probability per token)."""

    def score_continuations(
        self, prompts: Sequence[str], continuations: Sequence[str], batch_size: int = 8,
    ) -> list[float]: ...


def ranked_by(hits: Sequence[Hit], scores: Sequence[float]) -> list[Hit]:
    """`hits` sorted by `scores` (high first, ties in their given order), each with `scores["rerank"]`."""
    order = sorted(range(len(hits)), key=lambda i: -scores[i])
    return [dataclasses.replace(hits[i], scores={**hits[i].scores, "rerank": float(scores[i])})
            for i in order]


class QueryLikelihoodReranker:
    """UPR: log p(query | passage) under the generator, no extra weights."""

    name = "upr"

    def __init__(self, generator: Any, batch_size: int = 8, max_passage_chars: int = 600,
                 prompt: str = UPR_PROMPT):
        if not isinstance(generator, ScoresContinuations):
            raise InputError(
                f"rerank 'upr' needs a generator that scores text, which {type(generator).__name__} "
                f"({getattr(generator, 'spec', '?')}) cannot; use an in-process model or a "
                "cross-encoder (retrieval.rerank: cross-encoder/ms-marco-MiniLM-L6-v2)"
            )
        self.generator, self.batch_size = generator, batch_size
        self.max_passage_chars, self.prompt = max_passage_chars, prompt

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        if not hits:
            return []
        prompts = [self.prompt.format(title=h.title, text=h.text[: self.max_passage_chars].strip())
                   for h in hits]
        scores = self.generator.score_continuations(
            prompts, [" " + query.strip()] * len(hits), batch_size=self.batch_size)
        return ranked_by(hits, scores)


class CrossEncoderReranker:
    """A sentence-transformers cross-encoder over (query, title + passage) pairs."""

    name = "cross-encoder"

    def __init__(self, model: str, batch_size: int = 16, device: str | None = None):
        self.model_name, self.batch_size, self.device = model, batch_size, device
        self._model: Any = None

    @property
    def model(self) -> Any:
        if self._model is None:  # loaded on first use: building a run stays cheap
            try:
                from sentence_transformers import CrossEncoder
            except ImportError as err:
                raise InputError("a cross-encoder reranker needs sentence-transformers: "
                                 "pip install sentence-transformers") from err
            try:
                self._model = CrossEncoder(self.model_name, device=self.device)
            except OSError as err:
                raise InputError(
                    f"rerank {self.model_name!r}: not a cross-encoder this machine can load ({err}); "
                    "name a hub cross-encoder (online) or a local folder, or use retrieval.rerank: upr"
                ) from err
        return self._model

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        if not hits:
            return []
        pairs = [(query, f"{h.title}. {h.text}") for h in hits]
        scores = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
        return ranked_by(hits, [float(s) for s in scores])


def drop_near_duplicates(
    hits: Sequence[Hit], embed: Callable[[list[str]], Any] | None = None,
    threshold: float = DUPLICATE_COSINE,
) -> list[Hit]:
    """Hits without the near-duplicates of a better-ranked one; a kept hit lists what it absorbed
    in `metadata["near_duplicates"]`. `embed(texts) -> (n, dim)` unit vectors (cosine > threshold);
    without it, the context manager's word fingerprint decides."""
    if len(hits) < 2:
        return list(hits)
    if embed is not None:
        vectors = embed([h.text for h in hits])  # (n, dim), normalised
        same = lambda i, j: float(vectors[i] @ vectors[j]) > threshold  # noqa: E731
    else:
        from rigkit.context import fingerprint, near_duplicate

        prints = [fingerprint(h.text) for h in hits]
        same = lambda i, j: near_duplicate(prints[i], prints[j])  # noqa: E731
    kept: list[int] = []
    absorbed: dict[int, list[str]] = {}
    for i in range(len(hits)):
        into = next((k for k in kept if same(k, i)), None)
        if into is None:
            kept.append(i)
        else:
            absorbed.setdefault(into, []).append(hits[i].chunk_id)
    return [dataclasses.replace(hits[k], metadata={**hits[k].metadata, "near_duplicates": absorbed[k]})
            if k in absorbed else hits[k] for k in kept]


class RerankedRetriever:
    """`inner`'s best `candidates` hits, near-duplicates removed, reranked, `top_k` kept."""

    name = "rerank"

    def __init__(self, inner: Retriever, reranker: Reranker,
                 candidates: int = RetrievalConfig.rerank_candidates,
                 embed: Callable[[list[str]], Any] | None = None):
        if candidates < 1:
            raise InputError("rerank_candidates must be at least 1")
        self.inner, self.reranker, self.candidates, self.embed = inner, reranker, candidates, embed

    def search(self, query: str, top_k: int = 5, filters: Any = None) -> list[Hit]:
        """Filters, when given, narrow the candidates before the rerank (the inner retriever
        applies them)."""
        found = search_filtered(self.inner, query, max(self.candidates, top_k), parse_filters(filters))
        return self.rerank(query, found, top_k)

    @property
    def search_many(self) -> Callable[..., list[list[Hit]]]:
        """Batched search, present exactly when the inner retriever has it (one inner call)."""
        many = getattr(self.inner, "search_many", None)
        if many is None:
            raise AttributeError(f"{type(self.inner).__name__} has no search_many")

        def search_many(queries: list[str], top_k: int = 5, filters: Any = None) -> list[list[Hit]]:
            filters = parse_filters(filters)
            if filters:
                check_accepts(many)
            found = many(list(queries), max(self.candidates, top_k), **({"filters": filters} if filters else {}))
            return [self.rerank(q, hits, top_k) for q, hits in zip(queries, found)]

        return search_many

    def rerank(self, query: str, hits: Sequence[Hit], top_k: int) -> list[Hit]:
        """`hits` (the inner's order) deduplicated, reranked, cut to `top_k`, ranks recorded."""
        before = [dataclasses.replace(h, ranks={**h.ranks, "before_rerank": place})
                  for place, h in enumerate(hits, start=1)]
        reranked = self.reranker.rerank(query, drop_near_duplicates(before, self.embed))[:top_k]
        return [
            dataclasses.replace(h, ranks={**h.ranks, "rerank": place},
                                score=float(h.scores.get("rerank", h.score)))
            for place, h in enumerate(reranked, start=1)
        ]


def embedder_of(retriever: Retriever) -> Callable[[list[str]], Any] | None:
    """`texts -> unit vectors` with the dense model `retriever` already holds (itself or a hybrid
    member), or None: deduplication then falls back to word fingerprints."""
    from rigkit.retrieval.dense import EmbedsQueries, embed_texts

    for layer in layers(retriever):  # through the wrappers: filters, a reranker, the served index's turns
        for member in getattr(layer, "retrievers", {"self": layer}).values():
            if isinstance(member, EmbedsQueries):  # its model loads on first use, not here
                return lambda texts, m=member: embed_texts(m.embedder, texts)
    return None


def reranker_from_config(config: RetrievalConfig, generator: Any = None) -> Reranker | None:
    """The reranker `retrieval.rerank` names: None for "none", UPR over `generator` for "upr",
    otherwise a cross-encoder of that name or path."""
    name = (config.rerank or "none").strip()
    if name == "none":
        return None
    if name == "upr":
        if generator is None:
            raise InputError("rerank 'upr' scores passages with the generator; none was given "
                             "(build the run with its generator, or name a cross-encoder)")
        return QueryLikelihoodReranker(generator)
    return CrossEncoderReranker(name)
