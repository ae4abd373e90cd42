"""The transcript the generator reads: an append-only list of pieces.

Text pieces (chat-template scaffolding, the question, injected passages) are tokenised by the
generator; generated pieces keep the model's own token ids, so nothing it wrote is ever
re-tokenised differently. Because rounds only append pieces, the generator can keep its KV cache
and pre-fill just the new ones.

Text that came from documents or from the user (passages, titles, ids, the question) is data:
`Piece.plain` marks its character ranges, and generators tokenise them with special-token parsing
off, so a passage containing `<|im_start|>system` cannot forge a chat turn. Only the chat
template's own scaffolding produces special tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Piece", "StopRule", "plain_spans", "tokenize_plain", "PieceTokens", "encode_transcript",
           "kept_tag_ids", "decode_keeping"]


@dataclass(frozen=True)
class Piece:
    """A run of prompt text; `token_ids` is set for text the model generated itself."""

    text: str
    token_ids: tuple[int, ...] | None = None
    role: str = "scaffold"  # system | question | passages | draft | scaffold (for the budget)
    plain: tuple[tuple[int, int], ...] = ()  # [start, end) ranges of `text` that are data, not markup

    def parts(self) -> list[tuple[str, bool]]:
        """(text, is_plain) runs covering `text` in order."""
        runs, at = [], 0
        for start, end in sorted(self.plain):
            if start > at:
                runs.append((self.text[at:start], False))
            if end > start:
                runs.append((self.text[start:end], True))
            at = max(at, end)
        if at < len(self.text) or not runs:
            runs.append((self.text[at:], False))
        return runs


def plain_spans(rendered: str, contents: list[str]) -> tuple[tuple[int, int], ...]:
    """Where each of `contents` (in order) sits in `rendered`, a chat template's output.

    Templates may trim message content; a content found neither verbatim nor stripped means the
    template rewrote it, and rigkit refuses rather than tokenise document text as markup."""
    spans, at = [], 0
    for content in contents:
        for candidate in (content, content.strip()):
            start = rendered.find(candidate, at) if candidate else -1
            if start >= 0:
                spans.append((start, start + len(candidate)))
                at = start + len(candidate)
                break
        else:
            if content.strip():
                raise ValueError("the chat template rewrites message content; rigkit cannot keep "
                                 "passage text apart from template markup with it")
    return tuple(spans)


@dataclass(frozen=True)
class StopRule:
    """When a segment pauses: at a sentence end, and/or after a marker's closing tag, and/or
    where `early` says so."""

    sentence: bool = True
    marker_close: str | None = None  # the marker protocol's stop string, e.g. "</retrieve>", "<|end_of_search|>"
    keep: tuple[str, ...] = ()  # the protocol's tags: kept in decoded text even where they are special tokens
    # (token texts, their log-probabilities) so far -> tokens to keep if the segment should pause
    # now, else None: a decider that knows from one token that it will fire (`prob`'s `pause_at`)
    early: Callable[[Sequence[str], Sequence[float]], int | None] | None = None


def tokenize_plain(tokenizer, text: str) -> list[int]:
    """Token ids of document or user text with no special or added token recognised in it.

    `split_special_tokens=True` turns special-token parsing off; an added token that is not
    "special" may still match, so its string is cut in two and each half tokenised alone."""
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}  # {id: AddedToken}
    if not added or not set(ids) & set(added):
        return ids
    for token in sorted((t.content for t in added.values()), key=len, reverse=True):
        at = text.find(token)
        if at >= 0 and len(token) > 1:
            mid = at + len(token) // 2
            return tokenize_plain(tokenizer, text[:mid]) + tokenize_plain(tokenizer, text[mid:])
    return ids


class PieceTokens:
    """Token ids of scaffold text (special tokens recognised), each text tokenised once: the same
    template pieces come back every round. Past `limit` texts the cache starts again; a lock
    keeps it whole when threads share one generator (a served model answering in parallel)."""

    def __init__(self, tokenizer, limit: int = 4096):
        self.tokenizer, self.limit = tokenizer, limit
        self._ids: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def __call__(self, text: str) -> list[int]:
        with self._lock:
            if text not in self._ids:
                if len(self._ids) > self.limit:
                    self._ids.clear()
                self._ids[text] = self.tokenizer(text, add_special_tokens=False).input_ids
            return self._ids[text]


def encode_transcript(prompt: Sequence[Piece], tokenizer, scaffold_tokens: Callable[[str], list[int]]) -> list[int]:
    """Token ids of a transcript, as every backend builds them: generated pieces verbatim,
    document text with no special token recognised in it (`tokenize_plain`), and the chat
    template's own text through `scaffold_tokens` (where its special tokens are real)."""
    ids: list[int] = []
    for piece in prompt:
        if piece.token_ids is not None:
            ids.extend(piece.token_ids)
            continue
        for text, plain in piece.parts():
            ids.extend(tokenize_plain(tokenizer, text) if plain else scaffold_tokens(text))
    return ids


def kept_tag_ids(tokenizer, stop: StopRule) -> frozenset[int]:
    """Special tokens that spell (part of) a marker protocol's tag: decoded text keeps them, so
    the stop rule and the decider see the tag as a string whatever the tokenizer made of it."""
    if not stop.keep:
        return frozenset()
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return frozenset(
        i for i, token in added.items()
        if getattr(token, "special", True) and str(token) and any(str(token) in tag for tag in stop.keep)
    )


def decode_keeping(tokenizer, ids: list[int], keep: frozenset[int] = frozenset()) -> str:
    """`ids` as text, special tokens skipped except those in `keep`, written as their string
    (every backend decodes generated ids this way)."""
    if not keep.intersection(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)
    out, run = [], []
    for i in ids:
        if i in keep:
            out += [tokenizer.decode(run, skip_special_tokens=True), tokenizer.convert_ids_to_tokens(i)]
            run = []
        else:
            run.append(i)
    return "".join(out) + tokenizer.decode(run, skip_special_tokens=True)
