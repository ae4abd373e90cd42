"""The transcript the generator reads: an append-only list of pieces.

Text pieces (chat-template scaffolding, the question, injected passages) are tokenised by the
generator; generated pieces keep the model's own token ids, so nothing it wrote is ever
re-tokenised differently. Because rounds only append pieces, the generator can keep its KV cache
and pre-fill just the new ones.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Piece", "StopRule"]


@dataclass(frozen=True)
class Piece:
    """A run of prompt text; `token_ids` is set for text the model generated itself."""

    text: str
    token_ids: tuple[int, ...] | None = None
    role: str = "scaffold"  # system | question | passages | draft | scaffold (for the budget)


@dataclass(frozen=True)
class StopRule:
    """When a segment pauses: at a sentence end, and/or after a marker's closing tag."""

    sentence: bool = True
    marker_close: str | None = None  # e.g. "</retrieve>"
