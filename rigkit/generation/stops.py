"""Where a segment pauses: the stop rule checked on generated text, shared by every backend."""

from __future__ import annotations

from collections.abc import Sequence

from rigkit.text import SENTENCE_END  # the package's one sentence-end pattern
from rigkit.transcript import StopRule

__all__ = ["SENTENCE_END", "find_stop", "tokens_upto", "segment_end"]


def find_stop(text: str, stop: StopRule) -> int | None:
    """Character offset where a segment of `text` should end, or None if it should go on."""
    ends = []
    if stop.marker_close and stop.marker_close in text:
        ends.append(text.index(stop.marker_close) + len(stop.marker_close))
    if stop.sentence and (m := SENTENCE_END.search(text)):
        ends.append(m.end())
    return min(ends) if ends else None


def tokens_upto(texts: Sequence[str], cut: int) -> int:
    """How many token texts it takes to reach character `cut` (the one holding it included)."""
    seen = 0
    for i, piece in enumerate(texts):
        seen += len(piece)
        if seen >= cut:
            return i + 1
    return len(texts)


def segment_end(texts: Sequence[str], logprobs: Sequence[float], stop: StopRule) -> int | None:
    """How many of the tokens written so far the segment keeps if it should pause now, else None:
    the stop rule on the text, or its `early` rule on the tokens, whichever comes first."""
    ends = []
    cut = find_stop("".join(texts), stop)
    if cut is not None:
        ends.append(tokens_upto(texts, cut))
    if stop.early is not None and (early := stop.early(texts, logprobs)) is not None:
        ends.append(early)
    return min(ends) if ends else None
