"""The RIG loop: generate a segment, decide, search, inject, continue or regenerate.

Retrieval-Interleaved Generation retrieves where a gap shows up in the draft rather than once
before writing. `max_rounds` counts retrieval rounds: once they are spent, generation goes on to
the end of the answer from what is already in context, and `low_confidence` is set only if a
decider still wanted retrieval after that.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rigkit.citations import written_with
from rigkit.config import ControllerConfig, GeneratorConfig
from rigkit.context import ContextManager
from rigkit.deciders.base import POLICIES, Decider, DecisionState, decider_policy
from rigkit.errors import InputError
from rigkit.generation.protocol import Generator, SupportsReset
from rigkit.grounding import ground
from rigkit.markers import clean_answer
from rigkit.queries import QueryBuilder
from rigkit.retrieval.base import Retriever
from rigkit.retrieval.hybrid import search_queries
from rigkit.text import check_question, strip_citations
from rigkit.trace import Action, Hit, Injection, RIGResult, RoundTrace, Segment
from rigkit.transcript import StopRule

__all__ = ["RIGController", "RoundCallback"]

STAGES = ("generate", "decide", "query", "retrieve", "inject")


class RoundCallback:
    """Observers (notebook widgets, loggers, token streams) override the events they need.

    `on_token` receives each token's text as the model writes it, tentatively: a segment may
    still be regenerated or trimmed; `rigkit.streaming.TokenStream` turns it into answer text.
    An object that does not subclass this and has only some of the methods works too.
    """

    def on_round_start(self, index: int, state: DecisionState) -> None:
        """Before a round's segment is written; `state` is what the decider will see."""

    def on_token(self, text: str) -> None:
        """One token's text, as it is written."""

    def on_round_end(self, round_trace: RoundTrace) -> None:
        """After a round, with its full record."""


@dataclass
class _Run:
    """Mutable bookkeeping of one question."""

    question: str
    observers: _Observers
    rounds: list[RoundTrace] = field(default_factory=list)
    retrievals: int = 0
    tokens_since_retrieval: int = 0
    generated: int = 0
    low_confidence: bool = False
    pending: Segment | None = None  # the flagged segment of the last "regenerate"
    done: bool = False  # the answer is complete (a restored segment had ended the turn)
    started: float = field(default_factory=time.perf_counter)


