"""Triggering spans: tokens aligned to characters, and the shape every `Decision.spans` keeps.

Token-level deciders (FLARE, DRAGIN) judge *tokens* but must skip stop words and punctuation,
which are properties of *words*: so a segment's tokens are aligned to character offsets in its
text (`token_offsets`) and each token is mapped to the words it overlaps (`token_words`).

Invariants (checked for every decider in one shared test): character offsets lie inside the
segment text, `span.text == segment.text[char_start:char_end]`, and spans are sorted and do not
overlap. The masked query (FLARE) cuts exactly these ranges, so a flagged digit "3" removes its
word "1932" and never every "3" of the sentence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rigkit.text import Word, is_stop, split_words
from rigkit.trace import Segment, Span

__all__ = ["token_offsets", "token_words", "spans_from_tokens", "char_span", "word_spans", "merge_spans"]


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

def char_span(segment: Segment, start: int, end: int, score: float = 1.0) -> Span:
    """The span of characters [start, end) of the segment, with the tokens that overlap it."""
    toks = [i for i, (s, e) in enumerate(token_offsets(segment)) if s < end and start < e]
    first, last = (toks[0], toks[-1] + 1) if toks else (0, 0)
    return Span(first, last, segment.text[start:end], score, start, end)


def word_spans(segment: Segment, flagged: Iterable[int], token_scores: Sequence[float]) -> list[Span]:
    """One span per flagged token, widened to the whole words it touches (its own characters
    included, so "1931." stays "1931."); spans that overlap merge. Unlike
    `spans_from_tokens`, neighbouring words stay separate spans."""
    text = segment.text
    words = split_words(text)
    offsets = token_offsets(segment)
    tok_words = token_words(segment, words)
    ranges: list[tuple[int, int, int, int, float]] = []  # char start, end, token start, end, score
    for i in sorted(set(flagged)):
        start, end = offsets[i]
        piece = text[start:end]
        start += len(piece) - len(piece.lstrip())
        end -= len(piece) - len(piece.rstrip())
        for k in tok_words[i]:
            if not is_stop(words[k].text):
                start, end = min(start, words[k].start), max(end, words[k].end)
        if start < end:
            ranges.append((start, end, i, i + 1, float(token_scores[i])))
    return merge_spans(segment, [Span(t0, t1, text[c0:c1], sc, c0, c1) for c0, c1, t0, t1, sc in ranges])


def merge_spans(segment: Segment, spans: Iterable[Span]) -> list[Span]:
    """`spans` sorted by character offset, overlapping ones merged (largest score kept).

    Spans without character offsets (-1) are placed at the first occurrence of their text after
    the previous span, or dropped when their text is not in the segment.
    """
    text = segment.text
    placed: list[Span] = []
    for span in spans:
        if span.char_start < 0 or span.char_end > len(text) or span.char_start >= span.char_end:
            at = text.find(span.text) if span.text else -1
            if at < 0:
                continue
            span = Span(span.start, span.end, span.text, span.score, at, at + len(span.text))
        placed.append(span)
    placed.sort(key=lambda s: (s.char_start, s.char_end))
    merged: list[Span] = []
    for span in placed:
        if merged and span.char_start < merged[-1].char_end:
            last = merged[-1]
            c0, c1 = last.char_start, max(last.char_end, span.char_end)
            merged[-1] = Span(min(last.start, span.start), max(last.end, span.end), text[c0:c1],
                              max(last.score, span.score), c0, c1)
        else:
            merged.append(Span(span.start, span.end, text[span.char_start:span.char_end], span.score,
                               span.char_start, span.char_end))
    return merged
