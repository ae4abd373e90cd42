"""What a passage goes through on its way into the context, and the passages seen this question.

Every retriever's hits pass the same checks here, so a remote retrieval server or a notebook's own
retriever cannot skip what a local corpus is held to: an id the corpus would refuse
(`check_doc_id`: `[[`/`]]`, control characters, over-long) is replaced by a stable stand-in
(`passage-<hash>`, the original kept in `metadata["original_id"]`); a passage already in context
(same chunk id, or nearly the same words) is dropped; `context.compress` shortens it once per
question; `max_passage_tokens` caps it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from rigkit.compression import Compressor, compressed_hit, compression_target
from rigkit.config import ContextConfig
from rigkit.corpus import held_to_corpus_rules
from rigkit.trace import Hit, Injection
from rigkit.truncation import cap_text

__all__ = ["PassageStore", "fingerprint", "near_duplicate", "held_to_corpus_rules", "shared_words",
           "least_related", "relevance_cut"]

_WORD = re.compile(r"\w+", re.UNICODE)


def fingerprint(text: str) -> frozenset[str]:
    """Word 4-shingles of the normalised text (lowercase, punctuation and spacing ignored)."""
    words = _WORD.findall(text.lower())
    if len(words) < 4:
        return frozenset([" ".join(words)])
    return frozenset(" ".join(words[i : i + 4]) for i in range(len(words) - 3))


def shared_words(text: str) -> set[str]:
    """The lowercased words of `text`, for relatedness by shared words."""
    return set(_WORD.findall(text.lower()))


def least_related(pool: list[Hit], focus: str) -> Hit:
    """The passage sharing the fewest words with `focus` (question and draft), the oldest on ties."""
    words = shared_words(focus)
    return min(pool, key=lambda h: (len(words & shared_words(h.text)), -pool.index(h)))


def near_duplicate(a: frozenset[str], b: frozenset[str], threshold: float = 0.8) -> bool:
    """Overlap coefficient: a slice contained in (or nearly equal to) another counts as the same."""
    if not a or not b:
        return a == b
    return len(a & b) / min(len(a), len(b)) >= threshold


def relevance_cut(hits: list[Hit], bm25_share: float = 0.0,
                  dense_gap: float | None = None) -> tuple[list[Hit], list[str]]:
    """The hits worth injecting, and the chunk ids of those cut: a hit after the first stays only if
    its raw BM25 score is at least `bm25_share` of the first hit's and its dense cosine is at most
    `dense_gap` below the first's. A search's runners-up that score far below its best are mostly
    other paragraphs on the same words (distractors); a score a hit or the first lacks is not judged."""
    if len(hits) < 2 or (bm25_share <= 0 and dense_gap is None):
        return list(hits), []
    best = hits[0].scores
    kept, cut = [hits[0]], []
    for hit in hits[1:]:
        bm25, dense = hit.scores.get("bm25"), hit.scores.get("dense")
        low_bm25 = (bm25_share > 0 and bm25 is not None and best.get("bm25") is not None
                    and bm25 < bm25_share * best["bm25"])
        far_dense = (dense_gap is not None and dense is not None and best.get("dense") is not None
                     and best["dense"] - dense > dense_gap)
        if low_bm25 or far_dense:
            cut.append(hit.chunk_id)
        else:
            kept.append(hit)
    return kept, cut


class PassageStore:
    """The passages of one question: which are in context (by fingerprint), which were ever read
    (kept after eviction, for citations), and each one's compressed form."""

    def __init__(self, config: ContextConfig, count_tokens: Callable[[str], int],
                 compressor: Compressor | None = None):
        self.config = config
        self.count_tokens = count_tokens
        self.compressor = compressor  # context.compress; None: passages are only capped
        self.clear()

    def clear(self) -> None:
        """Forget every passage (a new question)."""
        self._fingerprints: dict[str, frozenset[str]] = {}
        self._seen: dict[str, Hit] = {}  # chunk id -> passage as injected, kept after eviction
        self._compressions: dict[str, tuple[Hit, dict | None]] = {}  # once per passage: the KV cache holds it

    def admit(self, hits: list[Hit], injection: Injection, share: int, focus: Callable[[], str]) -> list[Hit]:
        """New, non-duplicate passages, each capped to `max_passage_tokens`; `share` is each
        passage's part of the budget and `focus` what compression keeps (question and draft)."""
        admitted = []
        for hit in map(held_to_corpus_rules, hits):
            shingles = fingerprint(hit.text)
            if hit.chunk_id in self._fingerprints or any(
                near_duplicate(shingles, other) for other in self._fingerprints.values()
            ):
                injection.dropped_duplicates.append(hit.chunk_id)
                continue
            self._fingerprints[hit.chunk_id] = shingles
            hit = self._compressed(hit, share, injection, focus)
            admitted.append(self._capped(hit))
            if admitted[-1] is not hit:
                injection.truncated.append(hit.chunk_id)
            self._seen[hit.chunk_id] = admitted[-1]
        return admitted

    def holds(self, chunk_id: str) -> bool:
        """Whether the passage is in context now."""
        return chunk_id in self._fingerprints

    def release(self, chunk_id: str) -> None:
        """The passage left the context (evicted): it may come back; it stays citable."""
        self._fingerprints.pop(chunk_id, None)

    def forget(self, chunk_id: str) -> None:
        """The passage never reached the model (dropped for the budget): not citable."""
        self.release(chunk_id)
        self._seen.pop(chunk_id, None)

    @property
    def seen(self) -> list[Hit]:
        """Every passage that has been in context this question, evicted ones included."""
        return list(self._seen.values())

    @property
    def numbers(self) -> dict[str, int]:
        """Chunk id -> 1, 2, ... in the order passages first entered the context."""
        return {chunk_id: n for n, chunk_id in enumerate(self._seen, 1)}

    def _compressed(self, hit: Hit, share: int, injection: Injection, focus: Callable[[], str]) -> Hit:
        """`hit` compressed for the question and the draft's tail (`context.compress`), once per
        passage per question: a passage that comes back reads the same as before."""
        if self.compressor is None:
            return hit
        if hit.chunk_id not in self._compressions:
            size = self.count_tokens(hit.text)
            target = compression_target(size, self.config.compress_ratio, self.config.max_passage_tokens, share)
            self._compressions[hit.chunk_id] = compressed_hit(self.compressor, focus(), hit, target, self.count_tokens)
        compressed, record = self._compressions[hit.chunk_id]
        if record is not None:
            injection.compressed[hit.chunk_id] = record
        return compressed

    def _capped(self, hit: Hit) -> Hit:
        limit = self.config.max_passage_tokens
        size = self.count_tokens(hit.text)
        if size <= limit:
            return hit
        text = cap_text(hit.text, limit, self.count_tokens)  # at spaces, or between CJK characters
        metadata = {**hit.metadata, "truncated": True, "original_tokens": size}
        return Hit(**{**hit.__dict__, "text": text, "metadata": metadata})