class RIGController:
    """Runs one question through the loop; parts are injected, so each can be swapped."""

    def __init__(
        self,
        generator: Generator,
        retriever: Retriever,
        decider: Decider,
        query_builder: QueryBuilder,
        context: ContextManager,
        config: ControllerConfig | None = None,
        generation: GeneratorConfig | None = None,
        top_k: int = 3,
        callbacks: Sequence[RoundCallback | Any] = (),
        citations: bool = True,
        run_config: dict[str, Any] | None = None,
    ):
        self.generator, self.retriever, self.decider = generator, retriever, decider
        self.query_builder, self.context = query_builder, context
        self.config = config or ControllerConfig()
        self.generation = generation or GeneratorConfig()
        self.top_k, self.callbacks, self.citations = top_k, list(callbacks), citations
        self.run_config = dict(run_config or {})  # the whole run's config, recorded in each result
        # what happens to a segment that fired: the decider declares it, a run may override it
        if self.config.policy not in ("auto", *POLICIES):
            raise InputError(f"controller.policy must be auto, {' or '.join(POLICIES)}; got {self.config.policy!r}")
        self.policy = decider_policy(decider) if self.config.policy == "auto" else self.config.policy
        self.stop = StopRule(sentence=True)
        if context.marker_protocol is not None:  # pause right after the protocol's tag, matched on text
            protocol = context.marker_protocol
            self.stop = StopRule(sentence=True, marker_close=protocol.stop_string, keep=protocol.tags)
        if self.config.pause_at_flag and callable(getattr(decider, "pause_at", None)):
            self.stop = dataclasses.replace(self.stop, early=decider.pause_at)  # stop at the flagged word
        self.last_result: RIGResult | None = None

    def run(self, question: str, passages: Sequence[Hit] = (), history: Sequence[tuple[str, str]] = ()) -> RIGResult:
        """Answer `question`; `passages` are put before it (plain RAG), `history` are earlier turns."""
        for _ in self.stream(question, passages, history):
            pass
        assert self.last_result is not None
        return self.last_result

    # -- the loop ------------------------------------------------------------------------------
    def stream(
        self, question: str, passages: Sequence[Hit] = (), history: Sequence[tuple[str, str]] = ()
    ) -> Iterator[RoundTrace]:
        """Yield one `RoundTrace` per round as it happens; the result is then `last_result`."""
        self._check_question(question)
        if isinstance(self.generator, SupportsReset):
            self.generator.reset(self.generation.seed)
        self.context.start(question, passages, history)
        run = _Run(question, _Observers(self.callbacks), retrievals=1 if passages else 0)
        self.last_result = None
        while run.generated < self.generation.max_answer_tokens:
            trace = self._round(run)
            run.rounds.append(trace)
            run.observers.on_round_end(trace)
            yield trace
            if not _goes_on(run, trace):
                break
        self.last_result = self._result(run)

    def _round(self, run: _Run) -> RoundTrace:
        """One segment, the decider's verdict on it, and what the loop then does with it."""
        state = self._decision_state(run)
        run.observers.on_round_start(len(run.rounds), state)
        timings = dict.fromkeys(STAGES, 0.0)
        with _timer(timings, "generate"):
            segment, evicted = self._generate(run)
        run.generated += len(segment.token_ids)
        run.tokens_since_retrieval += len(segment.token_ids)
        state.tokens_since_retrieval = run.tokens_since_retrieval
        with _timer(timings, "decide"):
            decision = self.decider.decide(segment, state)
        decision.segment_text = segment.text
        trace = RoundTrace(index=len(run.rounds), segment=segment, decision=decision, timings=timings,
                           tokens_prefilled=segment.tokens_prefilled, tokens_reused=segment.tokens_reused)
        if run.pending is not None and segment.finished and not segment.text.strip():
            self._restore(run, trace)
        elif not decision.retrieve:
            self.context.accept(segment)
        elif self._cannot_retrieve(run, segment):
            self._skip(run, trace)
        else:
            self._retrieve(run, trace, state)
        run.pending = segment if trace.action is Action.REGENERATE else None
        self._record_context(run, trace, evicted)
        return trace

    def _retrieve(self, run: _Run, trace: RoundTrace, state: DecisionState) -> None:
        """Search for what the segment lacks, inject the hits; keep it or write it again."""
        segment, timings = trace.segment, trace.timings
        try:
            with _timer(timings, "query"):
                trace.query = self.query_builder.build(run.question, state.draft + segment.text, trace.decision, state)
            with _timer(timings, "retrieve"):
                # several sub-queries: one batched search where possible, merged by RRF
                trace.hits = search_queries(self.retriever, trace.query.searches, self.top_k)
        except Exception as err:  # noqa: BLE001 - one failed round must not lose the answer
            # recorded in the round and the result; it is not a retrieval, so it spends no round
            trace.error = f"{type(err).__name__}: {err}"
            trace.hits = []
            self.context.accept(segment)
            return
        run.retrievals += 1
        run.tokens_since_retrieval = 0
        regenerate = self.policy == "regenerate"
        if not regenerate:
            self.context.accept(segment)  # the segment (e.g. its marker) stays; passages follow
        with _timer(timings, "inject"):
            trace.injection = self.context.inject(trace.hits) if trace.hits else Injection()
        if regenerate and not trace.injection.added:
            self.context.accept(segment)  # nothing new to read: regenerating would repeat it
            regenerate = False
        trace.action = Action.REGENERATE if regenerate else Action.CONTINUE
        if regenerate:
            run.generated -= len(segment.token_ids)

    # -- the steps around it -------------------------------------------------------------------
    def _generate(self, run: _Run) -> tuple[Segment, list[str]]:
        """The next segment, and the passages evicted first to fit it in the model's context."""
        budget = min(self.generation.max_segment_tokens, self.generation.max_answer_tokens - run.generated)
        evicted = self.context.fit(budget)  # the model's context limit holds; refuses if it cannot
        segment = self.generator.next_segment(self.context.pieces(), self.stop, budget,
                                              on_token=run.observers.token_sink)
        segment.context_ids = [h.chunk_id for h in self.context.passages]  # all it may cite
        return segment, evicted

    def _decision_state(self, run: _Run) -> DecisionState:
        """What the decider (and `on_round_start`) sees before this round's segment."""
        state = DecisionState(
            question=run.question,
            draft=self.context.draft,
            passages=self.context.passages,
            round_index=len(run.rounds),
            retrievals_done=run.retrievals,
            generator=self.generator,
            segments=_accepted_segments(run.rounds),
        )
        last = next((r for r in reversed(run.rounds) if r.query is not None), None)
        if last is not None:
            state.last_query, state.last_hits = last.query, list(last.hits)
        return state

    def _restore(self, run: _Run, trace: RoundTrace) -> None:
        """The rewrite after the passages came back empty at end of turn: keep the set-aside one.

        Small models sometimes end the turn right after the passages; rather than lose the
        sentence, keep the flagged one and let the model go on from it.
        """
        assert run.pending is not None
        self.context.accept(run.pending)
        run.generated += len(run.pending.token_ids)
        run.done = run.pending.finished
        trace.action = Action.RESTORE

    def _cannot_retrieve(self, run: _Run, segment: Segment) -> bool:
        """No retrieval rounds left, or no answer tokens left to read passages with."""
        return (run.retrievals >= self.config.max_rounds or not segment.text.strip() and segment.finished
                or self.policy == "continue" and run.generated >= self.generation.max_answer_tokens)

    def _skip(self, run: _Run, trace: RoundTrace) -> None:
        """The decider fired but retrieval cannot help now: keep the segment, finish from context."""
        run.low_confidence = run.retrievals >= self.config.max_rounds
        trace.action = Action.SKIP
        self.context.accept(trace.segment)

    def _record_context(self, run: _Run, trace: RoundTrace, evicted: list[str]) -> None:
        """The round's evictions, token budget, answer so far and retrieval count."""
        if evicted:  # passages evicted before this segment to fit the model's context
            trace.injection = trace.injection or Injection()
            trace.injection.evicted = evicted + trace.injection.evicted
        trace.budget = self.context.budget()
        trace.draft = self._clean(self.context.draft)
        trace.retrieval_round = run.retrievals

    # -- the result ----------------------------------------------------------------------------
    def _result(self, run: _Run) -> RIGResult:
        totals = {stage: sum(r.timings.get(stage, 0.0) for r in run.rounds) for stage in STAGES}
        totals["total"] = time.perf_counter() - run.started
        prefilled = sum(r.tokens_prefilled for r in run.rounds)
        known = [r.tokens_reused for r in run.rounds if r.tokens_reused is not None]
        # a served model that does not report its prefix cache: "unknown", never a false 0
        reused = sum(known) if len(known) == len(run.rounds) else None
        generated = sum(len(r.segment.token_ids) for r in run.rounds)
        parts = [(text, seg.context_ids) for text, seg in self.context.draft_parts()]
        # citations (by word overlap, or the model's own [n] checked against what it saw), facts
        grounded = ground(
            self._clean(self.context.draft), run.question, self.context.seen_passages,
            written_with(parts, self._clean), cite=self.context.config.cite,
            numbers=self.context.passage_numbers, tags=self.citations)
        return RIGResult(
            question=run.question,
            answer=grounded.answer,
            rounds=run.rounds,
            used_retrieval_times=run.retrievals,
            citations=grounded.cited,
            tokens={"prompt": prefilled + (reused or 0), "generated": generated, "prefilled": prefilled, "reused": reused},
            timings=totals,
            low_confidence=run.low_confidence,
            passages=self.context.passages,
            attributions=grounded.attributions,
            config=self.run_config,
            model={"spec": self.generator.spec or type(self.generator).__name__, "source": self.generator.source},
            policy=self.policy,
            errors=[f"round {r.index}: {r.error}" for r in run.rounds if r.error],
            upfront=self.context.upfront if self.context.upfront.added or self.context.upfront.dropped_budget else None,
            history=self.context.history_fit,
            suspicious=grounded.suspicious,
            removed_citations=grounded.removed,
            warnings=grounded.warnings,
        )

    def _clean(self, text: str) -> str:
        """The answer text: no markers, no citation tags the model wrote, single spaces."""
        return re.sub(r"[ \t]+", " ", strip_citations(clean_answer(text, self.context.protocol))).strip()

    def _check_question(self, question: str) -> None:
        check_question(question)
        limit = self.context.context_limit - self.generation.max_answer_tokens
        size = self.generator.count_tokens(question)
        if size > limit:
            raise InputError(
                f"the question is {size} tokens; the model's context leaves room for {limit} "
                f"(context {self.context.context_limit} minus {self.generation.max_answer_tokens} for the answer)"
            )


