"""Text helpers shared by the deciders and query builders: words, stop words, facts, entities.

Token-level deciders (FLARE, DRAGIN) judge *tokens* but must skip stop words and punctuation,
which are properties of *words*. So a segment's tokens are aligned to character offsets in its
text, words are found in the text (Latin/digit runs; Chinese through jieba, loaded on first use),
and each token is mapped to the words it overlaps. Fact-shaped strings (numbers, dates, codes,
proper names) and question entities are found by regular expressions plus jieba's part-of-speech
tags for Chinese names: no NER model, a deliberate concession to "runs anywhere".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from rigkit.trace import Hit, Segment, Span

__all__ = [
    "Word",
    "load_word_list",
    "stop_words",
    "is_stop",
    "has_cjk",
    "split_words",
    "token_offsets",
    "token_words",
    "spans_from_tokens",
    "fact_words",
    "question_entities",
    "key_terms",
    "mentions",
    "passage_mentions",
    "char_span",
    "count_query_units",
]

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff"
_CJK_RUN = re.compile(f"[{_CJK}]+")
# Latin/digit words may hold inner - . ' ’ / ("Apache-2.0", "don't"); never CJK characters.
_LATIN = f"(?:(?![{_CJK}])[^\\W_])"
_WORD_RE = re.compile(f"[{_CJK}]+|{_LATIN}+(?:[-.'’/]{_LATIN}+)*")
_NAME_POS = {"nr", "nrt", "nrfg", "ns", "nt", "nz"}  # jieba: person, place, organisation, other


class Word(NamedTuple):
    """A word at characters [start, end) of its text; `kind` is set by `fact_words`."""

    start: int
    end: int
    text: str
    kind: str = "word"


def load_word_list(name_or_path: str | Path) -> list[str]:
    """A one-per-line list (`#` comments) from rigkit/resources/<name>.txt or a file path."""
    path = Path(name_or_path)
    if path.suffix == ".txt" and path.exists():
        text = path.read_text(encoding="utf-8")
    else:
        text = (resources.files("rigkit") / "resources" / f"{name_or_path}.txt").read_text(
            encoding="utf-8"
        )
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@lru_cache(maxsize=4)
def stop_words(lang: str = "en") -> frozenset[str]:
    return frozenset(w.lower() for w in load_word_list(f"stopwords_{lang}"))


def is_stop(word: str) -> bool:
    """True for stop words in English or Chinese (apostrophes normalised)."""
    lowered = word.lower().replace("’", "'")
    return lowered in stop_words("en") or lowered in stop_words("zh")


def has_cjk(text: str) -> bool:
    return _CJK_RUN.search(text) is not None


@lru_cache(maxsize=1)
def _jieba():
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)  # its dictionary-loading banner is noise on stderr
    return jieba


def _cjk_words(run: str) -> list[str]:
    try:
        return _jieba().lcut(run, HMM=True)
    except ImportError:  # jieba is a dependency, but degrade to characters rather than fail
        return list(run)


def split_words(text: str) -> list[Word]:
    """Words of `text` with character offsets; punctuation and spaces are not words."""
    words: list[Word] = []
    for match in _WORD_RE.finditer(text):
        if _CJK_RUN.fullmatch(match.group(0)):
            pos = match.start()
            for piece in _cjk_words(match.group(0)):
                words.append(Word(pos, pos + len(piece), piece))
                pos += len(piece)
        else:
            words.append(Word(match.start(), match.end(), match.group(0)))
    return words


def _clean_piece(token: str) -> str:
    # Byte-level BPE shows spaces/newlines as Ġ/Ċ, SentencePiece as ▁; partial UTF-8 as U+FFFD.
    return token.replace("Ġ", " ").replace("Ċ", "\n").replace("▁", " ").replace("\ufffd", "")


def token_offsets(segment: Segment) -> list[tuple[int, int]]:
    """Character range [start, end) of each token in `segment.text`.

    Exact when the tokens concatenate to the text; otherwise each token is searched from the
    previous one's end, and tokens that cannot be placed (a CJK character split over two byte
    tokens decodes to U+FFFD) share the gap up to the next placed token.
    """
    text, tokens = segment.text, segment.tokens
    if "".join(tokens) == text:
        offsets, pos = [], 0
        for tok in tokens:
            offsets.append((pos, pos + len(tok)))
            pos += len(tok)
        return offsets
    offsets: list[tuple[int, int]] = []
    pending: list[int] = []  # tokens waiting for the next placed token
    cursor = 0
    for i, tok in enumerate(tokens):
        piece = _clean_piece(tok).strip()
        found = text.find(piece, cursor) if piece else -1
        if found < 0:
            offsets.append((cursor, cursor))
            pending.append(i)
            continue
        for j in pending:
            offsets[j] = (cursor, found)
        pending = []
        offsets.append((found, found + len(piece)))
        cursor = found + len(piece)
    for j in pending:
        offsets[j] = (cursor, len(text))
    return offsets


def token_words(segment: Segment, words: Sequence[Word] | None = None) -> list[list[int]]:
    """For each token, the indices of the words (from `split_words`) it overlaps."""
    words = split_words(segment.text) if words is None else words
    result: list[list[int]] = []
    for start, end in token_offsets(segment):
        hit = [k for k, w in enumerate(words) if w.start < end and start < w.end]
        if not hit and start == end:  # zero-width token: the word around its position
            hit = [k for k, w in enumerate(words) if w.start <= start < w.end]
        result.append(hit)
    return result


def spans_from_tokens(
    segment: Segment, flagged: Iterable[int], token_scores: Sequence[float]
) -> list[Span]:
    """Spans covering the whole words of the flagged tokens; adjacent words merge.

    Each span reaches word boundaries (masking half of "Paris" would leave "Par"), records the
    token range, character range and the largest score of its tokens.
    """
    words = split_words(segment.text)
    tok_words = token_words(segment, words)
    chosen = sorted({k for i in flagged for k in tok_words[i] if not is_stop(words[k].text)})
    groups: list[list[int]] = []
    for k in chosen:
        if groups and _adjacent(segment.text, words[groups[-1][-1]], words[k]):
            groups[-1].append(k)
        else:
            groups.append([k])
    spans = []
    for group in groups:
        c0, c1 = words[group[0]].start, words[group[-1]].end
        toks = [i for i, ks in enumerate(tok_words) if any(k in group for k in ks)]
        score = max((token_scores[i] for i in toks), default=0.0)
        spans.append(Span(toks[0], toks[-1] + 1, segment.text[c0:c1], score, c0, c1))
    return spans


def _adjacent(text: str, left: Word, right: Word) -> bool:
    return text[left.end : right.start].strip(" -") == ""


_MONTHS = (
    "January|February|March|April|May|June|July|August|September|October|November|December"
    "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)
_DATE_RE = re.compile(
    rf"(?<![A-Za-z0-9])(?:\d{{1,2}}\s+(?:{_MONTHS})\.?(?:,?\s+\d{{4}})?"
    rf"|(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?|\d{{4}}-\d{{2}}-\d{{2}})"
    r"(?![A-Za-z0-9])"
    r"|\d{2,4}年(?:\d{1,2}月)?(?:\d{1,2}日)?|\d{1,2}月\d{1,2}日"
)
_NUMBER_RE = re.compile(r"(?<![A-Za-z0-9.])\d+(?:[.,]\d+)*%?")
# letters and digits mixed ("KL320", "GPT-4", "A100"), or an acronym ("NASA")
_CODE_RE = re.compile(
    r"(?<![A-Za-z0-9-])(?=[A-Za-z0-9-]*[A-Za-z])(?=[A-Za-z0-9-]*\d)"
    r"[A-Za-z0-9]+(?:[-.][A-Za-z0-9]+)*(?![A-Za-z0-9-])"
)
_ACRONYM_RE = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2,}(?![A-Za-z0-9])")
_NAME_RE = re.compile(
    r"\b[A-Z][\w'’-]*(?:\s+(?:(?:of|the|de|von|van|da|del|and)\s+)?[A-Z][\w'’-]*)*"
)
_TITLE_RE = re.compile(r"《([^》]+)》|“([^”]{2,40})”|\"([^\"]{2,40})\"")
_SENTENCE_START = re.compile(r"(?:^|[.!?。！？:]\s+|\n)\s*$")


def fact_words(text: str) -> list[Word]:
    """Fact-shaped strings in `text`: dates, numbers, codes and proper names, left to right.

    A capitalised word that opens a sentence counts as a name only when another capitalised
    word follows it ("Albert Einstein"), since "Paris" and "The" look alike there.
    """
    found: list[Word] = []
    taken: list[tuple[int, int]] = []

    def add(start: int, end: int, kind: str) -> None:
        value = text[start:end].strip()
        if not value or any(s < end and start < e for s, e in taken):
            return
        taken.append((start, end))
        found.append(Word(start, end, value, kind))

    for m in _DATE_RE.finditer(text):
        add(m.start(), m.end(), "date")
    for m in _CODE_RE.finditer(text):
        add(m.start(), m.end(), "code")
    for m in _NUMBER_RE.finditer(text):
        add(m.start(), m.end(), "number")
    for m in _TITLE_RE.finditer(text):
        g = next(i for i in (1, 2, 3) if m.group(i))
        add(m.start(g), m.end(g), "title")
    for m in _NAME_RE.finditer(text):
        start, end = _trim_stop_words(text, m.start(), m.end())
        if start >= end:
            continue
        at_start = _SENTENCE_START.search(text[:start]) is not None
        if at_start and " " not in text[start:end]:
            continue
        add(start, end, "name")
    for m in _ACRONYM_RE.finditer(text):
        add(m.start(), m.end(), "code")
    for run in _CJK_RUN.finditer(text):
        for start, end in _cjk_names(run.group(0)):
            add(run.start() + start, run.start() + end, "name")
    return sorted(found)


def _trim_stop_words(text: str, start: int, end: int) -> tuple[int, int]:
    parts = [(m.start() + start, m.end() + start) for m in re.finditer(r"\S+", text[start:end])]
    while parts and is_stop(text[parts[0][0] : parts[0][1]]):
        parts.pop(0)
    while parts and is_stop(text[parts[-1][0] : parts[-1][1]]):
        parts.pop()
    return (parts[0][0], parts[-1][1]) if parts else (start, start)


def _cjk_names(run: str) -> list[tuple[int, int]]:
    try:
        import jieba.posseg as posseg

        _jieba()
    except ImportError:
        return []
    out, pos = [], 0
    for pair in posseg.lcut(run):
        if pair.flag in _NAME_POS and len(pair.word) > 1:
            out.append((pos, pos + len(pair.word)))
        pos += len(pair.word)
    return out


def question_entities(question: str) -> list[str]:
    """The entities a question asks about (names, titles, codes, dates, numbers), deduplicated."""
    seen: dict[str, str] = {}
    for word in fact_words(question):
        seen.setdefault(_norm(word.text), word.text)
    return list(seen.values())


def key_terms(question: str, limit: int = 12) -> list[str]:
    """The question's entities first, then its other content words, deduplicated, in order."""
    terms = question_entities(question)
    normed = {_norm(t) for t in terms}
    covered = " ".join(_norm(t) for t in terms)
    for word in split_words(question):
        n = _norm(word.text)
        if is_stop(word.text) or n in normed or f" {n} " in f" {covered} ":
            continue
        normed.add(n)
        terms.append(word.text)
    return terms[:limit]


