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
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rigkit.answer_checks import AnswerChecks, segment_prefix
from rigkit.callbacks import Observers, RoundCallback
from rigkit.citations import written_with
from rigkit.config import ControllerConfig, GeneratorConfig, QueryConfig
from rigkit.context import ContextManager
from rigkit.deciders.base import POLICIES, Decider, DecisionState, decider_policy
from rigkit.errors import InputError
from rigkit.generation.protocol import Generator, SupportsReset
from rigkit.grounding import ground
from rigkit.guards import QueryGuard, whole_sentences
from rigkit.markers import clean_answer
from rigkit.queries import QueryBuilder, resolve_query, standalone_question
from rigkit.retrieval.base import Retriever
from rigkit.retrieval.hybrid import search_queries
from rigkit.retrieval.sources import collect_notes
from rigkit.short_answer import SHORT_ANSWER_MODES
from rigkit.text import check_question, strip_citations
from rigkit.trace import (
    Action,
    ContextOp,
    Decision,
    Hit,
    Injection,
    RIGResult,
    RoundTrace,
    RunState,
    SearchRequest,
    Segment,
    set_aside_round,
)
from rigkit.transcript import Piece, StopRule

__all__ = ["RIGController", "Run", "RoundCallback"]

STAGES = ("generate", "decide", "query", "retrieve", "inject")


