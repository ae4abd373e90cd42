"""Retrieval markers: `<retrieve>phrase</retrieve>` written by the model itself (Toolformer /
Self-RAG style "ask when you need it").

Models do not always write the tag cleanly, so the parser accepts full-width (`＜retrieve＞`) and
angle-bracket (`〈retrieve〉`) variants, a full-width solidus (`＜／retrieve＞`), spaces inside the
tag and any letter case. Generation can stop mid-marker at the token limit: an opening tag
without its closing tag yields an unclosed marker (phrase up to the end of text, any partial
closing tag removed), and a tag cut mid-word (`... <retr`) yields an unclosed marker with an empty
phrase.

Passages injected into the context are sanitised with `neutralize_markers`, so retrieved text
can never open or close a marker the controller would obey.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

__all__ = ["Marker", "find_markers", "strip_markers", "neutralize_markers"]

_OPEN_BRACKETS = "<＜〈"
_CLOSE_BRACKETS = ">＞〉"
_SLASHES = "/／"
# A truncated opening tag must show its bracket and at least this many letters of the tag, so
# a lone "<" at the end of a sentence ("x <") is not taken for a marker.
_MIN_PARTIAL_LETTERS = 1


class Marker(NamedTuple):
    """One marker: character range [start, end) of the whole marker in the text, its phrase."""

    start: int
    end: int
    phrase: str
    closed: bool


@lru_cache(maxsize=16)
def _patterns(tag: str) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    if not tag or not re.fullmatch(r"[\w-]+", tag):
        raise ValueError(f"marker tag must be a word, got {tag!r}")
    ob, cb, sl = (re.escape(s) for s in (_OPEN_BRACKETS, _CLOSE_BRACKETS, _SLASHES))
    name = re.escape(tag)
    # group 1 is set for closing tags
    tag_re = re.compile(rf"[{ob}]\s*([{sl}])?\s*{name}\s*[{cb}]", re.IGNORECASE)
    # an opening or closing tag cut off at the end of the text: "<", "</retr", "<retrieve"
    prefixes = "|".join(re.escape(tag[:i]) for i in range(len(tag), 0, -1))
    partial_re = re.compile(rf"[{ob}]\s*(?:[{sl}]\s*)?(?:{prefixes})?\s*$", re.IGNORECASE)
    # a bracket followed by the tag name, whatever follows: used to neutralise passages
    loose_re = re.compile(rf"[{ob}](?=\s*(?:[{sl}]\s*)?{name})", re.IGNORECASE)
    return tag_re, partial_re, loose_re


def _partial_tail(text: str, tag: str, start: int, min_letters: int = _MIN_PARTIAL_LETTERS) -> int | None:
    """Index where a truncated tag begins at the end of `text[start:]`, or None.

    Inside an open marker (`min_letters=0`) a bare "<" or "</" at the end is a cut closing tag.
    """
    _, partial_re, _ = _patterns(tag)
    match = partial_re.search(text, start)
    if match is None:
        return None
    letters = re.sub(r"[\W_]", "", match.group(0))
    if len(letters) < min_letters:
        return None
    return match.start()


def find_markers(text: str, tag: str = "retrieve") -> list[Marker]:
    """Every marker in `text`, in order.

    A new opening tag before a closing one ends the previous marker (unclosed). Stray closing
    tags are ignored here (`strip_markers` removes them).
    """
    tag_re, _, _ = _patterns(tag)
    markers: list[Marker] = []
    open_at: int | None = None  # start of the current marker's opening tag
    phrase_at = 0
    for match in tag_re.finditer(text):
        is_close = match.group(1) is not None
        if open_at is not None:
            phrase = text[phrase_at : match.start()].strip()
            if is_close:
                markers.append(Marker(open_at, match.end(), phrase, True))
                open_at = None
                continue
            markers.append(Marker(open_at, match.start(), phrase, False))
            open_at = None
        if not is_close:
            open_at, phrase_at = match.start(), match.end()
    if open_at is not None:
        cut = _partial_tail(text, tag, phrase_at, min_letters=0)
        end_of_phrase = cut if cut is not None else len(text)
        markers.append(Marker(open_at, len(text), text[phrase_at:end_of_phrase].strip(), False))
    else:
        last_end = markers[-1].end if markers else 0
        cut = _partial_tail(text, tag, last_end)
        if cut is not None and not _is_partial_close(text[cut:]):
            markers.append(Marker(cut, len(text), "", False))
    return markers


def _is_partial_close(fragment: str) -> bool:
    return any(s in fragment for s in _SLASHES)


def strip_markers(text: str, tag: str = "retrieve") -> str:
    """The answer text with every marker (tags and phrase), stray tag and cut-off tag removed."""
    tag_re, _, _ = _patterns(tag)
    pieces: list[str] = []
    cursor = 0
    for marker in find_markers(text, tag):
        pieces.append(text[cursor : marker.start])
        cursor = marker.end
    pieces.append(text[cursor:])
    out = tag_re.sub("", "".join(pieces))  # stray closing tags
    cut = _partial_tail(out, tag, 0)
    if cut is not None:
        out = out[:cut]
    return _tidy(out)


def _tidy(text: str) -> str:
    """Collapse the double spaces and space-before-punctuation that removing a marker leaves."""
    text = re.sub(r"[ \t]{2,}", " ", text)
    text = re.sub(r"[ \t]+([,.;:!?，。；：！？])", r"\1", text)
    return text.strip()


def neutralize_markers(text: str, tag: str = "retrieve") -> str:
    """`text` in which no marker can open or close, even when more text is appended.

    Every bracket that starts something tag-like (`<retrieve`, `＜／retr`, `〈 retrieve`) becomes
    "(", and its closing bracket ")". Other text, including ordinary "<" and ">", is unchanged.
    """
    tag_re, _, loose_re = _patterns(tag)
    # Whole tags first so their closing bracket goes too, then anything tag-shaped left over,
    # then a tag cut off at the very end (text appended later could complete it).
    text = tag_re.sub(lambda m: "(" + m.group(0)[1:-1] + ")", text)
    text = loose_re.sub("(", text)
    cut = _partial_tail(text, tag, 0)
    return text if cut is None else text[:cut] + "(" + text[cut + 1 :]
