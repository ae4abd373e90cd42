"""Text primitives for the whole package: scripts, words, stop words, sentences, citation tags.

One home for what every part needs to read text the same way: which characters are CJK, how a
text splits into words (Latin/digit runs; Chinese through jieba, loaded on first use) and into
sentences (terminal punctuation followed by whitespace, or CJK 。！？ with no space after it),
which words are stop words, and what a `[[citation:ID]]` tag looks like. Fact-shaped strings
(numbers, dates, codes, proper names) and question entities are found by regular expressions
plus jieba's part-of-speech tags for Chinese names: no NER model, a deliberate concession to
"runs anywhere".

Deliberate differences are named here rather than copied: BM25 tokens (`rigkit.retrieval.
tokenize`) route only Han ideographs (`HAN`) to jieba and use bm25s's stop words
(`stop_words(..., source="bm25s")`), because index manifests pin their tokens and the reference
retrieval figures were measured with bm25s's lists.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rigkit.errors import InputError

if TYPE_CHECKING:
    from rigkit.trace import Hit

__all__ = [
    "check_question",
    "HAN",
    "CJK",
    "has_cjk",
    "detect_language",
    "load_jieba",
    "cjk_words",
    "load_word_list",
    "stop_words",
    "is_stop",
    "Word",
    "split_words",
    "has_content",
    "content_words",
    "word_units",
    "count_query_units",
    "SENTENCE_END",
    "sentence_spans",
    "split_sentences",
    "first_sentence",
    "CITATION",
    "citation_tag",
    "find_citations",
    "strip_citations",
    "neutralize_citations",
    "fact_words",
    "question_entities",
    "key_terms",
    "normalize_words",
    "mentions",
    "passage_mentions",
]



# whitespace, control characters (NUL...) and invisible format characters (soft hyphen, zero-width space and joiners, bidi marks, BOM)
_INVISIBLE = re.compile(r"[\s\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u206a-\u206f\ufeff]+")


def check_question(text: object, what: str = "the question") -> str:
    """`text` if it can be asked; else an InputError (also a ValueError) saying why: empty or not a
    string (or only invisible characters), or not encodable as UTF-8 (a command line decoded with
    surrogateescape)."""
    if not isinstance(text, str) or not _INVISIBLE.sub("", text):
        raise InputError(f"{what} is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what} is not valid UTF-8 text; check the encoding of the shell or "
                         "client that sent it") from None
    return text


# -- scripts ------------------------------------------------------------------------------------
HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs (extension A, unified, compatibility)
CJK = HAN + "\u3040-\u30ff"  # ... plus Japanese kana: characters that are written without spaces
_CJK_RUN = re.compile(f"[{CJK}]+")
_HAN_CHAR = re.compile(f"[{HAN}]")


def has_cjk(text: str, kana: bool = True) -> bool:
    """True if `text` holds a CJK character; `kana=False` looks for Han ideographs only."""
    return (_CJK_RUN if kana else _HAN_CHAR).search(text) is not None


def detect_language(text: str) -> str:
    """"zh" when a fifth or more of the letters are Han ideographs, else "en"."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return "en"
    return "zh" if sum(bool(_HAN_CHAR.match(c)) for c in letters) / len(letters) >= 0.2 else "en"


@lru_cache(maxsize=1)
def load_jieba() -> Any:
    """The jieba module, imported on first use (its dictionary loads lazily too)."""
    import jieba

    jieba.setLogLevel(logging.WARNING)  # its dictionary-loading banner is noise on stderr
    return jieba


def cjk_words(run: str) -> list[str]:
    """jieba's words (precise mode, HMM on) of a run of CJK characters."""
    return load_jieba().lcut(run, HMM=True)


# -- stop words ---------------------------------------------------------------------------------
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