class RIGController(AnswerChecks):
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
        embed: Callable[[list[str]], Any] | None = None,
        query_config: QueryConfig | None = None,
    ):
        self.generator, self.retriever, self.decider = generator, retriever, decider
        self.query_builder, self.context = query_builder, context
        self.config = config or ControllerConfig()
        self.generation = generation or GeneratorConfig()
        self.top_k, self.callbacks, self.citations = top_k, list(callbacks), citations
        self.run_config = dict(run_config or {})  # the whole run's config, recorded in each result
        self.embed = embed  # texts -> unit vectors: the in-loop support check (controller.check_support)
        # the loop's guards on its searches: length cap, empty / garbage, near-repeats
        self.query_guard = QueryGuard(query_config or QueryConfig(), self.config.skip_duplicate_queries,
                                      self.config.repeat_overlap)
        if self.config.short_answer not in SHORT_ANSWER_MODES:
            raise InputError(f"controller.short_answer must be {' or '.join(SHORT_ANSWER_MODES)}; "
                             f"got {self.config.short_answer!r}")
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

    def stream(
        self, question: str, passages: Sequence[Hit] = (), history: Sequence[tuple[str, str]] = ()
    ) -> Iterator[RoundTrace]:
        """Yield one `RoundTrace` per round as it happens; the result is then `last_result`."""
        self.last_result = None
        run = self.start(question, passages, history)
        while (step := run.step()) is not None:
            if isinstance(step, SearchRequest):
                yield run.search(self.retriever)  # the loop's own retriever answers its pauses; the round it ends is yielded too
            else:
                yield step
        self.last_result = run.result

    def start(self, question: str, passages: Sequence[Hit] = (), history: Sequence[tuple[str, str]] = ()) -> Run:
        """A `Run` of `question`, stepped by its caller; it pauses at each search (see `Run`)."""
        self._check_question(question)
        if isinstance(self.generator, SupportsReset):
            self.generator.reset(self.generation.seed)
        self.context.start(question, passages, history)
        return Run(self, question, list(passages), [tuple(t) for t in history])

    def restore(self, state: RunState | str) -> Run:
        """A run saved with `Run.state()` (or its JSON), rebuilt over this controller's parts: the
        context is rebuilt from the run's log, no model call."""
        return Run.restore(self, RunState.from_json(state) if isinstance(state, str) else state)

    # -- the loop ------------------------------------------------------------------------------
    def _round(self, run: Run) -> RoundTrace | SearchRequest:
        """One segment and the decider's verdict on it; a search pauses the round (`_searched`)."""
        if run.ground and (grounded := self._ground(run)) is not None:
            return grounded
        state = self._decision_state(run)
        run.observers.on_round_start(len(run.rounds), state)
        timings = dict.fromkeys(STAGES, 0.0)
        with _timer(timings, "generate"):
            segment = self._generate(run)
        run.generated += len(segment.token_ids)
        run.tokens_since_retrieval += len(segment.token_ids)
        state.tokens_since_retrieval = run.tokens_since_retrieval
        with _timer(timings, "decide"):
            decision = self.decider.decide(segment, state)
        decision.segment_text = segment.text
        trace = RoundTrace(index=len(run.rounds), segment=segment, decision=decision, timings=timings,
                           tokens_prefilled=segment.tokens_prefilled, tokens_reused=segment.tokens_reused)
        if run.pending is not None and segment.finished and not segment.text.strip():
            self._go_on(run, trace) if not self.context.nudged else self._restore(run, trace)
        elif run.pending is not None and (fault := self._rewrite_fault(run.rounds, segment)):
            self._fallback(run, trace, fault)
        elif (repeat := self._repeat_at(segment)) is not None:
            self._cut_repeat(run, trace, *repeat)
        elif not decision.retrieve:
            run._accept(segment)
        elif self._cannot_retrieve(run, segment):
            self._skip(run, trace)
        else:
            return self._search_request(run, trace, state)
        return self._end_round(run, trace)

    def _search_request(self, run: Run, trace: RoundTrace, state: DecisionState) -> RoundTrace | SearchRequest:
        """What to search for the segment's gap: the loop pauses here until hits come back."""
        try:
            with _timer(trace.timings, "query"):
                # a follow-up's "it" is named: in the question the builder reads, then in each search
                query = self.query_builder.build(run.asked, state.draft + trace.segment.text, trace.decision, state)
                trace.query = resolve_query(query, run.asked, run.history)
        except Exception as err:  # noqa: BLE001 - one failed round must not lose the answer
            return self._searched(run, trace, error=err)
        searches, trace.guards = self.query_guard.screen(trace.query, run.searched)
        if not searches:  # every search was a repeat, empty or garbage: nothing new to read
            self._skip(run, trace)
            return self._end_round(run, trace)
        run.searched += searches
        request = SearchRequest(id=uuid.uuid4().hex[:12], round=trace.index, queries=searches,
                                top_k=self.top_k, query=trace.query, question=run.question,
                                draft=state.draft + trace.segment.text)
        run.paused = (request, trace)
        return request

    def _searched(self, run: Run, trace: RoundTrace, hits: Sequence[Hit] = (),
                  error: Exception | None = None) -> RoundTrace:
        """The paused round goes on with its hits: inject them, keep the segment or write it again."""
        segment = trace.segment
        if error is not None:  # recorded in the round and the result; not a retrieval, so no round spent
            trace.error, trace.hits = f"{type(error).__name__}: {error}", []
            run._accept(segment)
            return self._end_round(run, trace)
        trace.hits = list(hits)
        if run.pre_draft is None and run.retrievals == 0:  # what the answer would have said without retrieval
            run.pre_draft = self._clean(self.context.draft + segment.text)
        run.retrievals += 1
        run.tokens_since_retrieval = 0
        regenerate = self.policy == "regenerate"
        if not regenerate:
            run._accept(segment)  # the segment (e.g. its marker) stays; passages follow
        with _timer(trace.timings, "inject"):
            trace.injection = run._inject(trace.hits) if trace.hits else Injection()
        if regenerate and not trace.injection.added:
            run._accept(segment)  # nothing new to read: regenerating would repeat it
            regenerate = False
        trace.action = Action.REGENERATE if regenerate else Action.CONTINUE
        if regenerate:
            run.generated -= len(segment.token_ids)
        return self._end_round(run, trace)

    def _end_round(self, run: Run, trace: RoundTrace) -> RoundTrace:
        """The round's record completed and told to the observers; whether another follows."""
        run.pending = (trace.segment if trace.action is Action.REGENERATE
                       else run.pending if trace.action is Action.GO_ON else None)
        self._check_support([*run.rounds, trace])
        self._record_context(run, trace)
        run.rounds.append(trace)
        run.grounding = self._grounding(run) if self.config.rewrite_unsupported and trace.unsupported else None
        run.ground = run.grounding is not None
        run.observers.on_round_end(trace)
        run.goes_on = _goes_on(run, trace)
        return trace

    # -- the steps around it -------------------------------------------------------------------
    def _generate(self, run: Run) -> Segment:
        """The next segment; passages are evicted first (`run.evicted`) to fit it in the context."""
        budget = min(self.generation.max_segment_tokens, self.generation.max_answer_tokens - run.generated)
        run.evicted = run._fit(budget)  # the model's context limit holds; refuses if it cannot
        segment = self.generator.next_segment(self.context.pieces(), self.stop, budget,
                                              on_token=run.observers.token_sink)
        segment.context_ids = [h.chunk_id for h in self.context.passages]  # all it may cite
        return segment

    def _decision_state(self, run: Run) -> DecisionState:
        """What the decider (and `on_round_start`) sees before this round's segment."""
        state = DecisionState(
            question=run.question,
            draft=self.context.draft,
            passages=self.context.passages,
            round_index=len(run.rounds),
            retrievals_done=run.retrievals,
            generator=self.generator,
            segments=_accepted_segments(run.rounds),
            history=list(run.history),
        )
        last = next((r for r in reversed(run.rounds) if r.query is not None), None)
        if last is not None:
            state.last_query, state.last_hits = last.query, list(last.hits)
        return state

    def _go_on(self, run: Run, trace: RoundTrace) -> None:
        """The rewrite came back empty at end of turn: small models often end the turn right
        after the passages. Ask once, in a turn of its own, to go on from them; the set-aside
        segment waits (restored only if this comes back empty too)."""
        run._go_on()
        trace.action = Action.GO_ON
        trace.guards.append("empty rewrite: asked to go on from the passages")

    def _restore(self, run: Run, trace: RoundTrace) -> None:
        """Asked to go on, the model still wrote nothing: keep the set-aside segment rather than
        lose the sentence, and let the model go on from it."""
        assert run.pending is not None
        run._accept(run.pending)
        run.generated += len(run.pending.token_ids)
        run.done = run.pending.finished
        trace.action = Action.RESTORE
        trace.unused = self._unused(run, "the rewrite came back empty twice: the sentence written before it is kept")

    def _unused(self, run: Run, why: str) -> dict[str, str]:
        """The passages of the last retrieval that no kept text was written from, each with `why`."""
        last = next((r for r in reversed(run.rounds) if r.injection is not None and r.injection.added), None)
        return dict.fromkeys(last.injection.added, why) if last is not None else {}

    def _fallback(self, run: Run, trace: RoundTrace, reason: str) -> None:
        """Keep the set-aside segment after the passages it was flagged for; drop the rewrite."""
        assert run.pending is not None
        run.pending.context_ids = [h.chunk_id for h in self.context.passages]  # it may now cite them
        run._accept(run.pending)
        run.generated += len(run.pending.token_ids) - len(trace.segment.token_ids)
        run.done = run.pending.finished
        trace.action, trace.fallback = Action.FALLBACK, reason
        trace.unused = self._unused(run, f"{reason}: the sentence written before it is kept")

    def _cut_repeat(self, run: Run, trace: RoundTrace, cut: int, kind: str = "repeat") -> None:
        """Keep the segment up to where it repeats the answer, and end the answer there."""
        segment = trace.segment
        trace.guards.append(f"{kind}: {segment.text[cut:].strip()!r}")
        kept = segment_prefix(segment, cut)
        if kept is not None:
            run._accept(kept)
        run.generated -= len(segment.token_ids) - (len(kept.token_ids) if kept else 0)
        trace.action, run.done = Action.REPEAT, True

    def _cannot_retrieve(self, run: Run, segment: Segment) -> bool:
        """No retrieval rounds left, or no answer tokens left to read passages with."""
        return (run.retrievals >= self.config.max_rounds or not segment.text.strip() and segment.finished
                or self.policy == "continue" and run.generated >= self.generation.max_answer_tokens)

    def _skip(self, run: Run, trace: RoundTrace) -> None:
        """The decider fired but retrieval cannot help now: keep the segment, finish from context."""
        run.low_confidence = run.retrievals >= self.config.max_rounds
        trace.action = Action.SKIP
        run._accept(trace.segment)

    def _grounding(self, run: Run) -> tuple[Segment, list[Piece], int] | None:
        """The last kept segment, the strict grounding prompt to write it again, and the tokens
        the rewrite may take; None when it cannot be written again (see `grounding_pieces`)."""
        kept = _accepted_segments(run.rounds)
        if not kept:
            return None
        budget = min(self.generation.max_segment_tokens,
                     self.generation.max_answer_tokens - run.generated + len(kept[-1].token_ids))
        pieces = self.context.grounding_pieces(kept[-1], budget)
        return None if pieces is None else (kept[-1], pieces, budget)

    def _ground(self, run: Run) -> RoundTrace | None:
        """`controller.rewrite_unsupported`: the last kept segment, flagged unsupported, written once
        more under the strict grounding prompt; the rewrite replaces it only if it is supported."""
        grounding = run.grounding or self._grounding(run)  # built when the round ended; a restored run builds it
        run.ground, run.grounding = False, None
        if grounding is None:
            return None
        original, pieces, budget = grounding
        run.evicted = []  # nothing is fitted for the rewrite: it takes the place of the original
        run.observers.on_round_start(len(run.rounds), self._decision_state(run))
        timings = dict.fromkeys(STAGES, 0.0)
        with _timer(timings, "generate"):  # the decider's early stop is for its own judgement: not here
            rewrite = self.generator.next_segment(pieces, dataclasses.replace(self.stop, early=None), budget,
                                                  on_token=run.observers.token_sink)
        rewrite.context_ids = [h.chunk_id for h in self.context.passages]
        flagged = " ".join(run.rounds[-1].unsupported)
        decision = Decision(False, 0.0, f"written again under the strict grounding prompt: {flagged!r} was unsupported",
                            decider="grounding", segment_text=rewrite.text)
        trace = RoundTrace(index=len(run.rounds), segment=rewrite, decision=decision, action=Action.GROUND,
                           timings=timings, tokens_prefilled=rewrite.tokens_prefilled, tokens_reused=rewrite.tokens_reused)
        with _timer(timings, "decide"):
            trace.fallback = self._ground_fault(rewrite)
        if trace.fallback:  # the original stays; the answer ends where it ended
            run.done = original.finished
        else:
            run._replace_last(rewrite)
            run.generated += len(rewrite.token_ids) - len(original.token_ids)
            run.done = False
        return self._end_round(run, trace)

    def _record_context(self, run: Run, trace: RoundTrace) -> None:
        """The round's evictions, token budget, answer so far and retrieval count."""
        if evicted := run.evicted:  # passages evicted before this segment to fit the model's context
            trace.injection = trace.injection or Injection()
            trace.injection.evicted = evicted + trace.injection.evicted
        trace.budget = self.context.budget()
        trace.draft = self._clean(self.context.draft)
        trace.retrieval_round = run.retrievals

    # -- the result ----------------------------------------------------------------------------
    def _result(self, run: Run) -> RIGResult:
        totals = {stage: sum(r.timings.get(stage, 0.0) for r in run.rounds) for stage in STAGES}
        totals["total"] = time.perf_counter() - run.started
        prefilled = sum(r.tokens_prefilled for r in run.rounds)
        known = [r.tokens_reused for r in run.rounds if r.tokens_reused is not None]
        # a served model that does not report its prefix cache: "unknown", never a false 0
        reused = sum(known) if len(known) == len(run.rounds) else None
        generated = sum(len(r.segment.token_ids) for r in run.rounds)
        parts = [(text, seg.context_ids) for text, seg in self.context.draft_parts()]
        answer, trimmed = self._ending(self._clean(self.context.draft))
        # citations (by word overlap, or the model's own [n] checked against what it saw), facts
        grounded = ground(
            answer, run.question, self.context.seen_passages,
            written_with(parts, self._clean), cite=self.context.config.cite,
            numbers=self.context.passage_numbers, tags=self.citations,
            warn_unretrieved=self.config.warn_no_retrieval and self.citations)
        if self.config.end_on_sentence and answer and not trimmed and whole_sentences(answer) != answer:
            grounded.warnings.append("the answer ends mid-sentence and holds no whole sentence to keep")
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
            warnings=run.warnings + grounded.warnings,
            short_answer=self._short_answer(run.question, strip_citations(grounded.answer)),
            trimmed=trimmed,
            pre_retrieval_draft=run.pre_draft,
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



