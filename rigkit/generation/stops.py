"""Where a segment pauses: the stop rule checked on generated text, shared by every backend."""

from __future__ import annotations

from rigkit.text import SENTENCE_END  # the package's one sentence-end pattern
from rigkit.transcript import StopRule

__all__ = ["SENTENCE_END", "find_stop"]


def find_stop(text: str, stop: StopRule) -> int | None:
    """Character offset where a segment of `text` should end, or None if it should go on."""
    ends = []
    if stop.marker_close and stop.marker_close in text:
        ends.append(text.index(stop.marker_close) + len(stop.marker_close))
    if stop.sentence and (m := SENTENCE_END.search(text)):
        ends.append(m.end())
    return min(ends) if ends else None
