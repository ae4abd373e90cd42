"""Finding, stripping and neutralising retrieval markers in text, for any marker protocol.

Two tag grammars:
- word tags (`<retrieve>…</retrieve>`, `<search>…</search>`): models do not always write the tag
  cleanly, so the parser accepts full-width (`＜retrieve＞`) and angle-bracket (`〈retrieve〉`)
  variants, a full-width solidus (`＜／retrieve＞`), spaces inside the tag and any letter case;
- literal tags (`<|begin_of_search|>…<|end_of_search|>`, `[Retrieval]`): usually special tokens
  of a trained checkpoint, matched as written (any letter case). A protocol without a closing
  tag (Self-RAG's `[Retrieval]`) has markers that carry no phrase.

Generation can stop mid-marker at the token limit: an opening tag without its closing tag yields
an unclosed marker (phrase up to the end of text, any partial closing tag removed), and a tag cut
mid-word (`... <retr`) yields an unclosed marker with an empty phrase.

Passages injected into the context are sanitised with `neutralize_markers`, so retrieved text can
never open or close a marker the controller would obey.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple, Union

if TYPE_CHECKING:
    from rigkit.markers.protocol import MarkerProtocol

__all__ = [
    "Marker", "find_markers", "strip_markers", "neutralize_markers", "word_tag", "check_tags",
    "tidy_spacing", "SUBQUERY_SEPARATOR", "split_subqueries",
]

TagSpec = Union[str, "tuple[str, str]", "MarkerProtocol"]  # a word tag ("retrieve"), (open, close) or a protocol

_OPEN_BRACKETS = "<＜〈"
_CLOSE_BRACKETS = ">＞〉"
_SLASHES = "/／"
# A truncated opening tag must show its bracket and at least this many letters of the tag, so
# a lone "<" at the end of a sentence ("x <") is not taken for a marker.
_MIN_PARTIAL_LETTERS = 1
_WORD_TAG = re.compile(r"<([\w-]+)>")
_NEUTRAL_OPEN = "<[{＜〈"
_NEUTRAL_CLOSE = ">]}＞〉"
_WORD_JOINER = "\u2060"  # breaks a literal tag that has no bracket to replace


class Marker(NamedTuple):
    """One marker: character range [start, end) of the whole marker in the text, its phrase."""

    start: int
    end: int
    phrase: str
    closed: bool


class _Grammar(NamedTuple):
    tag_re: re.Pattern[str]  # opening or closing tags; group 1 is set for closing tags
    partial_re: re.Pattern[str]  # a tag cut off at the end of the text
    loose_re: re.Pattern[str] | None  # word tags: a bracket followed by the tag name
    closes: bool  # markers run from an opening to a closing tag and carry a phrase
    close: str  # the literal closing tag ("" for word tags and for protocols without one)


def word_tag(open_tag: str, close_tag: str) -> str | None:
    """The word of a `<word>` / `</word>` pair, or None when the tags are literal ones."""
    match = _WORD_TAG.fullmatch(open_tag)
    return match.group(1) if match and close_tag == f"</{match.group(1)}>" else None


def check_tags(spec: TagSpec) -> None:
    """Raise ValueError when `spec`'s tags cannot be parsed (not a word, empty, padded)."""
    _grammar(spec)


def _grammar(spec: TagSpec) -> _Grammar:
    if isinstance(spec, str):
        return _word_grammar(spec)
    open_tag, close_tag = spec if isinstance(spec, tuple) else (spec.open, spec.close)
    tag = word_tag(open_tag, close_tag)
    return _word_grammar(tag) if tag else _literal_grammar(open_tag, close_tag)


@lru_cache(maxsize=16)
def _word_grammar(tag: str) -> _Grammar:
    if not tag or not re.fullmatch(r"[\w-]+", tag):
        raise ValueError(f"marker tag must be a word, got {tag!r}")
    ob, cb, sl = (re.escape(s) for s in (_OPEN_BRACKETS, _CLOSE_BRACKETS, _SLASHES))
    name = re.escape(tag)
    tag_re = re.compile(rf"[{ob}]\s*([{sl}])?\s*{name}\s*[{cb}]", re.IGNORECASE)
    # an opening or closing tag cut off at the end of the text: "<", "</retr", "<retrieve"
    prefixes = "|".join(re.escape(tag[:i]) for i in range(len(tag), 0, -1))
    partial_re = re.compile(rf"[{ob}]\s*(?:[{sl}]\s*)?(?:{prefixes})?\s*$", re.IGNORECASE)
    # a bracket followed by the tag name, whatever follows: used to neutralise passages
    loose_re = re.compile(rf"[{ob}](?=\s*(?:[{sl}]\s*)?{name})", re.IGNORECASE)
    return _Grammar(tag_re, partial_re, loose_re, True, "")


@lru_cache(maxsize=16)
def _literal_grammar(open_tag: str, close_tag: str) -> _Grammar:
    if not open_tag.strip() or open_tag != open_tag.strip() or close_tag != close_tag.strip():
        raise ValueError(f"marker tags must be non-empty, without surrounding spaces: {open_tag!r}, {close_tag!r}")
    alternatives = [f"(?:{re.escape(open_tag)})"] + ([f"({re.escape(close_tag)})"] if close_tag else [])
    tag_re = re.compile("|".join(alternatives), re.IGNORECASE)
    cuts = {t[:i] for t in (open_tag, close_tag) if t for i in range(1, len(t))}
    prefixes = "|".join(re.escape(c) for c in sorted(cuts, key=len, reverse=True))
    partial_re = re.compile(rf"(?:{prefixes})$", re.IGNORECASE)
    return _Grammar(tag_re, partial_re, None, bool(close_tag), close_tag)