def _goes_on(run: _Run, trace: RoundTrace) -> bool:
    """Whether another round follows `trace`."""
    if run.done:
        return False
    if trace.action in (Action.REGENERATE, Action.RESTORE):
        return True
    if trace.action is Action.CONTINUE and trace.injection is not None and trace.injection.added:
        return True  # passages follow this segment: the model reads them, even after its end of turn
    return not (trace.segment.finished or not trace.segment.token_ids)  # end of turn, or nothing more


def _accepted_segments(rounds: Sequence[RoundTrace]) -> list[Segment]:
    """The segments the answer kept so far, in order (a restore keeps the regenerated one)."""
    kept: list[Segment] = []
    for i, r in enumerate(rounds):
        if r.action in (Action.ACCEPT, Action.CONTINUE, Action.SKIP):
            kept.append(r.segment)
        elif r.action is Action.RESTORE and i > 0:
            kept.append(rounds[i - 1].segment)
    return kept


class _Observers(RoundCallback):
    """A run's callbacks as one: each event goes to every callback that has a method for it.

    Gathered when a run starts, so callbacks appended to `controller.callbacks` since are seen,
    and an object with only some of the methods (not a `RoundCallback`) is still welcome.
    """

    def __init__(self, callbacks: Sequence[Any]):
        self.starts = _handlers(callbacks, "on_round_start")
        self.tokens = _handlers(callbacks, "on_token")
        self.ends = _handlers(callbacks, "on_round_end")

    def on_round_start(self, index: int, state: DecisionState) -> None:
        for handler in self.starts:
            handler(index, state)

    def on_token(self, text: str) -> None:
        for handler in self.tokens:
            handler(text)

    def on_round_end(self, round_trace: RoundTrace) -> None:
        for handler in self.ends:
            handler(round_trace)

    @property
    def token_sink(self) -> Callable[[str], None] | None:
        """The generator's `on_token`: None when nobody listens, so no streamer runs."""
        return self.on_token if self.tokens else None


def _handlers(callbacks: Sequence[Any], event: str) -> list[Callable[..., None]]:
    """Each callback's `event` method; a plain object without one is left out of that event."""
    return [getattr(c, event) for c in callbacks if hasattr(c, event)]


class _timer:
    """Adds the block's wall time to `timings[stage]`."""

    def __init__(self, timings: dict[str, float], stage: str):
        self.timings, self.stage = timings, stage

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.stage] += time.perf_counter() - self.start
