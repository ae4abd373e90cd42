"""Cutting a text to a token budget without emptying it, in any script.

A cut at spaces alone empties Chinese text, which has none: a whole paragraph is one "word" and
its longest prefix within the budget is nothing. Cut points are therefore the spaces where the
text has them and every character boundary inside runs of CJK characters; among them the longest
prefix within the budget wins, moved back to a sentence end (。！？ . ! ?) when one lies in its
last fifth so the passage ends on a whole sentence. Token counts are assumed to grow with the
prefix (true of BPE tokenizers up to a token at the seam), so the longest fitting cut is found by
bisection: O(log n) counts per cut.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from rigkit.text import CJK

__all__ = ["cut_points", "cap_text"]

_CUT = re.compile(rf"(?<=[{CJK}\u3000-\u303f\uff00-\uffef])|(?=[{CJK}])|(?=\s)")
_SENTENCE_END = re.compile(r"[。！？]|[.!?](?=\s)")
_NEAR = 0.2  # a sentence end in the kept prefix's last fifth is near enough to cut at


def cut_points(text: str) -> list[int]:
    """Ascending offsets where `text` may be cut: before each space, and around CJK characters."""
    points = sorted({m.start() for m in _CUT.finditer(text)} - {0})
    return [p for p in points if p < len(text)]


def cap_text(text: str, limit: int, count: Callable[[str], int], note: str = " …") -> str:
    """`text` if it has at most `limit` tokens, else its longest cut prefix that fits with `note`.

    `note` marks the cut (" …" for a passage, " … [truncated]" for a tool result); it follows
    Chinese text without the space. A text with no cut point inside the budget (one very long
    word) falls back to its longest character prefix, so nothing is ever cut to the note alone
    while a character would fit.
    """
    if count(text) <= limit:
        return text
    points = cut_points(text)

    def ending(cut: int) -> str:
        return note.lstrip() if re.match(rf"[{CJK}\u3000-\u303f\uff00-\uffef]", text[cut - 1]) else note

    def fits(cut: int) -> bool:
        return count(text[:cut].rstrip() + ending(cut)) <= limit

    best = _longest(points, fits)
    if best is None:  # no cut point fits: a character prefix of the first word
        best = _longest(list(range(1, len(text))), fits)
        if best is None:
            return note.strip()
    ends = [m.end() for m in _SENTENCE_END.finditer(text, 0, best)]
    if ends and ends[-1] >= best * (1 - _NEAR):
        best = ends[-1]
    return text[:best].rstrip() + ending(best)


def _longest(points: list[int], fits: Callable[[int], bool]) -> int | None:
    """The largest point with `fits(point)`, by bisection; None when none fits."""
    lo, hi = 0, len(points)  # points[:lo] fit (assumed monotone)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(points[mid - 1]):
            lo = mid
        else:
            hi = mid - 1
    return points[lo - 1] if lo else None