def _norm(text: str) -> str:
    """Lowercase alphanumeric tokens joined by spaces ("Apache-2.0" -> "apache 2 0")."""
    parts = re.findall(f"[{_CJK}]|{_LATIN}+", text.lower())
    return " ".join(parts)


def mentions(text: str, term: str) -> bool:
    """True when `text` contains `term` as whole words, ignoring case and punctuation."""
    needle = _norm(term)
    return bool(needle) and f" {needle} " in f" {_norm(text)} "


def passage_mentions(passages: Sequence[Hit], term: str) -> bool:
    """True when some passage (title or text) mentions `term` (see `mentions`)."""
    return any(mentions(hit.title + " " + hit.text, term) for hit in passages)


def char_span(segment: Segment, start: int, end: int, score: float = 1.0) -> Span:
    """The span of characters [start, end) of the segment, with the tokens that overlap it."""
    toks = [i for i, (s, e) in enumerate(token_offsets(segment)) if s < end and start < e]
    first, last = (toks[0], toks[-1] + 1) if toks else (0, 0)
    return Span(first, last, segment.text[start:end], score, start, end)


def count_query_units(text: str) -> int:
    """Length of a query: Latin words plus CJK characters (each counts as one)."""
    return len(_CJK_RUN.sub(" ", text).split()) + sum(len(r) for r in _CJK_RUN.findall(text))