class Run:
    """One question in progress, stepped by its caller.

    `step()` returns the next `RoundTrace`; where the decider wants a search it returns a
    `SearchRequest` instead, and the loop waits until the hits come: `resume(request.id, hits)`
    (a notebook cell, an HTTP client's tool result) or `search(retriever)`. It returns None once
    the answer is complete, in `result`. `state()` saves the run, paused or not, as a `RunState`
    (JSON) and `RIGController.restore` rebuilds it from the context operations logged here.
    """

    def __init__(self, controller: RIGController, question: str, passages: list[Hit], history: list[tuple[str, str]]):
        self.controller, self.question, self.given, self.history = controller, question, passages, history
        self.asked = standalone_question(question, history)  # as the searches read it: pronouns named
        self.rounds: list[RoundTrace] = []
        self.retrievals = 1 if passages else 0
        self.tokens_since_retrieval = 0
        self.generated = 0
        self.low_confidence = False
        self.pending: Segment | None = None  # the flagged segment of the last "regenerate"
        self.ground = False  # the last kept segment is written again under the strict grounding prompt next
        self.grounding: tuple[Segment, list[Piece], int] | None = None  # ... with this prompt (not saved)
        self.done = False  # the answer is complete (a restored segment had ended the turn, a repeat was cut)
        self.searched: list[str] = []  # this answer's searches so far (the query guards' memory)
        self.pre_draft: str | None = None  # the draft and flagged segment before the first retrieval
        self.goes_on = True  # another round follows the last one
        self.warnings: list[str] = []  # e.g. a knowledge base that did not answer a search
        self.evicted: list[str] = []  # passages evicted to fit the last segment
        self.paused: tuple[SearchRequest, RoundTrace] | None = None  # the search waited on, its round
        self.log: list[ContextOp] = []
        self.result: RIGResult | None = None
        self.started = time.perf_counter()
        self.observers = Observers(controller.callbacks)

    @property
    def request(self) -> SearchRequest | None:
        """The search the run waits on; None when it is not paused."""
        return self.paused[0] if self.paused else None

    def step(self) -> RoundTrace | SearchRequest | None:
        """The next round, the search it waits on, or None once `result` is ready."""
        if self.paused is not None:
            return self.paused[0]
        spent = self.generated >= self.controller.generation.max_answer_tokens and not self.ground  # a rewrite replaces
        if self.result is None and (not self.goes_on or spent):
            self.result = self.controller._result(self)
        if self.result is not None:
            return None
        self.observers = Observers(self.controller.callbacks)  # a resumed run may have new listeners
        return self.controller._round(self)

    def resume(self, request_id: str, hits: Sequence[Hit | str]) -> RoundTrace:
        """The paused round goes on with `hits` (a text is a passage of its own); returns the round."""
        request, trace = self._waiting(request_id)
        return self.controller._searched(self, trace, [_as_hit(h, request, i) for i, h in enumerate(hits)])

    def search(self, retriever: Retriever) -> RoundTrace:
        """The paused round's searches run on `retriever` (one batched call, merged by RRF)."""
        request, trace = self._waiting(None)
        try:
            with _timer(trace.timings, "retrieve"), collect_notes() as notes:
                hits = search_queries(retriever, request.queries, request.top_k,
                                      source=request.query.source or None)
            self.warnings += [f"round {trace.index}: {note}" for note in notes]
        except Exception as err:  # noqa: BLE001 - one failed round must not lose the answer
            return self.controller._searched(self, trace, error=err)
        return self.controller._searched(self, trace, hits)

    def state(self) -> RunState:
        """What `RIGController.restore` needs to go on from here."""
        request, waiting = self.paused or (None, None)
        counters = {"retrievals": self.retrievals, "tokens_since_retrieval": self.tokens_since_retrieval,
                    "generated": self.generated, "low_confidence": self.low_confidence, "done": self.done,
                    "ground": self.ground,
                    "goes_on": self.goes_on, "warnings": list(self.warnings),
                    "searched": list(self.searched), "pre_draft": self.pre_draft}
        return RunState(self.question, list(self.given), [list(t) for t in self.history], list(self.rounds),
                        request, waiting, counters, self.pending, list(self.evicted), list(self.log))

    @classmethod
    def restore(cls, controller: RIGController, state: RunState) -> Run:
        run = controller.start(state.question, state.passages, [(q, a) for q, a in state.history])
        for op in state.log:
            if op.op == "fit":
                run._fit(op.reserve)
            elif op.op == "accept" and op.segment is not None:
                run._accept(op.segment)
            elif op.op == "inject":
                run._inject(op.hits)
            elif op.op == "replace" and op.segment is not None:
                run._replace_last(op.segment)
            elif op.op == "go_on":
                run._go_on()
        run.rounds, run.pending, run.evicted = list(state.rounds), state.pending, list(state.evicted)
        for name, value in state.counters.items():
            setattr(run, name, value)
        run.paused = (state.request, state.waiting) if state.request and state.waiting else None
        return run

    def _waiting(self, request_id: str | None) -> tuple[SearchRequest, RoundTrace]:
        if self.paused is None:
            raise InputError("this run is not waiting for a search: call step() until it returns a SearchRequest")
        request, trace = self.paused
        if request_id is not None and request_id != request.id:
            asked = "; ".join(request.queries)
            asked = asked if len(asked) <= 80 else asked[:79] + "…"
            raise InputError(f"these hits answer search {str(request_id)[:40]!r}, but the run waits on search "
                             f"{request.id!r} (round {request.round}: {asked!r})")
        self.paused = None
        return request, trace

    # the context's operations, logged so a saved run rebuilds its context exactly
    def _fit(self, reserve: int) -> list[str]:
        self.log.append(ContextOp("fit", reserve=reserve))
        return self.controller.context.fit(reserve)

    def _accept(self, segment: Segment) -> None:
        self.log.append(ContextOp("accept", segment=segment))
        self.controller.context.accept(segment)

    def _inject(self, hits: Sequence[Hit]) -> Injection:
        self.log.append(ContextOp("inject", hits=list(hits)))
        return self.controller.context.inject(hits)

    def _replace_last(self, segment: Segment) -> None:
        self.log.append(ContextOp("replace", segment=segment))
        self.controller.context.replace_last(segment)

    def _go_on(self) -> None:
        self.log.append(ContextOp("go_on"))
        self.controller.context.go_on()


