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

from rigkit.config import ControllerConfig, GeneratorConfig
from rigkit.context import ContextManager
from rigkit.deciders.base import Decider, DecisionState
from rigkit.errors import InputError
from rigkit.generation import Generator
from rigkit.markers import strip_markers
from rigkit.prompts import citation_tag
from rigkit.queries import QueryBuilder
from rigkit.retrieval.base import Retriever
from rigkit.trace import Hit, Injection, RIGResult, RoundTrace, Segment
from rigkit.transcript import StopRule

__all__ = ["RIGController", "RoundCallback"]

STAGES = ("generate", "decide", "query", "retrieve", "inject")


class RoundCallback(Protocol):
    """Observers (notebook widgets, loggers) implement either method or both."""

    def on_round_start(self, index: int, state: DecisionState) -> None: ...

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
        self.policy = "regenerate" if self.config.policy == "auto" else self.config.policy
        self.stop = StopRule(sentence=True)
        if context.marker_tag:
            self.stop = StopRule(sentence=True, marker_close=f"</{context.marker_tag}>")
            if self.config.policy == "auto":
                self.policy = "continue"
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
        if hasattr(self.generator, "reset"):
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
        )
        for callback in self.callbacks:
            if hasattr(callback, "on_round_start"):
                callback.on_round_start(len(run.rounds), state)
        with _timer(timings, "generate"):
            budget = min(self.generation.max_segment_tokens, self.generation.max_answer_tokens - run.generated)
            segment = self.generator.next_segment(self.context.pieces(), self.stop, budget)
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
        elif run.retrievals >= self.config.max_rounds or not segment.text.strip() and segment.finished:
            run.low_confidence = run.retrievals >= self.config.max_rounds
            trace.action = "skip"  # no retrieval rounds left: finish from what is in context
            self.context.accept(segment)
        else:
            self._retrieve(run, trace, state)
        run.pending = segment if trace.action == "regenerate" else None
        trace.budget = self.context.budget()
        trace.draft = self._clean(self.context.draft)
        trace.retrieval_round = run.retrievals
        return trace

    def _retrieve(self, run: _Run, trace: RoundTrace, state: DecisionState) -> None:
        segment, timings = trace.segment, trace.timings
        try:
            with _timer(timings, "query"):
                trace.query = self.query_builder.build(run.question, state.draft + segment.text, trace.decision)
            with _timer(timings, "retrieve"):
                trace.hits = self.retriever.search(trace.query.text, self.top_k)
        except Exception as err:  # noqa: BLE001 - one failed round must not lose the answer
            trace.error = f"{type(err).__name__}: {err}"
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
        reused = sum(r.tokens_reused for r in run.rounds)
        generated = sum(len(r.segment.token_ids) for r in run.rounds)
        answer, cited = self._cite(self._clean(self.context.draft))
        return RIGResult(
            question=run.question,
            answer=answer,
            rounds=run.rounds,
            used_retrieval_times=run.retrievals,
            citations=cited,
            tokens={"prompt": prefilled + reused, "generated": generated, "prefilled": prefilled, "reused": reused},
            timings=totals,
            low_confidence=run.low_confidence,
            passages=self.context.passages,
            config=self.run_config,
            model={"spec": getattr(self.generator, "spec", type(self.generator).__name__),
                   "source": getattr(self.generator, "source", "")},
        )

    def _clean(self, text: str) -> str:
        tag = self.context.config.marker_tag
        return re.sub(r"[ \t]+", " ", strip_markers(text, tag)).strip()

    def _cite(self, answer: str) -> tuple[str, list[str]]:
        """Attach `[[citation:ID]]` to each sentence that shares content words with a passage."""
        passages = self.context.passages
        if not passages:
            return answer, []
        cited: list[str] = []
        passage_words = [(h, _content_words(h.text)) for h in passages]
        out = []
        for sentence in re.split(r"(?<=[.!?。！？])\s+", answer):
            words = _content_words(sentence)
            best, shared = max(((h, len(words & w)) for h, w in passage_words), key=lambda pair: pair[1])
            if shared >= 2:
                if best.chunk_id not in cited:
                    cited.append(best.chunk_id)
                if self.citations:
                    sentence = f"{sentence} {citation_tag(best.chunk_id)}"
            out.append(sentence)
        return " ".join(out), cited

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


_STOP = frozenset(
    "a an the and or of to in on for with by is are was were be been it its this that as at from "
    "what which who whom when where why how do does did can could must may should i you he she they".split()
)


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.lower()) if w not in _STOP and len(w) > 2}


class _timer:
    """Adds the block's wall time to `timings[stage]`."""

    def __init__(self, timings: dict[str, float], stage: str):
        self.timings, self.stage = timings, stage

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.stage] += time.perf_counter() - self.start