def _partial_tail(text: str, grammar: _Grammar, start: int, min_letters: int = _MIN_PARTIAL_LETTERS) -> int | None:
    """Index where a truncated tag begins at the end of `text[start:]`, or None.

    Inside an open marker (`min_letters=0`) a bare "<" or "</" at the end is a cut closing tag.
    """
    match = grammar.partial_re.search(text, start)
    if match is None:
        return None
    letters = re.sub(r"[\W_]", "", match.group(0))
    if len(letters) < min_letters:
        return None
    return match.start()


def _is_partial_close(fragment: str, grammar: _Grammar) -> bool:
    if grammar.loose_re is not None:
        return any(s in fragment for s in _SLASHES)
    return bool(grammar.close) and grammar.close.lower().startswith(fragment.lower())


def find_markers(text: str, tag: TagSpec = "retrieve") -> list[Marker]:
    """Every marker in `text`, in order; `tag` is a word tag or a `MarkerProtocol`.

    A new opening tag before a closing one ends the previous marker (unclosed). Stray closing
    tags are ignored here (`strip_markers` removes them).
    """
    grammar = _grammar(tag)
    if not grammar.closes:
        return _single_token_markers(text, grammar)
    markers: list[Marker] = []
    open_at: int | None = None  # start of the current marker's opening tag
    phrase_at = 0
    for match in grammar.tag_re.finditer(text):
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
        cut = _partial_tail(text, grammar, phrase_at, min_letters=0)
        end_of_phrase = cut if cut is not None else len(text)
        markers.append(Marker(open_at, len(text), text[phrase_at:end_of_phrase].strip(), False))
    else:
        last_end = markers[-1].end if markers else 0
        cut = _partial_tail(text, grammar, last_end)
        if cut is not None and not _is_partial_close(text[cut:], grammar):
            markers.append(Marker(cut, len(text), "", False))
    return markers


def _single_token_markers(text: str, grammar: _Grammar) -> list[Marker]:
    """A protocol whose marker is one token (Self-RAG's `[Retrieval]`): no phrase to read."""
    markers = [Marker(m.start(), m.end(), "", True) for m in grammar.tag_re.finditer(text)]
    cut = _partial_tail(text, grammar, markers[-1].end if markers else 0)
    if cut is not None:
        markers.append(Marker(cut, len(text), "", False))
    return markers


def strip_markers(text: str, tag: TagSpec = "retrieve") -> str:
    """The answer text with every marker (tags and phrase), stray tag and cut-off tag removed."""
    grammar = _grammar(tag)
    pieces: list[str] = []
    cursor = 0
    for marker in find_markers(text, tag):
        pieces.append(text[cursor : marker.start])
        cursor = marker.end
    pieces.append(text[cursor:])
    out = grammar.tag_re.sub("", "".join(pieces))  # stray closing tags
    cut = _partial_tail(out, grammar, 0)
    if cut is not None:
        out = out[:cut]
    return tidy_spacing(out)


# ParallelSearch's notation for several searches in one marker: <search>q1 ## q2</search>
SUBQUERY_SEPARATOR = "##"
_SUBQUERY_SPLIT = re.compile(r"\s*(?:##|＃＃)\s*")  # the full-width form too


def split_subqueries(phrase: str) -> list[str]:
    """A marker phrase's searches, split on `##` (or `＃＃`): stripped, empty ones left out."""
    return [part.strip() for part in _SUBQUERY_SPLIT.split(phrase) if part.strip()]


def tidy_spacing(text: str) -> str:
    """Collapse the double spaces and space-before-punctuation that removing a marker leaves."""
    text = re.sub(r"[ \t]{2,}", " ", text)
    text = re.sub(r"[ \t]+([,.;:!?，。；：！？])", r"\1", text)
    return text.strip()


def neutralize_markers(text: str, tag: TagSpec = "retrieve") -> str:
    """`text` in which no marker can open or close, even when more text is appended.

    Word tags: every bracket that starts something tag-like (`<retrieve`, `＜／retr`,
    `〈 retrieve`) becomes "(", and its closing bracket ")". Literal tags lose their brackets the
    same way (`<|end_of_search|>` -> `(|end_of_search|)`, `[Retrieval]` -> `(Retrieval)`), and so
    do a protocol's result tags (`</information>`). Other text, including ordinary "<" and ">",
    is unchanged.
    """
    if getattr(tag, "results_open", ""):
        # inline results: a passage must not close its own block either
        text = _neutralize(text, _grammar((tag.results_open, tag.results_close)))
    return _neutralize(text, _grammar(tag))


def _neutralize(text: str, grammar: _Grammar) -> str:
    # Whole tags first so their closing bracket goes too, then anything tag-shaped left over,
    # then a tag cut off at the very end (text appended later could complete it).
    text = grammar.tag_re.sub(lambda m: _neutral(m.group(0)), text)
    if grammar.loose_re is not None:
        text = grammar.loose_re.sub("(", text)
    cut = _partial_tail(text, grammar, 0)
    return text if cut is None else text[:cut] + _neutral(text[cut:], whole=False)


def _neutral(tag_text: str, whole: bool = True) -> str:
    """A tag (or the cut-off start of one) that no longer parses as a tag."""
    head, rest = tag_text[0], tag_text[1:]
    if head not in _NEUTRAL_OPEN:
        return head + _WORD_JOINER + rest
    if whole and rest and rest[-1] in _NEUTRAL_CLOSE:
        return "(" + rest[:-1] + ")"
    return "(" + rest