@lru_cache(maxsize=8)
def stop_words(lang: str = "en", source: str = "rigkit") -> frozenset[str]:
    """Lowercased stop words of `lang` ("en" or "zh").

    `source="rigkit"`: rigkit/resources/stopwords_<lang>.txt, used by deciders, queries and
    citations. `source="bm25s"`: bm25s's own lists, which BM25 must keep so that indexes
    reproduce the reference retrieval figures.
    """
    if source == "bm25s":
        from bm25s.stopwords import STOPWORDS_CHINESE, STOPWORDS_EN

        return frozenset({"en": STOPWORDS_EN, "zh": STOPWORDS_CHINESE}[lang])
    if source != "rigkit":
        raise ValueError(f"unknown stop-word source {source!r} (rigkit or bm25s)")
    return frozenset(w.lower() for w in load_word_list(f"stopwords_{lang}"))


def is_stop(word: str) -> bool:
    """True for rigkit's stop words in English or Chinese (apostrophes normalised)."""
    lowered = word.lower().replace("’", "'")
    return lowered in stop_words("en") or lowered in stop_words("zh")


# -- words --------------------------------------------------------------------------------------
# Latin/digit words may hold inner - . ' ’ / ("Apache-2.0", "don't"); never CJK characters.
_LATIN = f"(?:(?![{CJK}])[^\\W_])"
_WORD_RE = re.compile(f"[{CJK}]+|{_LATIN}+(?:[-.'’/]{_LATIN}+)*")
_UNIT = re.compile(f"[{CJK}]|[^\\s{CJK}]+")


class Word(NamedTuple):
    """A word at characters [start, end) of its text; `kind` is set by `fact_words`."""

    start: int
    end: int
    text: str
    kind: str = "word"


def split_words(text: str) -> list[Word]:
    """Words of `text` with character offsets; punctuation and spaces are not words."""
    words: list[Word] = []
    for match in _WORD_RE.finditer(text):
        if _CJK_RUN.fullmatch(match.group(0)):
            pos = match.start()
            for piece in cjk_words(match.group(0)):
                words.append(Word(pos, pos + len(piece), piece))
                pos += len(piece)
        else:
            words.append(Word(match.start(), match.end(), match.group(0)))
    return words


def has_content(text: str) -> bool:
    """True when `text` holds a word that is not a stop word."""
    return any(not is_stop(w.text) for w in split_words(text))


def content_words(text: str) -> set[str]:
    """Lowercased non-stop words (jieba words for Chinese); Latin words need 3+ characters."""
    out = set()
    for word in split_words(text):
        lowered = word.text.lower()
        if is_stop(lowered) or (not has_cjk(lowered) and len(lowered) < 3):
            continue
        out.add(lowered)
    return out


def word_units(text: str) -> list[re.Match[str]]:
    """The units a query length counts: whitespace-separated words, each CJK character alone."""
    return list(_UNIT.finditer(text))


def count_query_units(text: str) -> int:
    """Length of a query: Latin words plus CJK characters (each counts as one)."""
    return len(word_units(text))


# -- sentences ----------------------------------------------------------------------------------
# Terminal punctuation (and closing quotes/brackets) followed by whitespace, so "1." or
# "Apache-2.0" do not end a sentence, or CJK terminal punctuation, which needs no space after it.
# Generation checks it on text still growing, so the end of the text is not an end here.
SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*(?=\s)|[。！？]")
_CJK_CLOSERS = re.compile(r"[”’」』）)\]]*")  # quotes closing a CJK sentence belong to it


def sentence_spans(text: str, capital_ends: bool = True) -> list[tuple[int, int]]:
    """Character ranges [start, end) of the sentences of a finished `text`, spaces excluded.

    `capital_ends=False` does not end a sentence at a full stop after a capital letter, so
    "U.S. law" stays whole (query cleaning, where names abound).
    """
    spans, start = [], 0
    for match in SENTENCE_END.finditer(text):
        if match.start() < start:
            continue
        cjk = match.group(0) in "。！？"
        if not capital_ends and not cjk and text[match.start() - 1 : match.start()].isupper():
            continue
        end = _CJK_CLOSERS.match(text, match.end()).end() if cjk else match.end()
        spans.append((start, end))
        start = end
    spans.append((start, len(text)))
    out = []
    for s, e in spans:  # trim spaces, drop pieces with no letter or digit
        piece = text[s:e]
        s, e = s + len(piece) - len(piece.lstrip()), e - (len(piece) - len(piece.rstrip()))
        if any(ch.isalnum() for ch in text[s:e]):
            out.append((s, e))
    return out


