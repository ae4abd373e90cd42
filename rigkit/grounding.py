"""Grounding: citations the model writes itself, checked against what it could see, and a check
of each answer sentence's facts against the passages it could see.

- `context.cite: model`: the passages are numbered `[1]`, `[2]`, ... in the order they first
  entered the context (a number never changes within a question) and the model is asked to cite
  them. A `[n]` is kept only when passage n was in context when its sentence was written; one
  that names no passage, or a passage that arrived later or had been evicted, is taken out of the
  answer and recorded as a `RemovedCitation`. Kept ones become the sentence's `model_cites` and,
  with tags on, `[[citation:ID]]` tags, as the word-overlap attribution's are.
- The fact check: a sentence's fact-shaped strings (`rigkit.text.fact_words`: numbers, dates,
  codes, capitalised names; jieba's name tags for Chinese) must each be mentioned by a passage
  the sentence could see, or by the question; a sentence with one that is not becomes a
  `Suspicion`. A run that had no passage at all is not checked: there was nothing to ground on.
- Warnings: passages were in context but the answer cites none; citations were removed.

Lexical, like `rigkit.citations`: a true fact written differently ("twelve" for "12", a
transliterated name) is flagged, and a fact a passage mentions without supporting it ("born in
1990" against "died in 1990") passes. A flag asks a reader to look; it is not a verdict.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from rigkit.citations import cite as cite_by_overlap
from rigkit.citations import insert_tags, visible_at
from rigkit.errors import InputError
from rigkit.text import (
    Word,
    content_words,
    fact_words,
    is_stop,
    mentions,
    sentence_spans,
    strip_citations,
)
from rigkit.trace import Attribution, Hit, RemovedCitation, Suspicion

__all__ = [
    "GROUNDING_MODES",
    "CITE_MODES",
    "MODEL_CITATION",
    "Grounded",
    "check_grounding_options",
    "ground",
    "model_citations",
    "check_facts",
    "grounding_warnings",
]

GROUNDING_MODES = ("none", "strict")  # not "off": YAML reads a bare off as false
CITE_MODES = ("overlap", "model")

# `[3]`, `[1, 2]`, `[1][2]` (one match each), full-width `【1】`/`［1］`, with the spaces before it.
# At most three digits, so a bracketed year ("[1990]") is never read as a citation.
MODEL_CITATION = re.compile(r"[ \t]*[\[［【]\s*(\d{1,3}(?:\s*[,，、]\s*\d{1,3})*)\s*[\]］】]")

_GROUPING = re.compile(r"(?<=\d),(?=\d{3})")  # thousands separators

Visible = Sequence[tuple[int, Collection[str] | None]]


@dataclass
class Grounded:
    """An answer after grounding: the text, what it cites, and what the checks found."""

    answer: str
    cited: list[str]  # chunk ids, in order of first citation
    attributions: list[Attribution]
    suspicious: list[Suspicion] = field(default_factory=list)
    removed: list[RemovedCitation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_grounding_options(grounding: str = "none", cite: str = "overlap") -> None:
    """An `InputError` naming the allowed values when `context.grounding` or `context.cite` is unknown."""
    if grounding not in GROUNDING_MODES:
        raise InputError(f"context.grounding must be {' or '.join(GROUNDING_MODES)}; got {grounding!r}")
    if cite not in CITE_MODES:
        raise InputError(f"context.cite must be {' or '.join(CITE_MODES)}; got {cite!r}")


def ground(
    answer: str,
    question: str,
    passages: Sequence[Hit],
    visible: Visible = (),
    cite: str = "overlap",
    numbers: Mapping[str, int] | None = None,
    tags: bool = True,
    warn_unretrieved: bool = False,
) -> Grounded:
    """Cite (by overlap, or check the model's own `[n]`), then check facts and warn.

    `passages` are every passage that was in context; `visible` is `citations.written_with`'s
    (offset, chunk ids) list for `answer`; `numbers` (chunk id -> passage number) is how the
    passages were labelled for `cite="model"`; `warn_unretrieved` warns that the answer cites
    nothing also when no passage was ever in context.
    """
    check_grounding_options(cite=cite)
    removed: list[RemovedCitation] = []
    if cite == "model":
        text, attributions, removed = model_citations(answer, passages, visible, numbers or {})
        cited = list(dict.fromkeys(c for a in attributions for c in a.model_cites))
        text = insert_tags(text, attributions) if tags else text
    else:
        text, cited, attributions = cite_by_overlap(answer, passages, visible, tags=tags)
    return Grounded(
        answer=text,
        cited=cited,
        attributions=attributions,
        suspicious=check_facts(attributions, passages, question),
        removed=removed,
        warnings=grounding_warnings(attributions, cited, removed, cite, warn_unretrieved and not passages),
    )


def model_citations(
    answer: str, passages: Sequence[Hit], visible: Visible, numbers: Mapping[str, int]
) -> tuple[str, list[Attribution], list[RemovedCitation]]:
    """(answer without `[n]`, one attribution per sentence, the citations removed as unseen).

    A `[n]` belongs to the sentence it follows: one written right after a sentence's end
    ("Paris. [1]") still cites that sentence. It is checked against the passages in context when
    that sentence started.
    """
    text, marks, shift = _without_numbers(strip_citations(answer))
    known = {h.chunk_id: content_words(f"{h.title} {h.text}") for h in passages}
    spans = sentence_spans(text)
    attributions = [
        Attribution(text[s:e], s, e, visible=visible_at(_original_offset(s, marks, shift), visible, known))
        for s, e in spans
    ]
    by_number = {n: cid for cid, n in numbers.items()}
    removed: list[RemovedCitation] = []
    for mark in marks:
        index = _sentence_before(mark.position - shift, spans)
        if index is None:
            continue  # an answer with no sentence: nothing to cite
        item = attributions[index]
        for number in mark.numbers:
            chunk_id = by_number.get(number)
            if chunk_id is None:
                removed.append(RemovedCitation(mark.label, number, None, index, "no passage has this number"))
            elif chunk_id not in item.visible:
                removed.append(RemovedCitation(mark.label, number, chunk_id, index,
                                               "the passage was not in context when the sentence was written"))
            elif chunk_id not in item.model_cites:
                item.model_cites.append(chunk_id)
    for item in attributions:
        if item.model_cites:
            item.cited = item.model_cites[0]
            item.shared = len(content_words(item.text) & known[item.cited])
    return text, attributions, removed


class _Mark(NamedTuple):
    """A `[n]` taken out: where it was in the text without marks (before stripping), how many
    characters went (the label and the spaces before it), the label as written, its numbers."""

    position: int
    length: int
    label: str
    numbers: list[int]


def _without_numbers(text: str) -> tuple[str, list[_Mark], int]:
    """(text without `[n]`, stripped; the marks taken out; leading characters stripped)."""
    pieces, marks, cursor, removed = [], [], 0, 0
    for match in MODEL_CITATION.finditer(text):
        pieces.append(text[cursor : match.start()])
        numbers = [int(n) for n in re.findall(r"\d+", match.group(1))]
        length = match.end() - match.start()
        marks.append(_Mark(match.start() - removed, length, match.group(0).strip(), numbers))
        removed += length
        cursor = match.end()
    joined = "".join(pieces) + text[cursor:]
    shift = len(joined) - len(joined.lstrip())
    return joined.strip(), marks, shift


def _original_offset(offset: int, marks: Sequence[_Mark], shift: int) -> int:
    """Where `offset` of the stripped text without marks lies in the text the model wrote."""
    position = offset + shift
    return position + sum(m.length for m in marks if m.position <= position)


def _sentence_before(position: int, spans: Sequence[tuple[int, int]]) -> int | None:
    """The sentence a citation at `position` follows: the last one starting before it (else the first)."""
    if not spans:
        return None
    before = [i for i, (start, _) in enumerate(spans) if start < position]
    return before[-1] if before else 0


def check_facts(attributions: Sequence[Attribution], passages: Sequence[Hit], question: str) -> list[Suspicion]:
    """Sentences whose facts no passage they could see (nor the question) mentions."""
    if not passages:
        return []  # nothing was in context to ground the answer on
    by_id = {h.chunk_id: f"{h.title} {h.text}" for h in passages}
    out = []
    for index, item in enumerate(attributions):
        sources = [by_id[c] for c in item.visible if c in by_id] + [question]
        facts = [w.text for w in fact_words(item.text) if not _supported(w, sources)]
        if facts:
            out.append(Suspicion(index, item.text, list(dict.fromkeys(facts))))
    return out


def _supported(word: Word, sources: Sequence[str]) -> bool:
    """Whether some source mentions the fact: whole, or (names, dates) every part of it in one
    source, so "James Cameron" matches "Cameron, James" and "5 March 1990" matches "March 5, 1990"."""
    if any(mentions(source, word.text) for source in sources):
        return True
    if word.kind == "number":  # "1,000" and "1000" are one number
        digits = _GROUPING.sub("", word.text)
        return any(mentions(_GROUPING.sub("", source), digits) for source in sources)
    if word.kind == "date":
        parts = re.findall(r"\d+|[A-Za-z]+", word.text)
    elif word.kind == "name":
        parts = [p for p in word.text.split() if not is_stop(p)]
    else:
        return False
    return len(parts) > 1 and any(all(mentions(source, p) for p in parts) for source in sources)


def grounding_warnings(
    attributions: Sequence[Attribution], cited: Sequence[str], removed: Sequence[RemovedCitation], cite: str,
    unretrieved: bool = False,
) -> list[str]:
    """One line each: passages were in context but nothing cites them (or, `unretrieved`, no
    passage ever was); citations were removed."""
    out = []
    if unretrieved and attributions and not cited:
        out.append("the answer cites nothing: no passage was retrieved")
    seen = {c for a in attributions for c in a.visible}
    if seen and not cited:
        who = "the model cited none it could see" if cite == "model" else "no sentence is attributed to a passage"
        out.append(f"the answer cites nothing: {who}, though {len(seen)} passage(s) were in context")
    if removed:
        shown = ", ".join(f"{r.label} ({'no such passage' if r.chunk_id is None else 'not seen'})" for r in removed)
        out.append(f"removed {len(removed)} citation(s) of passages the sentence could not see: {shown}")
    return out
