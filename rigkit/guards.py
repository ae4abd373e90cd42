"""Text checks the loop applies to every generator's output and every query it builds.

Pure functions of text, so they hold for any backend (in-process, served, chat):
- repetition: a sentence whose word n-grams mostly occur in one earlier sentence repeats it
  (`repeated_sentence`, `first_repeat`); a phrase going round in a loop inside one sentence
  (`phrase_loop_at`) is cut where it comes back; a rewrite that mostly repeats accepted text
  (`ngram_overlap`) does not earn its place;
- the end of an answer: `whole_sentences` cuts text that stops mid-sentence back to its last
  sentence end;
- queries: near-duplicates of earlier searches (`near_duplicate`), empty or garbage queries
  (`garbage_reason`) and the length cap (`cap_query`: CJK characters, or words).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rigkit.config import QueryConfig
from rigkit.text import (
    CJK,
    SENTENCE_END,
    has_cjk,
    has_content,
    normalize_words,
    sentence_spans,
    word_units,
)
from rigkit.trace import Query

__all__ = [
    "words_of",
    "ngram_overlap",
    "repeated_sentence",
    "first_repeat",
    "phrase_loop_at",
    "whole_sentences",
    "near_duplicate",
    "garbage_reason",
    "cap_query",
    "QueryGuard",
]

_N = 3  # word n-grams: long enough that shared phrasing ("the film was") alone is rare


def words_of(text: str) -> list[str]:
    """Lowercased letter and digit runs (each CJK character alone, so Chinese compares as characters)."""
    return normalize_words(text).split()  # "Apache-2.0" and "Apache 2.0" are the same words


def _grams(words: Sequence[str], n: int = _N) -> set[tuple[str, ...]]:
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def ngram_overlap(text: str, others: Sequence[str], n: int = _N) -> float:
    """Share of `text`'s word n-grams that occur in any of `others` (0 for text without words)."""
    grams = _grams(words_of(text), n)
    if not grams:
        return 0.0
    seen = set().union(*(_grams(words_of(o), n) for o in others)) if others else set()
    return len(grams & seen) / len(grams)


def repeated_sentence(sentence: str, earlier: Sequence[str], min_share: float = 0.8) -> int | None:
    """Index of the earlier sentence `sentence` repeats exactly or nearly, else None.

    Nearly: at least `min_share` of its word trigrams occur in that one sentence, so a repeat that
    was cut short ("It allows use for any purpose, and") counts as one too.
    """
    words = words_of(sentence)
    if not words:
        return None
    mine = _grams(words)
    for i, other in enumerate(earlier):
        theirs = words_of(other)
        if words == theirs or len(mine & _grams(theirs)) >= min_share * len(mine):
            return i
    return None


def first_repeat(draft: str, segment: str, min_share: float = 0.8) -> int | None:
    """Character offset in `segment` where a sentence repeating one of `draft` starts, else None.

    A segment that continues the draft's last, unfinished sentence is judged as that sentence
    whole; the offset is then 0 (nothing of the segment is worth keeping). After a finished
    sentence the segment's own sentences are judged, with or without a space between them.
    """
    continues = bool(draft.strip()) and not _ENDS_SENTENCE.search(draft.rstrip())
    text, offset = (draft + segment, len(draft)) if continues else (segment, 0)
    spans = sentence_spans(text)  # split once per round: the draft's spans come with the segment's
    if continues:
        earlier = [text[s:e] for s, e in spans if e <= offset]
    else:
        earlier = [draft[s:e] for s, e in sentence_spans(draft)]
    for start, end in spans:
        if end <= offset:
            continue
        if repeated_sentence(text[start:end], earlier, min_share) is not None:
            return max(0, start - offset)
        earlier.append(text[start:end])
    return None


_WORD = re.compile(rf"[{CJK}]|(?:(?![{CJK}])[^\W_])+")  # the words of `words_of`, with their places in the text
_LOOP_N, _LOOP_TIMES = 4, 4  # a 4-word phrase four times at one period in one sentence: text going round


def phrase_loop_at(draft: str, segment: str) -> int | None:
    """Character offset in `segment` where a phrase loop inside the current sentence comes back.

    Greedy decoding of a small model can go round one phrase until the budget ends ("... Part 2:
    The Twilight Saga: Breaking Dawn – Part 2: The Twilight Saga: ..."), never ending a sentence
    that `first_repeat` could judge. A word 4-gram met four times at one period in the sentence
    the segment writes is such a loop; the cut keeps its first round and drops the rest (0:
    nothing of the segment is worth keeping).
    """
    starts = [s for s, _ in sentence_spans(draft)] if draft.strip() else []
    unfinished = draft.strip() and not _ENDS_SENTENCE.search(draft.rstrip())
    head = draft[starts[-1]:] if unfinished and starts else ""
    text, offset = head + segment, len(head)
    if (clause := _cjk_clause_again(text, offset)) is not None:
        return clause
    words = [(m.group(0).lower(), m.start()) for m in _WORD.finditer(text)]
    ends = iter(m.end() for m in SENTENCE_END.finditer(text))  # in order: one pass beside the words
    next_end = next(ends, None)
    seen: dict[tuple[str, ...], list[int]] = {}
    for i in range(len(words)):
        if next_end is not None and next_end <= words[i][1]:  # a new sentence: loops start afresh
            seen = {}
            while next_end is not None and next_end <= words[i][1]:
                next_end = next(ends, None)
        gram = tuple(w for w, _ in words[i : i + _LOOP_N])
        if len(gram) < _LOOP_N:
            break
        places = seen.setdefault(gram, [])
        places.append(i)
        # at one period: the text between the phrases came round too ("A B A B A B A B"), where a
        # title named in a long sentence is spaced at random; four times, as a model that writes
        # "Title: Title: Title is a 1924 film" has left the loop by itself
        last = places[-_LOOP_TIMES:]
        if len(last) == _LOOP_TIMES and len({b - a for a, b in zip(last, last[1:])}) == 1:
            return max(0, words[last[1]][1] - offset)
    return None


