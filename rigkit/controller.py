"""The RIG loop: generate a segment, decide, search, inject, continue or regenerate.

Retrieval-Interleaved Generation retrieves where a gap shows up in the draft rather than once
before writing. `max_rounds` counts retrieval rounds: once they are spent, generation goes on to
the end of the answer from what is already in context, and `low_confidence` is set only if a
decider still wanted retrieval after that.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rigkit.citations import cite, written_with
from rigkit.config import ControllerConfig, GeneratorConfig
from rigkit.context import ContextManager
from rigkit.deciders.base import POLICIES, Decider, DecisionState, decider_policy
from rigkit.errors import InputError
from rigkit.generation.protocol import Generator, SupportsReset
from rigkit.markers import clean_answer
from rigkit.queries import QueryBuilder
from rigkit.retrieval.base import Retriever
from rigkit.text import strip_citations
from rigkit.trace import Hit, Injection, RIGResult, RoundTrace, Segment
from rigkit.transcript import StopRule

__all__ = ["RIGController", "RoundCallback"]

STAGES = ("generate", "decide", "query", "retrieve", "inject")


class RoundCallback(Protocol):
    """Observers (notebook widgets, loggers) implement any of these methods.

    `on_token` receives each token's text as the model writes it, tentatively: a segment may
    still be regenerated or trimmed; `rigkit.streaming.TokenStream` turns it into answer text.
    """

    def on_round_start(self, index: int, state: DecisionState) -> None: ...

    def on_token(self, text: str) -> None: ...

    def on_round_end(self, round_trace: RoundTrace) -> None: ...


@dataclass
class _Run:
    """Mutable bookkeeping of one question."""

    question: str
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
        callbacks: Sequence[Any] = (),
        citations: bool = True,
    ):
        self.generator, self.retriever, self.decider = generator, retriever, decider
        self.query_builder, self.context = query_builder, context
        self.config = config or ControllerConfig()
        self.generation = generation or GeneratorConfig()
        self.top_k, self.callbacks, self.citations = top_k, list(callbacks), citations
        # what happens to a segment that fired: the decider declares it, a run may override it
        if self.config.policy not in ("auto", *POLICIES):
            raise InputError(f"controller.policy must be auto, {' or '.join(POLICIES)}; got {self.config.policy!r}")
        self.policy = decider_policy(decider) if self.config.policy == "auto" else self.config.policy
        self.stop = StopRule(sentence=True)
        if context.marker_protocol is not None:  # pause right after the protocol's tag, matched on text
            protocol = context.marker_protocol
            self.stop = StopRule(sentence=True, marker_close=protocol.stop_string, keep=protocol.tags)
        self.last_result: RIGResult | None = None
        self.run_config: dict[str, Any] = {}

    def run(self, question: str, passages: Sequence[Hit] = (), history: Sequence[tuple[str, str]] = ()) -> RIGResult:
        """Answer `question`; `passages` are put before it (plain RAG), `history` are earlier turns."""
        for _ in self.stream(question, passages, history):
            pass
        assert self.last_result is not None
        return self.last_result

    def stream(
        self, question: str, passages: Sequence[Hit] = (), history: Sequence[tuple[str, str]] = ()
    ) -> Iterator[RoundTrace]:
        """Yield one `RoundTrace` per round as it happens; the result is then `last_result`."""
        self._check_question(question)
        if isinstance(self.generator, SupportsReset):
            self.generator.reset(self.generation.seed)
        self.context.start(question, passages, history)
        run = _Run(question, retrievals=1 if passages else 0)
        self.last_result = None
        while run.generated < self.generation.max_answer_tokens:
            trace = self._round(run)
            run.rounds.append(trace)
            for callback in self.callbacks:
                if hasattr(callback, "on_round_end"):
                    callback.on_round_end(trace)
            yield trace
            if run.done:
                break
            if trace.action in ("regenerate", "restore"):
                continue
            if trace.action == "continue" and trace.injection is not None and trace.injection.added:
                continue  # passages follow this segment: the model reads them, even after its end of turn
            if trace.segment.finished or not trace.segment.token_ids:
                break  # end of turn, or the model produced nothing more
        self.last_result = self._result(run)

    # -- one round -----------------------------------------------------------------------------
    def _round(self, run: _Run) -> RoundTrace:
        timings = dict.fromkeys(STAGES, 0.0)
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
        for callback in self.callbacks:
            if hasattr(callback, "on_round_start"):
                callback.on_round_start(len(run.rounds), state)
        with _timer(timings, "generate"):
            budget = min(self.generation.max_segment_tokens, self.generation.max_answer_tokens - run.generated)
            evicted = self.context.fit(budget)  # the model's context limit holds; refuses if it cannot
            segment = self.generator.next_segment(self.context.pieces(), self.stop, budget, **self._token_kwargs())
        segment.context_ids = [h.chunk_id for h in self.context.passages]  # all it may cite
        run.generated += len(segment.token_ids)
        run.tokens_since_retrieval += len(segment.token_ids)
        state.tokens_since_retrieval = run.tokens_since_retrieval
        with _timer(timings, "decide"):
            decision = self.decider.decide(segment, state)
        decision.segment_text = segment.text
        trace = RoundTrace(index=len(run.rounds), segment=segment, decision=decision, timings=timings,
                           tokens_prefilled=segment.tokens_prefilled, tokens_reused=segment.tokens_reused)
        if run.pending is not None and segment.finished and not segment.text.strip():
            # Small models sometimes end the turn right after the passages; rather than lose the
            # sentence, keep the flagged one and let the model go on from it.
            self.context.accept(run.pending)
            run.generated += len(run.pending.token_ids)
            run.done = run.pending.finished
            trace.action = "restore"
        elif not decision.retrieve:
            self.context.accept(segment)
        elif (run.retrievals >= self.config.max_rounds or not segment.text.strip() and segment.finished
              or self.policy == "continue" and run.generated >= self.generation.max_answer_tokens):
            # no retrieval rounds left, or no answer tokens left to read passages with: finish
            # from what is in context
            run.low_confidence = run.retrievals >= self.config.max_rounds
            trace.action = "skip"
            self.context.accept(segment)
        else:
            self._retrieve(run, trace, state)
        run.pending = segment if trace.action == "regenerate" else None
        if evicted:  # passages evicted before this segment to fit the model's context
            trace.injection = trace.injection or Injection()
            trace.injection.evicted = evicted + trace.injection.evicted
        trace.budget = self.context.budget()
        trace.draft = self._clean(self.context.draft)
        trace.retrieval_round = run.retrievals
        return trace

    def _retrieve(self, run: _Run, trace: RoundTrace, state: DecisionState) -> None:
        segment, timings = trace.segment, trace.timings
        try:
            with _timer(timings, "query"):
                trace.query = self.query_builder.build(run.question, state.draft + segment.text, trace.decision, state)
            with _timer(timings, "retrieve"):
                trace.hits = self.retriever.search(trace.query.text, self.top_k)
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
        trace.action = "regenerate" if regenerate else "continue"
        if regenerate:
            run.generated -= len(segment.token_ids)

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
        answer, cited, attributions = cite(
            self._clean(self.context.draft), self.context.seen_passages,
            written_with(parts, self._clean), tags=self.citations)
        return RIGResult(
            question=run.question,
            answer=answer,
            rounds=run.rounds,
            used_retrieval_times=run.retrievals,
            citations=cited,
            tokens={"prompt": prefilled + (reused or 0), "generated": generated, "prefilled": prefilled, "reused": reused},
            timings=totals,
            low_confidence=run.low_confidence,
            passages=self.context.passages,
            attributions=attributions,
            config=self.run_config,
            model={"spec": getattr(self.generator, "spec", type(self.generator).__name__),
                   "source": getattr(self.generator, "source", "")},
            policy=self.policy,
            errors=[f"round {r.index}: {r.error}" for r in run.rounds if r.error],
            upfront=self.context.upfront if self.context.upfront.added or self.context.upfront.dropped_budget else None,
        )

    def _clean(self, text: str) -> str:
        """The answer text: no markers, no citation tags the model wrote, single spaces."""
        return re.sub(r"[ \t]+", " ", strip_citations(clean_answer(text, self.context.protocol))).strip()

    def _token_kwargs(self) -> dict[str, Any]:
        """`on_token` for the generator when some callback listens (and the generator takes it)."""
        listeners = [c.on_token for c in self.callbacks if hasattr(c, "on_token")]
        if not listeners or not _takes_on_token(self.generator):
            return {}

        def on_token(text: str) -> None:
            for listener in listeners:
                listener(text)

        return {"on_token": on_token}

    def _check_question(self, question: str) -> None:
        if not isinstance(question, str) or not question.strip():
            raise InputError("the question is empty")
        limit = self.context.context_limit - self.generation.max_answer_tokens
        size = self.generator.count_tokens(question)
        if size > limit:
            raise InputError(
                f"the question is {size} tokens; the model's context leaves room for {limit} "
                f"(context {self.context.context_limit} minus {self.generation.max_answer_tokens} for the answer)"
            )


def _accepted_segments(rounds: Sequence[RoundTrace]) -> list[Segment]:
    """The segments the answer kept so far, in order (a restore keeps the regenerated one)."""
    kept: list[Segment] = []
    for i, r in enumerate(rounds):
        if r.action in ("accept", "continue", "skip"):
            kept.append(r.segment)
        elif r.action == "restore" and i > 0:
            kept.append(rounds[i - 1].segment)
    return kept


def _takes_on_token(generator: Any) -> bool:
    """Generators written before token streaming have no `on_token`: they still work."""
    import inspect

    try:
        params = inspect.signature(generator.next_segment).parameters
    except (TypeError, ValueError):
        return False
    return "on_token" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class _timer:
    """Adds the block's wall time to `timings[stage]`."""

    def __init__(self, timings: dict[str, float], stage: str):
        self.timings, self.stage = timings, stage

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.stage] += time.perf_counter() - self.start