def _as_hit(hit: Hit | str, request: SearchRequest, i: int) -> Hit:
    """A supplied hit; a plain text becomes a passage named after the search it answers."""
    if isinstance(hit, Hit):
        return hit
    name = f"{request.id}-{i + 1}"
    return Hit(chunk_id=name, doc_id=name, title=request.query.text, text=str(hit), score=1.0)


def _goes_on(run: Run, trace: RoundTrace) -> bool:
    """Whether another round follows `trace`."""
    if run.ground:  # the kept segment is written again first, even after its end of turn
        return True
    if run.done:
        return False
    if trace.action in (Action.REGENERATE, Action.GO_ON, Action.RESTORE, Action.FALLBACK):
        return True
    if trace.action is Action.GROUND and trace.fallback:
        return True  # the original stays, and had not ended the answer (else run.done)
    if trace.action is Action.CONTINUE and trace.injection is not None and trace.injection.added:
        return True  # passages follow this segment: the model reads them, even after its end of turn
    return not (trace.segment.finished or not trace.segment.token_ids)  # end of turn, or nothing more


def _accepted_segments(rounds: Sequence[RoundTrace]) -> list[Segment]:
    """The segments the answer kept so far, in order (a restore keeps the regenerated one, a kept
    grounded rewrite replaces the one before it)."""
    kept: list[Segment] = []
    for i, r in enumerate(rounds):
        if r.action in (Action.ACCEPT, Action.CONTINUE, Action.SKIP):
            kept.append(r.segment)
        elif r.action in (Action.RESTORE, Action.FALLBACK) and (j := set_aside_round(rounds, i)) is not None:
            kept.append(rounds[j].segment)
        elif r.action is Action.GROUND and not r.fallback and kept:
            kept[-1] = r.segment
    return kept


class _timer:
    """Adds the block's wall time to `timings[stage]`."""

    def __init__(self, timings: dict[str, float], stage: str):
        self.timings, self.stage = timings, stage

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.stage] += time.perf_counter() - self.start
