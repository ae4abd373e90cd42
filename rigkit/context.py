"""The context manager: what the model sees, built as an append-only list of prompt pieces.

Layouts:
- `append` (default): system, question, segment, passages (their own message), next segment...
  Every round only appends, so the generator's KV cache is reused; an eviction re-renders the
  block that held the evicted passage and the cache re-fills from there.
- `prefix`: the passages are rebuilt in front of the question every round, as FLARE and DRAGIN
  do; only the system prompt can be reused.
With an inline marker protocol (Search-R1 `<information>`, R1-Searcher, Self-RAG) a block of
passages goes inside the open assistant turn, between the protocol's result tags, instead of in a
user message of its own: still appended, so the KV cache is reused the same way.

Passages are de-duplicated by chunk id and by a content fingerprint, capped per passage, kept
within `max_retrieval_tokens` (evicting those least related to the draft), and sanitised so that
no passage can open or close a retrieval marker or plant a citation. Every retriever's hits pass
the same checks here, where they enter the context, so a remote retrieval server or a notebook's
own retriever cannot skip what a local corpus is held to: an id the corpus would refuse
(`check_doc_id`: `[[`/`]]`, control characters, over-long) is replaced by a stable stand-in
(`passage-<hash>`, the original kept in `metadata["original_id"]`), and titles and texts are
defused when rendered.

Budgets are the same for every system: `max_retrieval_tokens` bounds the tokens the passages
occupy as the model reads them (citation ids, titles, texts, the header and turn tokens of their
message), whether they came up front (plain RAG: the lowest-ranked are dropped first) or were
injected mid-answer. A passage cut to `max_passage_tokens` is listed in `Injection.truncated`.
`fit` keeps system + question + passages + draft + the next segment within the model's context
by evicting injected passages, and refuses with an `InputError` when that is not enough.

Relevance (`rigkit.compression`): `passage_share` can bound the passages by a share of the
model's context; `allocate: score` drops the lowest-scored passage first; `compress` shortens
each passage once on its way in (`Injection.compressed`); `order` sets the reading order within
a block; earlier turns beyond `max_history_tokens` become one summary turn (`history_fit`).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from rigkit.compression import (
    Compressor,
    HistorySummarizer,
    check_context_options,
    compressed_hit,
    compression_target,
    fit_history,
    ordered,
)
from rigkit.config import DEFAULT_CONTEXT_LIMIT, ContextConfig
from rigkit.corpus import check_doc_id
from rigkit.errors import InputError
from rigkit.grounding import check_grounding_options
from rigkit.markers import (
    MarkerProtocol,
    format_passages,
    neutralize_markers,
    render_results,
    resolve_protocol,
)
from rigkit.prompts import (
    CONTINUE_INSTRUCTION,
    QUESTION_WITH_PASSAGES,
    START_INSTRUCTION,
    render_passages,
    system_prompt,
)
from rigkit.text import detect_language, neutralize_citations
from rigkit.trace import HistoryFit, Hit, Injection, Segment, TokenBudget
from rigkit.transcript import Piece, plain_spans

__all__ = ["ContextManager", "fingerprint", "near_duplicate", "held_to_corpus_rules"]

log = logging.getLogger(__name__)

_SENTINEL = "\u2063RIGKIT\u2063"  # marks where the draft goes when slicing the chat template
_WORD = re.compile(r"\w+", re.UNICODE)


def fingerprint(text: str) -> frozenset[str]:
    """Word 4-shingles of the normalised text (lowercase, punctuation and spacing ignored)."""
    words = _WORD.findall(text.lower())
    if len(words) < 4:
        return frozenset([" ".join(words)])
    return frozenset(" ".join(words[i : i + 4]) for i in range(len(words) - 3))


def held_to_corpus_rules(hit: Hit) -> Hit:
    """`hit` with ids a corpus would accept: an unusable chunk or document id (one that could
    close a citation tag, break a line or hide in a terminal) becomes `passage-<hash>`."""
    fixes = {}
    for name in ("chunk_id", "doc_id"):
        value = getattr(hit, name)
        if check_doc_id(value) is not None:
            fixes[name] = "passage-" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    if not fixes:
        return hit
    log.warning("a retrieved passage's id %s (%s) was replaced by %s", ascii(hit.chunk_id)[:80],
                check_doc_id(hit.chunk_id) or check_doc_id(hit.doc_id), fixes.get("chunk_id", hit.chunk_id))
    metadata = {**hit.metadata, "original_id": hit.chunk_id}
    return replace(hit, **fixes, metadata=metadata)


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
        context_limit: int = DEFAULT_CONTEXT_LIMIT,
        use_markers: bool = False,
        protocol: MarkerProtocol | None = None,
        compressor: Compressor | None = None,
        summarizer: HistorySummarizer | None = None,
    ):
        check_context_options(config)
        check_grounding_options(config.grounding, config.cite)
        self.config = config
        self.compressor = compressor  # context.compress; None: passages are only capped
        self.summarizer = summarizer  # None: turns beyond max_history_tokens are dropped
        self.count_tokens = count_tokens
        self.render_chat = render_chat
        self.context_limit = context_limit
        # the tag vocabulary: passages are neutralised against it always; when the run uses
        # markers it also sets the system prompt, the stop rule and where passages go
        self.protocol = protocol or resolve_protocol(config.marker_protocol, config.marker_tag)
        self.marker_protocol = self.protocol if use_markers else None
        self.start("")

    # -- building the context ------------------------------------------------------------------
    def start(self, question: str, passages: Sequence[Hit] = (), history: Sequence[tuple[str, str]] = ()) -> None:
        """A fresh context for `question`; `passages` go before it (plain RAG)."""
        self.question = question
        self.language = self.config.language if self.config.language != "auto" else detect_language(question)
        self.system = self.config.system_prompt or system_prompt(self.language, self.marker_protocol)
        self.history, self.history_fit = self._bounded_history(history)
        self._events: list[Segment | _Block] = []
        self._fingerprints: dict[str, frozenset[str]] = {}
        self._seen: dict[str, Hit] = {}  # chunk id -> passage as injected, kept after eviction
        self._rendered_blocks: dict[tuple[tuple[str, ...], str], Piece] = {}
        self._token_counts: dict[tuple[tuple[str, ...], str], int] = {}
        self._compressions: dict[str, tuple[Hit, dict | None]] = {}  # once per passage: the KV cache holds it
        upfront = Injection(passage_budget=self.passage_budget)
        self._initial = self._admit(list(passages), upfront)
        self._upfront_ids = {h.chunk_id for h in self._initial}  # given, not retrieved: never evicted
        while self._initial and self._passage_tokens() > self.passage_budget:
            # plain RAG keeps the retriever's best-ranked passages (allocate: score, the best-scored)
            at = -1 if self.config.allocate == "rank" else min(
                range(len(self._initial)), key=lambda i: (self._initial[i].score, -i))
            dropped = self._initial.pop(at)
            self._forget(dropped.chunk_id)
            upfront.dropped_budget.insert(0, dropped.chunk_id)
        upfront.added = [h.chunk_id for h in self._initial]
        upfront.truncated = [c for c in upfront.truncated if c in upfront.added]
        upfront.compressed = {c: r for c, r in upfront.compressed.items() if c in upfront.added}
        upfront.tokens_added = self._passage_tokens()
        self.upfront = upfront  # what became of the up-front passages: kept, over budget, cut

    def accept(self, segment: Segment) -> None:
        """Keep a generated segment in the transcript."""
        self._events.append(segment)

    def inject(self, hits: Sequence[Hit]) -> Injection:
        """Add new passages under the budget; report what was added, dropped and evicted."""
        injection = Injection(passage_budget=self.passage_budget)
        admitted = self._admit(list(hits), injection)
        if self.config.layout == "prefix":
            self._initial.extend(admitted)
        elif admitted:
            self._events.append(_Block(admitted, self._instruction()))
        self._evict_over_budget(injection, keep={h.chunk_id for h in admitted})
        injection.added = [h.chunk_id for h in admitted if h.chunk_id in self._fingerprints]
        injection.truncated = [c for c in injection.truncated if c in injection.added]
        injection.compressed = {c: r for c, r in injection.compressed.items() if c in injection.added}
        others = {h.chunk_id for h in self.passages} - set(injection.added)
        injection.tokens_added = self._passage_tokens(exclude=others) if injection.added else 0
        return injection

    def fit(self, reserve: int) -> list[str]:
        """Make room for `reserve` more tokens (the next segment) within the model's context.

        Evicts injected passages, least related to the draft first, and returns their chunk ids;
        raises `InputError` when even without them system + question + up-front passages + draft
        + `reserve` exceed the context (plain RAG cannot drop what it was given)."""
        evicted: list[str] = []
        while (used := self.budget().used) + reserve > self.context_limit:
            pool = [h for h in self.passages if h.chunk_id not in self._upfront_ids]
            if not pool:
                b = self.budget()
                raise InputError(
                    f"the context does not fit the model: system {b.system} + question {b.question} + "
                    f"passages {b.passages} + draft {b.draft} + next segment {reserve} = {used + reserve} "
                    f"tokens > the model's {self.context_limit}; lower max_retrieval_tokens, "
                    "max_passage_tokens or the answer length"
                )
            victim = self._least_related(pool)
            self._remove(victim.chunk_id)
            evicted.append(victim.chunk_id)
        return evicted

    # -- what the model sees -------------------------------------------------------------------
    def pieces(self) -> list[Piece]:
        """The prompt for the next segment."""
        pieces = [self._head()]
        for event in self._events:
            if isinstance(event, Segment):
                pieces.append(Piece(event.text, tuple(event.token_ids), role="draft"))
            elif event.hits:
                pieces.append(self._block_text(event.hits, event.instruction))
        return pieces

    @property
    def passages(self) -> list[Hit]:
        """Passages now in context, in the order they were injected."""
        blocks = [h for e in self._events if isinstance(e, _Block) for h in e.hits]
        return self._initial + blocks

    @property
    def draft(self) -> str:
        """The accepted answer text so far (raw: markers included)."""
        return "".join(text for text, _ in self.draft_parts())

    def draft_parts(self) -> list[tuple[str, Segment]]:
        """The draft as (text, accepted segment) pieces, in order; they concatenate to `draft`."""
        parts: list[tuple[str, Segment]] = []
        last, after_passages = "", False
        for event in self._events:
            if isinstance(event, _Block):
                after_passages = True
                continue
            text = event.text
            if after_passages and last and not last[-1].isspace() and not text[:1].isspace():
                text = " " + text  # a new assistant turn starts without the space a sentence needs
            parts.append((text, event))
            last, after_passages = (last + text)[-1:], False
        return parts

    @property
    def seen_passages(self) -> list[Hit]:
        """Every passage that has been in context this question, evicted ones included."""
        return list(self._seen.values())

    @property
    def passage_numbers(self) -> dict[str, int]:
        """Chunk id -> the number a passage is labelled with under `cite: model`: 1, 2, ... in the
        order passages first entered the context. An evicted passage keeps its number; one dropped
        before the model read it gives its number to the passages after it in the same block."""
        return {chunk_id: n for n, chunk_id in enumerate(self._seen, 1)}

    def budget(self) -> TokenBudget:
        """Where the prompt's tokens go; the parts add up to its length (see `TokenBudget`)."""
        system = self.count_tokens(self.system)
        question = self.count_tokens(self.question) + sum(self.count_tokens(q + a) for q, a in self.history)
        passages = self._passage_tokens()
        total = sum(len(p.token_ids) if p.token_ids is not None else self.count_tokens(p.text) for p in self.pieces())
        draft = sum(len(e.token_ids) for e in self._events if isinstance(e, Segment))
        scaffold = max(0, total - system - question - passages - draft)
        return TokenBudget(
            system=system + scaffold,  # the chat template's own tokens count with the system prompt
            question=question,
            passages=passages,
            draft=draft,
            limit=self.context_limit,
            max_retrieval_tokens=self.passage_budget,
        )

    @property
    def passage_budget(self) -> int:
        """The passages' budget: `max_retrieval_tokens`, or `passage_share` of the model's context
        when that is smaller (the rest is for system prompt, question, history and answer)."""
        share = self.config.passage_share
        limit = self.config.max_retrieval_tokens
        return limit if share is None else min(limit, int(share * self.context_limit))

    # -- internals -----------------------------------------------------------------------------
    def _head(self) -> Piece:
        messages = [{"role": "system", "content": self.system}]
        for q, a in self.history:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": self._user_message(self._initial)})
        rendered = self.render_chat(messages, True)
        # The user's and the documents' words are data: tokenised with special tokens off.
        data = [m["content"] for m in messages[1:] if m["role"] in ("user", "assistant")]
        return Piece(rendered, role="question", plain=plain_spans(rendered, data))

    def _user_message(self, passages: list[Hit]) -> str:
        """The question, after the up-front passages when there are any (plain RAG)."""
        if not passages:
            return self.question
        rendered = render_passages(self._triples(passages), self.language, **self._passage_rules())
        return rendered + "\n\n" + QUESTION_WITH_PASSAGES[self.language].format(question=self.question)

    def _passage_rules(self) -> dict:
        """How the passages message labels passages and what it asks (context.cite, context.grounding)."""
        numbers = self.passage_numbers if self.config.cite == "model" else None
        return {"numbers": numbers, "strict": self.config.grounding == "strict"}

    def _instruction(self) -> str:
        template = CONTINUE_INSTRUCTION if self.draft.strip() else START_INSTRUCTION
        return template[self.language].format(question=self.question)

    def _block_text(self, hits: list[Hit], instruction: str) -> Piece:
        """Close the assistant turn, add the passages as a user message, reopen the assistant.

        Rendered once per block (and again only if an eviction changes its passages): `pieces()`
        runs every round.
        """
        key = (tuple(h.chunk_id for h in hits), instruction)
        if key not in self._rendered_blocks:
            self._rendered_blocks[key] = self._render_block(hits, instruction)
        return self._rendered_blocks[key]

    def _render_block(self, hits: list[Hit], instruction: str) -> Piece:
        if self.marker_protocol is not None and self.marker_protocol.inline:
            return self._render_inline(hits)
        base = [{"role": "user", "content": "q"}]
        before = self.render_chat(base + [{"role": "assistant", "content": _SENTINEL}], False)
        content = render_passages(self._triples(hits), self.language, instruction, **self._passage_rules())
        after = self.render_chat(
            base + [{"role": "assistant", "content": _SENTINEL}, {"role": "user", "content": content}],
            True,
        )
        cut = after.index(_SENTINEL) + len(_SENTINEL)
        if after[:cut] != before[: before.index(_SENTINEL) + len(_SENTINEL)]:
            raise ValueError("the chat template does not render turns append-only")
        text = after[cut:]
        return Piece(text, role="passages", plain=plain_spans(text, [content]))

    def _render_inline(self, hits: list[Hit]) -> Piece:
        """Search-R1 / R1-Searcher style: the results go inside the open assistant turn, between
        the protocol's result tags, and the model goes on writing right after them."""
        triples = self._triples(hits)
        text = render_results(self.marker_protocol, triples)
        return Piece(text, role="passages", plain=plain_spans(text, [format_passages(self.marker_protocol, triples)]))

    def _triples(self, hits: list[Hit]) -> list[tuple[str, str, str]]:
        """(id, title, text) with markers and citation tags defused: passages are data."""
        p = self.protocol

        def defuse(text: str) -> str:
            return neutralize_citations(neutralize_markers(text, p))

        return [(h.chunk_id, defuse(h.title), defuse(h.text)) for h in ordered(hits, self.config.order)]

    def _passage_tokens(self, exclude: set[str] = frozenset()) -> int:
        """Tokens the passages occupy as rendered (ids, titles, texts, headers, turn tokens);
        `exclude`: leave these passages out (a block left empty costs nothing)."""
        total = 0
        initial = [h for h in self._initial if h.chunk_id not in exclude]
        if initial:  # what the up-front passages add to the question message (labels included)
            total += self._count_rendered(initial, "", lambda: self._user_message(initial)) - self.count_tokens(
                self.question)
        for event in self._events:
            hits = [h for h in event.hits if h.chunk_id not in exclude] if isinstance(event, _Block) else []
            if hits:
                render = lambda h=hits, i=event.instruction: self._block_text(h, i).text  # noqa: E731
                total += self._count_rendered(hits, event.instruction, render)
        return total

    def _count_rendered(self, hits: list[Hit], instruction: str, render: Callable[[], str]) -> int:
        key = (tuple(h.chunk_id for h in hits), instruction if instruction else "\0head")
        if key not in self._token_counts:
            self._token_counts[key] = self.count_tokens(render())
        return self._token_counts[key]

    def _least_related(self, pool: list[Hit]) -> Hit:
        """The passage sharing the fewest words with the question and draft (the oldest on ties)."""
        focus = set(_WORD.findall((self.question + " " + self.draft).lower()))
        return min(pool, key=lambda h: (len(focus & set(_WORD.findall(h.text.lower()))), -pool.index(h)))

    def _admit(self, hits: list[Hit], injection: Injection) -> list[Hit]:
        """New, non-duplicate passages, each capped to `max_passage_tokens`."""
        admitted = []
        share = self.passage_budget // max(1, len(hits))  # each passage's share, for compression
        for hit in map(held_to_corpus_rules, hits):
            shingles = fingerprint(hit.text)
            if hit.chunk_id in self._fingerprints or any(
                near_duplicate(shingles, other) for other in self._fingerprints.values()
            ):
                injection.dropped_duplicates.append(hit.chunk_id)
                continue
            self._fingerprints[hit.chunk_id] = shingles
            hit = self._compressed(hit, share, injection)
            admitted.append(self._capped(hit))
            if admitted[-1] is not hit:
                injection.truncated.append(hit.chunk_id)
            self._seen[hit.chunk_id] = admitted[-1]
        return admitted

    def _compressed(self, hit: Hit, share: int, injection: Injection) -> Hit:
        """`hit` compressed for the question and the draft's tail (`context.compress`), once per
        passage per question: a passage that comes back reads the same as before."""
        if self.compressor is None:
            return hit
        if hit.chunk_id not in self._compressions:
            size = self.count_tokens(hit.text)
            target = compression_target(size, self.config.compress_ratio, self.config.max_passage_tokens, share)
            focus = (self.question + " " + self.draft[-300:]).strip()
            self._compressions[hit.chunk_id] = compressed_hit(self.compressor, focus, hit, target, self.count_tokens)
        compressed, record = self._compressions[hit.chunk_id]
        if record is not None:
            injection.compressed[hit.chunk_id] = record
        return compressed

    def _capped(self, hit: Hit) -> Hit:
        limit = self.config.max_passage_tokens
        size = self.count_tokens(hit.text)
        if size <= limit:
            return hit
        words = hit.text.split(" ")
        lo, hi = 0, len(words)
        while lo < hi:  # the longest word prefix within the limit
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.count_tokens(" ".join(words[:mid])) <= limit else (lo, mid - 1)
        text = " ".join(words[:lo]) + " …"
        metadata = {**hit.metadata, "truncated": True, "original_tokens": size}
        return Hit(**{**hit.__dict__, "text": text, "metadata": metadata})

    def _evict_over_budget(self, injection: Injection, keep: set[str]) -> None:
        """Evict passages least related to the draft until the passages fit the budget."""
        limit = self.passage_budget
        while self.passages and self._passage_tokens() > limit:
            old = [h for h in self.passages if h.chunk_id not in keep and h.chunk_id not in self._upfront_ids]
            new = [h for h in self.passages if h.chunk_id in keep]
            if self.config.allocate == "score":  # the lowest score goes, a new one before an old on ties
                pool = old + new
                victim = min(pool, key=lambda h: (h.score, h.chunk_id not in keep), default=None)
            else:
                pool = old or new
                victim = self._least_related(pool) if pool else None
            if victim is None:
                break  # only up-front passages are left: they were fitted to the budget at `start`
            if victim.chunk_id not in keep:
                self._remove(victim.chunk_id)
                injection.evicted.append(victim.chunk_id)
            else:
                self._forget(victim.chunk_id)  # never in context: not citable
                injection.dropped_budget.append(victim.chunk_id)

    def _remove(self, chunk_id: str) -> None:
        self._initial = [h for h in self._initial if h.chunk_id != chunk_id]
        for event in self._events:
            if isinstance(event, _Block):
                event.hits = [h for h in event.hits if h.chunk_id != chunk_id]
        self._fingerprints.pop(chunk_id, None)

    def _forget(self, chunk_id: str) -> None:
        """Remove a passage that never reached the model (dropped for the budget)."""
        self._remove(chunk_id)
        self._seen.pop(chunk_id, None)

    def _bounded_history(self, history: Sequence[tuple[str, str]]) -> tuple[list[tuple[str, str]], HistoryFit | None]:
        """The most recent earlier turns within `max_history_tokens`, older ones summarised or dropped."""
        return fit_history(list(history), self.config.max_history_tokens, self.count_tokens,
                           self.summarizer, self.language)
