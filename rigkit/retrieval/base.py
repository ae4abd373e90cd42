"""The `Retriever` extension point: `search(query, top_k) -> list[Hit]`.

Built-in retrievers also score every chunk of their chunk list (`ScoresChunks`), which lets a
hybrid show a chunk's exact rank in a retriever that did not list it. Any other retriever is
fused by the chunk ids of its hits.

Metadata filters: the built-in retrievers take `search(query, top_k, filters=...)` (any form
`rigkit.retrieval.filters.parse_filters` reads) and filter before `top_k` is cut. A retriever of
your own needs no `filters` parameter until someone filters: then it is a clear error.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rigkit.trace import Hit

if TYPE_CHECKING:
    from rigkit.corpus import Chunk
    from rigkit.retrieval.filters import Filters
    from rigkit.retrieval.ranking import Scored

__all__ = ["Retriever", "ScoresChunks", "NoRetriever", "layers"]


@runtime_checkable
class Retriever(Protocol):
    """Ranked hits for a query, best first."""

    def search(self, query: str, top_k: int = 5) -> list[Hit]: ...


@runtime_checkable
class ScoresChunks(Protocol):
    """A retriever over a chunk list that can score any of its chunks (BM25, dense)."""

    chunks: Sequence[Chunk]

    def scored(self, query: str, depth: int, filters: Filters | None = None) -> Scored:
        """Its best `depth` chunks passing `filters`, and the exact rank / score of any other."""
        ...


class NoRetriever:
    """Finds nothing: the retriever of closed-book and fixed-passage runs, which never search."""

    name = "none"

    def search(self, query: str, top_k: int = 5) -> list[Hit]:
        return []


def layers(retriever: Any) -> Iterator[Any]:
    """`retriever`, then each retriever it wraps, outermost first: a wrapper (filters, a reranker,
    the served index's fair turns) keeps the one it wraps in `inner`, so what it wraps shows through."""
    seen: set[int] = set()
    while retriever is not None and id(retriever) not in seen:
        seen.add(id(retriever))
        yield retriever
        retriever = getattr(retriever, "inner", None)