# a Chinese clause of at least five characters written again at once, after a comma or nothing:
# CJK "words" are single characters, so a repeated unpunctuated clause ("他是一个好演员他是一个好演员")
# is one sentence with no 4-gram met four times, and passes both other rules
_CJK_CLAUSE_AGAIN = re.compile(rf"([{CJK}][^。！？.!?\n，,、；;]{{4,60}}?)[，,、；;\s]*\1")


def _cjk_clause_again(text: str, offset: int) -> int | None:
    """Offset in the segment (text[offset:]) where a repeated Chinese clause comes back, else None."""
    for match in _CJK_CLAUSE_AGAIN.finditer(text):
        again = match.end() - len(match.group(1))
        if match.end() > offset and len(re.findall(f"[{CJK}]", match.group(1))) >= 5:
            return max(0, again - offset)
    return None


# a sentence end, then closing quotes, then any citations the model wrote ("... file. [1]")
_ENDS_SENTENCE = re.compile(r"[.!?…。！？][\"'”’)\]」』）]*(?:\s*[\[［【]\s*\d[\d,，、\s]*[\]］】])*$")


def whole_sentences(text: str) -> str:
    """`text` up to its last sentence end ("" when no sentence ended); unchanged when it ends on one."""
    stripped = text.rstrip()
    if not stripped or _ENDS_SENTENCE.search(stripped):
        return text
    ends = [m.end() for m in SENTENCE_END.finditer(stripped)]
    return stripped[: ends[-1]] if ends else ""


def near_duplicate(query: str, earlier: Sequence[str], min_share: float = 0.8) -> str | None:
    """The earlier query `query` equals or nearly equals: the same words, or word trigram sets
    whose Jaccard similarity is at least `min_share` (order counts, so two masked queries that
    share the question's terms but not the sentence are different)."""
    words = words_of(query)
    mine = _grams(words)
    for other in earlier:
        theirs = words_of(other)
        if words == theirs or (mine and len(mine & _grams(theirs)) >= min_share * len(mine | _grams(theirs))):
            return other
    return None


_MARKUP = re.compile(r"</?\w+>|\[\[|\]\]|<\|[^|]*\|>")


def garbage_reason(query: str) -> str | None:
    """Why `query` is not worth searching ("empty", "no content word", "mostly symbols"), else None."""
    text = _MARKUP.sub(" ", query).strip()
    if not text:
        return "empty query"
    if not has_content(text):
        return "no content word"
    letters = sum(ch.isalnum() for ch in text)
    if letters < 0.5 * len(text.replace(" ", "")):
        return "mostly symbols"
    return None


def cap_query(query: str, max_words: int, max_cjk: int) -> str:
    """`query` cut to `max_cjk` CJK characters when it is Chinese, else to `max_words` words."""
    units = word_units(query)
    if has_cjk(query):
        return query[: units[max_cjk - 1].end()].strip() if len(units) > max_cjk else query
    return query[: units[max_words - 1].end()].strip() if len(units) > max_words else query


class QueryGuard:
    """The loop's guards on one answer's searches: length cap, empty / garbage, near-duplicates.

    `screen(query, earlier)` returns the searches worth running (capped) and one line per guard
    that fired; `earlier` are the answer's searches so far (the caller keeps them).
    """

    def __init__(self, config: QueryConfig, skip_duplicates: bool = True, min_share: float = 0.8):
        self.config, self.skip_duplicates, self.min_share = config, skip_duplicates, min_share

    def screen(self, query: Query, earlier: Sequence[str] = ()) -> tuple[list[str], list[str]]:
        kept: list[str] = []
        notes: list[str] = []
        capped = self.config.cap == "all" or (self.config.cap == "marker" and query.mode == "marker")
        for search in query.searches:
            if capped and (short := cap_query(search, self.config.max_query_words, self.config.max_query_cjk)) != search:
                notes.append(f"capped: {search!r} -> {short!r}")
                search = short
            if self.skip_duplicates and (reason := garbage_reason(search)):
                notes.append(f"skipped ({reason}): {search!r}")
                continue
            if self.skip_duplicates and (twin := near_duplicate(search, [*earlier, *kept], self.min_share)):
                notes.append(f"skipped (searched before: {twin!r}): {search!r}")
                continue
            kept.append(search)
        return kept, notes