def split_sentences(text: str) -> list[str]:
    """The sentences of a finished text (citation tags removed)."""
    text = strip_citations(text)
    return [text[s:e] for s, e in sentence_spans(text)]


def first_sentence(text: str, capital_ends: bool = True) -> str:
    """The text up to and including its first sentence end (see `sentence_spans`)."""
    spans = sentence_spans(text, capital_ends)
    return text[spans[0][0] : spans[0][1]] if spans else ""


# -- citation tags ------------------------------------------------------------------------------
# Lenient on spacing and case, so a model's or a passage's variant is still recognised.
# An id holds no bracket, so a tag never runs across another tag's opener.
CITATION = re.compile(r"\[\[\s*citation\s*:\s*([^\[\]]*?)\s*\]\]", re.IGNORECASE)
_CITATION_WITH_SPACE = re.compile(r"[ \t]*" + CITATION.pattern, re.IGNORECASE)
# A tag the model began and never closed ("... from [[citation:2wiki-8d5e"): no citation, only noise.
_BROKEN_CITATION = re.compile(r"[ \t]*\[\[\s*citation\s*:[^\[\]\s]*\]?", re.IGNORECASE)
_CITATION_OPENER = re.compile(r"\[\[(?=\s*citation\b)", re.IGNORECASE)


def citation_tag(chunk_id: str) -> str:
    """rigkit's citation of one passage: `[[citation:ID]]`."""
    return f"[[citation:{chunk_id}]]"


def find_citations(text: str) -> list[str]:
    """Cited ids in `text`, in order of appearance, each once."""
    return list(dict.fromkeys(CITATION.findall(text)))


def strip_citations(text: str) -> str:
    """`text` without `[[citation:ID]]` tags, nor tags left unclosed (and the spaces before them)."""
    return _BROKEN_CITATION.sub("", _CITATION_WITH_SPACE.sub("", text)).strip()


def neutralize_citations(text: str) -> str:
    """`text` in which nothing reads as a citation tag: every `[[` opening one becomes "[(".

    Passages are sanitised with it, so a document cannot plant a citation the answer repeats.
    """
    return _CITATION_OPENER.sub("[(", text)


# -- facts and entities -------------------------------------------------------------------------
_NAME_POS = {"nr", "nrt", "nrfg", "ns", "nt", "nz"}  # jieba: person, place, organisation, other
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

    for pattern, kind in ((_DATE_RE, "date"), (_CODE_RE, "code"), (_NUMBER_RE, "number")):
        for m in pattern.finditer(text):
            add(m.start(), m.end(), kind)
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
    load_jieba()
    import jieba.posseg as posseg

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
        seen.setdefault(normalize_words(word.text), word.text)
    return list(seen.values())


def key_terms(question: str, limit: int = 12) -> list[str]:
    """The question's entities first, then its other content words, deduplicated, in order."""
    terms = question_entities(question)
    normed = {normalize_words(t) for t in terms}
    covered = " ".join(normalize_words(t) for t in terms)
    for word in split_words(question):
        n = normalize_words(word.text)
        if is_stop(word.text) or n in normed or f" {n} " in f" {covered} ":
            continue
        normed.add(n)
        terms.append(word.text)
    return terms[:limit]


def normalize_words(text: str) -> str:
    """Lowercase alphanumeric tokens joined by spaces ("Apache-2.0" -> "apache 2 0")."""
    parts = re.findall(f"[{CJK}]|{_LATIN}+", text.lower())
    return " ".join(parts)


def mentions(text: str, term: str) -> bool:
    """True when `text` contains `term` as whole words, ignoring case and punctuation."""
    needle = normalize_words(term)
    return bool(needle) and f" {needle} " in f" {normalize_words(text)} "


def passage_mentions(passages: Sequence[Hit], term: str) -> bool:
    """True when some passage (title or text) mentions `term` (see `mentions`)."""
    return any(mentions(hit.title + " " + hit.text, term) for hit in passages)

