"""The `Retriever` extension point: `search(query, top_k) -> list[Hit]`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from rigkit.trace import Hit

__all__ = ["Retriever"]


@runtime_checkable
class Retriever(Protocol):
    """Ranked hits for a query, best first."""

    def search(self, query: str, top_k: int = 5) -> list[Hit]: ...
