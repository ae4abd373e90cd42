"""The context manager: what the model sees, built as an append-only list of prompt pieces.

Layouts:
- `append` (default): system, question, segment, passages (their own message), next segment...
  Every round only appends, so the generator's KV cache is reused; an eviction re-renders the
  block that held the evicted passage and the cache re-fills from there.
- `prefix`: the passages are rebuilt in front of the question every round, as FLARE and DRAGIN
  do; only the system prompt can be reused.

Passages are de-duplicated by chunk id and by a content fingerprint, capped per passage, kept
within `max_retrieval_tokens` (evicting those least related to the draft), and sanitised so that
no passage can open or close a retrieval marker.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rigkit.config import ContextConfig
from rigkit.markers import neutralize_markers
from rigkit.prompts import (
    CONTINUE_INSTRUCTION,
    QUESTION_WITH_PASSAGES,
    START_INSTRUCTION,
    detect_language,
    render_passages,
    system_prompt,
)
from rigkit.trace import Hit, Injection, Segment, TokenBudget
from rigkit.transcript import Piece

__all__ = ["ContextManager", "fingerprint", "near_duplicate"]

_SENTINEL = "\u2063RIGKIT\u2063"  # marks where the draft goes when slicing the chat template
_WORD = re.compile(r"\w+", re.UNICODE)


def fingerprint(text: str) -> frozenset[str]:
    """Word 4-shingles of the normalised text (lowercase, punctuation and spacing ignored)."""
    words = _WORD.findall(text.lower())
    if len(words) < 4:
        return frozenset([" ".join(words)])
    return frozenset(" ".join(words[i : i + 4]) for i in range(len(words) - 3))


def near_duplicate(a: frozenset[str], b: frozenset[str], threshold: float = 0.8) -> bool:
    """Overlap coefficient: a slice contained in (or nearly equal to) another counts as the same."""
    if not a or not b:
        return a == b
    return len(a & b) / min(len(a), len(b)) >= threshold


@dataclass
class _Block:
    """One injection in the append layout: the passages that are still in context."""

    hits: list[Hit] = field(default_factory=list)
    instruction: str = ""  # fixed when injected, so the block renders the same every round


class ContextManager:
    """Holds the question, the passages and the draft; renders them as prompt pieces."""

    def __init__(
        self,
        config: ContextConfig,
        count_tokens: Callable[[str], int],
        render_chat: Callable[[list[dict[str, str]], bool], str],
        context_limit: int = 8192,
        use_markers: bool = False,
    ):
        self.config = config
        self.count_tokens = count_tokens
        self.render_chat = render_chat
        self.context_limit = context_limit
        self.marker_tag = config.marker_tag if use_markers else None
        self.start("")

    # -- building the context ------------------------------------------------------------------
    def start(self, question: str, passages: Sequence[Hit] = (), history: Sequence[tuple[str, str]] = ()) -> None:
        """A fresh context for `question`; `passages` go before it (plain RAG)."""
        self.question = question
        self.language = self.config.language if self.config.language != "auto" else detect_language(question)
        self.system = self.config.system_prompt or system_prompt(self.language, self.marker_tag)
        self.history = self._bounded_history(history)
        self._events: list[Segment | _Block] = []
        self._fingerprints: dict[str, frozenset[str]] = {}
        self._rendered_blocks: dict[tuple[tuple[str, ...], str], str] = {}
        self._initial = self._admit(list(passages), Injection())

    def accept(self, segment: Segment) -> None:
        """Keep a generated segment in the transcript."""
        self._events.append(segment)

    def inject(self, hits: Sequence[Hit]) -> Injection:
        """Add new passages under the budget; report what was added, dropped and evicted."""
        injection = Injection()
        admitted = self._admit(list(hits), injection)
        if self.config.layout == "prefix":
            self._initial.extend(admitted)
        elif admitted:
            self._events.append(_Block(admitted, self._instruction()))
        self._evict_over_budget(injection, keep={h.chunk_id for h in admitted})
        injection.added = [h.chunk_id for h in admitted if h.chunk_id in self._fingerprints]
        injection.tokens_added = sum(self.count_tokens(h.text) for h in admitted if h.chunk_id in injection.added)
        return injection

    # -- what the model sees -------------------------------------------------------------------
    def pieces(self) -> list[Piece]:
        """The prompt for the next segment."""
        pieces = [Piece(self._head(), role="question")]
        for event in self._events:
            if isinstance(event, Segment):
                pieces.append(Piece(event.text, tuple(event.token_ids), role="draft"))
            elif event.hits:
                pieces.append(Piece(self._block_text(event.hits, event.instruction), role="passages"))
        return pieces

    @property
    def passages(self) -> list[Hit]:
        """Passages now in context, in the order they were injected."""
        blocks = [h for e in self._events if isinstance(e, _Block) for h in e.hits]
        return self._initial + blocks

    @property
    def draft(self) -> str:
        """The accepted answer text so far (raw: markers included)."""
        text, after_passages = "", False
        for event in self._events:
            if isinstance(event, _Block):
                after_passages = True
                continue
            if after_passages and text and not text[-1].isspace() and not event.text[:1].isspace():
                text += " "  # a new assistant turn starts without the space a sentence needs
            text, after_passages = text + event.text, False
        return text

    def budget(self) -> TokenBudget:
        system = self.count_tokens(self.system)
        question = self.count_tokens(self.question) + sum(self.count_tokens(q + a) for q, a in self.history)
        passages = sum(self.count_tokens(h.text) for h in self.passages)
        total = sum(len(p.token_ids) if p.token_ids is not None else self.count_tokens(p.text) for p in self.pieces())
        draft = sum(len(e.token_ids) for e in self._events if isinstance(e, Segment))
        scaffold = max(0, total - system - question - passages - draft)
        return TokenBudget(
            system=system + scaffold,  # template tokens count with the system prompt
            question=question,
            passages=passages,
            draft=draft,
            limit=self.context_limit,
            max_retrieval_tokens=self.config.max_retrieval_tokens,
        )

    # -- internals -----------------------------------------------------------------------------
    def _head(self) -> str:
        messages = [{"role": "system", "content": self.system}]
        for q, a in self.history:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        user = self.question
        if self._initial:
            rendered = render_passages(self._triples(self._initial), self.language)
            user = rendered + "\n\n" + QUESTION_WITH_PASSAGES[self.language].format(question=self.question)
        messages.append({"role": "user", "content": user})
        return self.render_chat(messages, True)

    def _instruction(self) -> str:
        template = CONTINUE_INSTRUCTION if self.draft.strip() else START_INSTRUCTION
        return template[self.language].format(question=self.question)

    def _block_text(self, hits: list[Hit], instruction: str) -> str:
        """Close the assistant turn, add the passages as a user message, reopen the assistant.

        Rendered once per block (and again only if an eviction changes its passages): `pieces()`
        runs every round.
        """
        key = (tuple(h.chunk_id for h in hits), instruction)
        if key not in self._rendered_blocks:
            self._rendered_blocks[key] = self._render_block(hits, instruction)
        return self._rendered_blocks[key]

    def _render_block(self, hits: list[Hit], instruction: str) -> str:
        base = [{"role": "user", "content": "q"}]
        before = self.render_chat(base + [{"role": "assistant", "content": _SENTINEL}], False)
        after = self.render_chat(
            base + [{"role": "assistant", "content": _SENTINEL},
                    {"role": "user", "content": render_passages(self._triples(hits), self.language, instruction)}],
            True,
        )
        cut = after.index(_SENTINEL) + len(_SENTINEL)
        if after[:cut] != before[: before.index(_SENTINEL) + len(_SENTINEL)]:
            raise ValueError("the chat template does not render turns append-only")
        return after[cut:]

    def _triples(self, hits: list[Hit]) -> list[tuple[str, str, str]]:
        tag = self.config.marker_tag
        return [(h.chunk_id, neutralize_markers(h.title, tag), neutralize_markers(h.text, tag)) for h in hits]

    def _admit(self, hits: list[Hit], injection: Injection) -> list[Hit]:
        """New, non-duplicate passages, each capped to `max_passage_tokens`."""
        admitted = []
        for hit in hits:
            shingles = fingerprint(hit.text)
            if hit.chunk_id in self._fingerprints or any(
                near_duplicate(shingles, other) for other in self._fingerprints.values()
            ):
                injection.dropped_duplicates.append(hit.chunk_id)
                continue
            self._fingerprints[hit.chunk_id] = shingles
            admitted.append(self._capped(hit))
        return admitted

    def _capped(self, hit: Hit) -> Hit:
        limit = self.config.max_passage_tokens
        if self.count_tokens(hit.text) <= limit:
            return hit
        words = hit.text.split(" ")
        lo, hi = 0, len(words)
        while lo < hi:  # the longest word prefix within the limit
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.count_tokens(" ".join(words[:mid])) <= limit else (lo, mid - 1)
        text = " ".join(words[:lo]) + " …"
        return Hit(**{**hit.__dict__, "text": text, "metadata": {**hit.metadata, "truncated": True}})

    def _evict_over_budget(self, injection: Injection, keep: set[str]) -> None:
        """Evict passages least related to the draft until the passages fit the budget."""
        limit = self.config.max_retrieval_tokens
        while sum(self.count_tokens(h.text) for h in self.passages) > limit:
            focus = set(_WORD.findall((self.question + " " + self.draft).lower()))
            old = [h for h in self.passages if h.chunk_id not in keep]
            pool = old or [h for h in self.passages]
            victim = min(pool, key=lambda h: (len(focus & set(_WORD.findall(h.text.lower()))), -pool.index(h)))
            self._remove(victim.chunk_id)
            (injection.evicted if old else injection.dropped_budget).append(victim.chunk_id)

    def _remove(self, chunk_id: str) -> None:
        self._initial = [h for h in self._initial if h.chunk_id != chunk_id]
        for event in self._events:
            if isinstance(event, _Block):
                event.hits = [h for h in event.hits if h.chunk_id != chunk_id]
        self._fingerprints.pop(chunk_id, None)

    def _bounded_history(self, history: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """The most recent earlier turns that fit `max_history_tokens`."""
        kept, used = [], 0
        for q, a in reversed(list(history)):
            used += self.count_tokens(q) + self.count_tokens(a)
            if used > self.config.max_history_tokens:
                break
            kept.append((q, a))
        return list(reversed(kept))
