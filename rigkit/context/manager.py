"""`ContextManager`: what the model sees for one question, as an append-only list of prompt pieces.

It holds the question and composes the parts: the `PassageStore` (what a passage goes through on
its way in), the `Layout` (where passages and segments sit), the `Renderer` (prompt pieces and
what the passages cost) and the budget kept here (`fit`, eviction, `TokenBudget`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rigkit.compression import Compressor, HistorySummarizer, check_context_options, fit_history
from rigkit.config import DEFAULT_CONTEXT_LIMIT, ContextConfig
from rigkit.context.layout import Layout
from rigkit.context.render import Asked, Renderer
from rigkit.context.store import PassageStore, least_related, relevance_cut
from rigkit.errors import InputError
from rigkit.grounding import check_grounding_options
from rigkit.markers import MarkerProtocol, resolve_protocol
from rigkit.prompts import CONTINUE_INSTRUCTION, GO_ON_INSTRUCTION, START_INSTRUCTION, system_prompt
from rigkit.text import detect_language
from rigkit.trace import HistoryFit, Hit, Injection, Segment, TokenBudget
from rigkit.transcript import Piece

__all__ = ["ContextManager"]


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
        tools_prompt: str = "",
    ):
        check_context_options(config)
        check_grounding_options(config.grounding, config.cite)
        self.config = config
        self.summarizer = summarizer  # None: turns beyond max_history_tokens are dropped
        self.count_tokens = count_tokens
        self.render_chat = render_chat
        self.context_limit = context_limit
        # the tag vocabulary: passages are neutralised against it always; when the run uses
        # markers it also sets the system prompt, the stop rule and where passages go
        self.protocol = protocol or resolve_protocol(config.marker_protocol, config.marker_tag)
        self.marker_protocol = self.protocol if use_markers else None
        self.store = PassageStore(config, count_tokens, compressor)
        self.renderer = Renderer(config, count_tokens, render_chat, self.protocol, self.marker_protocol,
                                 lambda: self.store.numbers)
        self.tools_prompt = tools_prompt  # a client's tools, described after the system prompt (rigkit.serve.tools)
        self.start("")

    @property
    def compressor(self) -> Compressor | None:
        """`context.compress`; None: passages are only capped."""
        return self.store.compressor

    # -- building the context ------------------------------------------------------------------
    def start(self, question: str, passages: Sequence[Hit] = (), history: Sequence[tuple[str, str]] = ()) -> None:
        """A fresh context for `question`; `passages` go before it (plain RAG)."""
        self.question = question
        self.language = self.config.language if self.config.language != "auto" else detect_language(question)
        self.system = self.config.system_prompt or system_prompt(self.language, self.marker_protocol)
        if self.tools_prompt:
            self.system += "\n\n" + self.tools_prompt
        self.history, self.history_fit = self._bounded_history(history)
        self.store.clear()
        self.renderer.start(Asked(question, self.language, self.system, self.history))
        self.layout = Layout()
        upfront = Injection(passage_budget=self.passage_budget)
        self.layout.initial = self._admit(list(passages), upfront)
        self._upfront_ids = {h.chunk_id for h in self.layout.initial}  # given, not retrieved: never evicted
        while (initial := self.layout.initial) and self._passage_tokens() > self.passage_budget:
            # plain RAG keeps the retriever's best-ranked passages (allocate: score, the best-scored)
            at = -1 if self.config.allocate == "rank" else min(
                range(len(initial)), key=lambda i: (initial[i].score, -i))
            dropped = initial.pop(at)
            self._forget(dropped.chunk_id)
            upfront.dropped_budget.insert(0, dropped.chunk_id)
        upfront.added = [h.chunk_id for h in self.layout.initial]
        upfront.truncated = [c for c in upfront.truncated if c in upfront.added]
        upfront.compressed = {c: r for c, r in upfront.compressed.items() if c in upfront.added}
        upfront.tokens_added = self._passage_tokens()
        self.upfront = upfront  # what became of the up-front passages: kept, over budget, cut

    def accept(self, segment: Segment) -> None:
        """Keep a generated segment in the transcript."""
        self.layout.accept(segment)

    def replace_last(self, segment: Segment) -> None:
        """Put a grounded rewrite in place of the last accepted segment (nothing follows it)."""
        self.layout.replace_last(segment)

    def inject(self, hits: Sequence[Hit]) -> Injection:
        """Add new passages under the budget; report what was added, dropped and evicted."""
        injection = Injection(passage_budget=self.passage_budget)
        hits, injection.dropped_relevance = relevance_cut(list(hits), self.config.cut_bm25_share,
                                                          self.config.cut_dense_gap)
        admitted = self._admit(hits, injection)
        prefix = self.config.layout == "prefix"
        self.layout.add(admitted, "" if prefix or not admitted else self._instruction(), prefix)
        self._evict_over_budget(injection, keep={h.chunk_id for h in admitted})
        injection.added = [h.chunk_id for h in admitted if self.store.holds(h.chunk_id)]
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
            victim = least_related(pool, self.question + " " + self.draft)
            self._remove(victim.chunk_id)
            evicted.append(victim.chunk_id)
        return evicted

    # -- what the model sees -------------------------------------------------------------------
    def pieces(self) -> list[Piece]:
        """The prompt for the next segment."""
        return self.renderer.pieces(self.layout)

    def grounding_pieces(self, segment: Segment, reserve: int) -> list[Piece] | None:
        """The prompt for writing `segment`, the last accepted one, again under the strict grounding
        prompt: the context without it, then the passages it could see (those still in context)
        in a message asking to answer only from them, and the start / continue instruction.

        None when something follows the segment (passages asked for by it), none of its passages
        is left, or the prompt and `reserve` more tokens would not fit the model's context."""
        events = self.layout.events
        if not events or events[-1] != segment:  # equal, not the same object: a restored run rebuilds both
            return None
        seen = set(segment.context_ids or ())
        hits = [h for h in self.passages if h.chunk_id in seen]
        if not hits:
            return None
        before = "".join(text for text, _ in self.draft_parts()[:-1])
        template = CONTINUE_INSTRUCTION if before.strip() else START_INSTRUCTION
        block = self.renderer.grounding_block(hits, template[self.language].format(question=self.question))
        pieces = [*self.pieces()[:-1], block]
        used = self.budget().used - len(segment.token_ids) + self.count_tokens(block.text)
        return pieces if used + reserve <= self.context_limit else None

    @property
    def passages(self) -> list[Hit]:
        """Passages now in context, in the order they were injected."""
        return self.layout.passages

    @property
    def draft(self) -> str:
        """The accepted answer text so far (raw: markers included)."""
        return self.layout.draft

    def draft_parts(self) -> list[tuple[str, Segment]]:
        """The draft as (text, accepted segment) pieces, in order; they concatenate to `draft`."""
        return self.layout.draft_parts()

    @property
    def seen_passages(self) -> list[Hit]:
        """Every passage that has been in context this question, evicted ones included."""
        return self.store.seen

    @property
    def passage_numbers(self) -> dict[str, int]:
        """Chunk id -> the number a passage is labelled with under `cite: model`: 1, 2, ... in the
        order passages first entered the context. An evicted passage keeps its number; one dropped
        before the model read it gives its number to the passages after it in the same block."""
        return self.store.numbers

    def budget(self) -> TokenBudget:
        """Where the prompt's tokens go; the parts add up to its length (see `TokenBudget`)."""
        system = self.count_tokens(self.system)
        question = self.count_tokens(self.question) + sum(self.count_tokens(q + a) for q, a in self.history)
        passages = self._passage_tokens()
        total = sum(len(p.token_ids) if p.token_ids is not None else self.count_tokens(p.text) for p in self.pieces())
        draft = sum(len(s.token_ids) for s in self.layout.segments())
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
    def _admit(self, hits: list[Hit], injection: Injection) -> list[Hit]:
        share = self.passage_budget // max(1, len(hits))  # each passage's share, for compression
        return self.store.admit(hits, injection, share, lambda: (self.question + " " + self.draft[-300:]).strip())

    def go_on(self) -> None:
        """Ask the model, in a turn of its own, to go on from the passages before it."""
        self.layout.nudge(GO_ON_INSTRUCTION[self.language].format(question=self.question))

    @property
    def nudged(self) -> bool:
        return self.layout.nudged

    def _instruction(self) -> str:
        template = CONTINUE_INSTRUCTION if self.draft.strip() else START_INSTRUCTION
        return template[self.language].format(question=self.question)

    def _passage_tokens(self, exclude: set[str] = frozenset()) -> int:
        return self.renderer.passage_tokens(self.layout, exclude)

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
                victim = least_related(pool, self.question + " " + self.draft) if pool else None
            if victim is None:
                break  # only up-front passages are left: they were fitted to the budget at `start`
            if victim.chunk_id not in keep:
                self._remove(victim.chunk_id)
                injection.evicted.append(victim.chunk_id)
            else:
                self._forget(victim.chunk_id)  # never in context: not citable
                injection.dropped_budget.append(victim.chunk_id)

    def _remove(self, chunk_id: str) -> None:
        self.layout.remove(chunk_id)
        self.store.release(chunk_id)

    def _forget(self, chunk_id: str) -> None:
        """Remove a passage that never reached the model (dropped for the budget)."""
        self.layout.remove(chunk_id)
        self.store.forget(chunk_id)

    def _bounded_history(self, history: Sequence[tuple[str, str]]) -> tuple[list[tuple[str, str]], HistoryFit | None]:
        """The most recent earlier turns within `max_history_tokens`, older ones summarised or dropped."""
        if not history:
            return [], None
        return fit_history(list(history), self.config.max_history_tokens, self.count_tokens,
                           self.summarizer, self.language, self.renderer.turn_overhead(self.system))
