"""One question going through the RIG loop: its rounds, stepped by the caller.

A round generates a segment and asks the decider about it. Kept, it joins the answer; flagged,
the round pauses at a `SearchRequest` until hits come back, then the passages are injected and
the segment stays (continue), is written again after them (regenerate), or is kept up to its first
flagged word and written on from there (rewind). A rewrite that comes
back empty or does not earn its place gives way to the set-aside segment; a repeat is cut and
ends the answer. Each round records what it kept (`RoundTrace.kept`), and the answer's segments
are read from that alone (`rigkit.trace.kept_segments`).

`Run` owns the loop's state (`RunCounters`, the rounds, the context's log); the controller
holds the parts it uses and turns a finished run into its `RIGResult`.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rigkit.callbacks import Observers
from rigkit.context_log import ContextLog
from rigkit.deciders.base import DecisionState
from rigkit.errors import InputError
from rigkit.queries import resolve_query, standalone_question
from rigkit.retrieval.base import Retriever
from rigkit.retrieval.hybrid import search_queries
from rigkit.retrieval.sources import collect_notes
from rigkit.run_state import RunCounters, RunState
from rigkit.trace import (
    Action,
    Decision,
    Hit,
    Injection,
    Kept,
    RoundTrace,
    SearchRequest,
    Segment,
    kept_segments,
)
from rigkit.transcript import Piece

if TYPE_CHECKING:  # the controller makes runs; a run only reads the parts it holds
    from rigkit.controller import RIGController

__all__ = ["STAGES", "Run"]

STAGES = ("generate", "decide", "query", "retrieve", "inject")


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
        self.counters = RunCounters(retrievals=1 if passages else 0)
        self.pending: Segment | None = None  # the flagged segment of the last "regenerate"
        self.rewrite: tuple[Segment, list[Piece], int] | None = None  # the grounded rewrite's prompt (not saved)
        self.evicted: list[str] = []  # passages evicted to fit the last segment
        self.paused: tuple[SearchRequest, RoundTrace] | None = None  # the search waited on, its round
        self.log = ContextLog(controller.context)
        self.result = None
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
        n = self.counters
        spent = n.generated >= self.controller.generation.max_answer_tokens and not n.ground  # a rewrite replaces
        if self.result is None and (not n.goes_on or spent):
            self.result = self.controller.result(self)
        if self.result is not None:
            return None
        self.observers = Observers(self.controller.callbacks)  # a resumed run may have new listeners
        return self._round()

    def resume(self, request_id: str, hits: Sequence[Hit | str]) -> RoundTrace:
        """The paused round goes on with `hits` (a text is a passage of its own); returns the round."""
        request, trace = self._waiting(request_id)
        return self._searched(trace, [_as_hit(h, request, i) for i, h in enumerate(hits)])

    def search(self, retriever: Retriever) -> RoundTrace:
        """The paused round's searches run on `retriever` (one batched call, merged by RRF)."""
        request, trace = self._waiting(None)
        try:
            with _timer(trace.timings, "retrieve"), collect_notes() as notes:
                hits = search_queries(retriever, request.queries, request.top_k,
                                      source=request.query.source or None)
            self.counters.warnings += [f"round {trace.index}: {note}" for note in notes]
        except Exception as err:  # noqa: BLE001 - one failed round must not lose the answer
            return self._searched(trace, error=err)
        return self._searched(trace, hits)

    def state(self) -> RunState:
        """What `RIGController.restore` needs to go on from here."""
        request, waiting = self.paused or (None, None)
        return RunState(self.question, list(self.given), [list(t) for t in self.history], list(self.rounds),
                        request, waiting, dataclasses.replace(self.counters), self.pending, list(self.evicted),
                        list(self.log.ops), self.controller.fingerprint(self.question, self.given, self.history))

    def restored(self, state: RunState) -> Run:
        """This fresh run brought to where `state` (checked by `RIGController.restore`) was saved:
        the context rebuilt from its log."""
        self.log.replay(state.log)
        self.rounds, self.pending, self.evicted = list(state.rounds), state.pending, list(state.evicted)
        self.counters = dataclasses.replace(state.counters)
        self.paused = (state.request, state.waiting) if state.request and state.waiting else None
        return self

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

    # -- the round -----------------------------------------------------------------------------
    def _round(self) -> RoundTrace | SearchRequest:
        """One segment and the decider's verdict on it; a search pauses the round (`_searched`)."""
        c, n = self.controller, self.counters
        if n.ground and (rewritten := _grounded_rewrite(self)) is not None:
            return rewritten
        state = _decision_state(self)
        state.rewrite_of = self.pending  # a rewrite: streams show it only once it is judged
        self.observers.on_round_start(len(self.rounds), state)
        timings = dict.fromkeys(STAGES, 0.0)
        with _timer(timings, "generate"):
            segment = self._generate()
        n.generated += len(segment.token_ids)
        n.tokens_since_retrieval += len(segment.token_ids)
        state.tokens_since_retrieval = n.tokens_since_retrieval
        with _timer(timings, "decide"):
            decision = c.decider.decide(segment, state)
        decision.segment_text = segment.text
        trace = RoundTrace(index=len(self.rounds), segment=segment, decision=decision, timings=timings,
                           tokens_prefilled=segment.tokens_prefilled, tokens_reused=segment.tokens_reused,
                           kept=Kept.NOTHING)
        if (self.pending is not None or _after_rewind(self.rounds)) and segment.finished and not segment.text.strip():
            if not c.context.nudged:  # the model ended its turn after the passages: ask it to go on once
                self._go_on(trace)
            elif self.pending is not None and c.config.restore:
                self._put_back(trace, Action.RESTORE)  # empty again: the set-aside segment is kept
            else:  # controller.restore off (the oracle's control), or a rewind: nothing set aside, the answer ends
                self.log.keep(trace, Kept.SEGMENT)
        elif self.pending is not None and (fault := c.checks.rewrite_fault(self.rounds, segment)):
            self._put_back(trace, Action.FALLBACK, fault)
        elif (repeat := c.checks.repeat_at(segment)) is not None:
            self._cut_repeat(trace, *repeat)
        elif not decision.retrieve:
            self.log.keep(trace, Kept.SEGMENT)
        elif self._cannot_retrieve(segment):
            self._skip(trace)
        else:
            return self._search_request(trace, state)
        return self._end_round(trace)

    def _search_request(self, trace: RoundTrace, state: DecisionState) -> RoundTrace | SearchRequest:
        """What to search for the segment's gap: the loop pauses here until hits come back."""
        c = self.controller
        try:
            with _timer(trace.timings, "query"):
                # a follow-up's "it" is named: in the question the builder reads, then in each search
                query = c.query_builder.build(self.asked, state.draft + trace.segment.text, trace.decision, state)
                trace.query = resolve_query(query, self.asked, self.history)
        except Exception as err:  # noqa: BLE001 - one failed round must not lose the answer
            return self._searched(trace, error=err)
        searches, trace.guards = c.query_guard.screen(trace.query, self.counters.searched)
        if not searches:  # every search was a repeat, empty or garbage: nothing new to read
            self._skip(trace)
            return self._end_round(trace)
        self.counters.searched += searches
        request = SearchRequest(id=uuid.uuid4().hex[:12], round=trace.index, queries=searches, top_k=c.top_k,
                                query=trace.query, question=self.question, draft=state.draft + trace.segment.text)
        self.paused = (request, trace)
        return request

    def _searched(self, trace: RoundTrace, hits: Sequence[Hit] = (), error: Exception | None = None) -> RoundTrace:
        """The paused round goes on with its hits: inject them, keep the segment or write it again."""
        n, segment = self.counters, trace.segment
        if error is not None:  # recorded in the round and the result; not a retrieval, so no round spent
            trace.error, trace.hits = f"{type(error).__name__}: {error}", []
            self.log.keep(trace, Kept.SEGMENT)
            return self._end_round(trace)
        trace.hits = list(hits)
        if n.pre_draft is None and n.retrievals == 0:  # what the answer would have said without retrieval
            n.pre_draft = self.controller.checks.clean(self.controller.context.draft + segment.text)
        n.retrievals += 1
        n.tokens_since_retrieval = 0
        policy = self.controller.policy
        if policy == "continue":
            self.log.keep(trace, Kept.SEGMENT)  # the segment (e.g. its marker) stays; passages follow
        with _timer(trace.timings, "inject"):
            trace.injection = self.log.inject(trace.hits) if trace.hits else Injection()
        if policy != "continue" and not trace.injection.added:
            self.log.keep(trace, Kept.SEGMENT)  # nothing new to read: writing it again would repeat it
            policy = "continue"
        elif policy != "continue":
            # regenerate keeps nothing; rewind keeps the words before the first flagged one, and the
            # model writes on from there (a decider that marks no word: the whole segment again)
            flagged = [s.char_start for s in trace.decision.spans if s.char_start >= 0] if policy == "rewind" else []
            self._keep_start(trace, min(flagged, default=0))
        trace.action = Action(policy)
        return self._end_round(trace)

    def _end_round(self, trace: RoundTrace) -> RoundTrace:
        """The round's record completed and told to the observers; whether another follows."""
        c, n = self.controller, self.counters
        self.pending = (trace.segment if trace.action is Action.REGENERATE
                        else self.pending if trace.action is Action.GO_ON else None)
        c.checks.check_support([*self.rounds, trace])
        _record_context(self, trace)
        self.rounds.append(trace)
        self.rewrite = _rewrite_prompt(self) if c.config.rewrite_unsupported and trace.unsupported else None
        n.ground = self.rewrite is not None
        self.observers.on_round_end(trace)
        n.goes_on = _goes_on(self, trace)
        return trace

    # -- the steps around it -------------------------------------------------------------------
    def _generate(self) -> Segment:
        """The next segment; passages are evicted first (`evicted`) to fit it in the context."""
        c = self.controller
        budget = min(c.generation.max_segment_tokens, c.generation.max_answer_tokens - self.counters.generated)
        self.evicted = self.log.fit(budget)  # the model's context limit holds; refuses if it cannot
        segment = c.generator.next_segment(c.context.pieces(), c.stop, budget, on_token=self.observers.token_sink)
        segment.context_ids = [h.chunk_id for h in c.context.passages]  # all it may cite
        return segment

    def _put_back(self, trace: RoundTrace, action: Action, fault: str = "") -> None:
        """The set-aside segment is kept after the passages it was flagged for; the rewrite is dropped.

        `restore`: the rewrite came back empty at end of turn (small models sometimes end the turn
        right after the passages); `fallback`: it did not earn its place (`fault` says why)."""
        assert self.pending is not None
        if action is Action.FALLBACK:
            self.pending.context_ids = [h.chunk_id for h in self.controller.context.passages]  # it may cite them
        self.log.keep(trace, Kept.SET_ASIDE, self.pending)
        dropped = len(trace.segment.token_ids) if action is Action.FALLBACK else 0  # a restore's empty turn end stays counted
        self.counters.generated += len(self.pending.token_ids) - dropped
        self.counters.done = self.pending.finished
        trace.action, trace.fallback = action, fault
        why = fault or "the rewrite came back empty twice"
        trace.unused = _unused(self.rounds, f"{why}: the sentence written before it is kept")

    def _keep_start(self, trace: RoundTrace, cut: int) -> None:
        """Keep the segment's whole tokens up to character `cut` (nothing if none); the rest is not counted."""
        segment = trace.segment
        kept = segment.upto(cut)
        if kept is not None:
            self.log.keep(trace, Kept.PREFIX, kept)
        self.counters.generated -= len(segment.token_ids) - (len(kept.token_ids) if kept else 0)

    def _go_on(self, trace: RoundTrace) -> None:
        """The rewrite came back empty at end of turn: small models often end the turn right after
        the passages. Ask once, in a turn of its own, to go on from them; the set-aside segment
        waits (restored only if this comes back empty too)."""
        self.log.go_on(trace)
        trace.action = Action.GO_ON
        trace.guards.append("empty rewrite: asked to go on from the passages")

    def _cut_repeat(self, trace: RoundTrace, cut: int, kind: str = "repeat") -> None:
        """Keep the segment up to where it repeats the answer, and end the answer there."""
        trace.guards.append(f"{kind}: {trace.segment.text[cut:].strip()!r}")
        self._keep_start(trace, cut)
        trace.action, self.counters.done = Action.REPEAT, True

    def _cannot_retrieve(self, segment: Segment) -> bool:
        """No retrieval rounds left, or no answer tokens left to read passages with."""
        c, n = self.controller, self.counters
        return (n.retrievals >= c.config.max_rounds or not segment.text.strip() and segment.finished
                or c.policy == "continue" and n.generated >= c.generation.max_answer_tokens)

    def _skip(self, trace: RoundTrace) -> None:
        """The decider fired but retrieval cannot help now: keep the segment, finish from context."""
        self.counters.low_confidence = self.counters.retrievals >= self.controller.config.max_rounds
        trace.action = Action.SKIP
        self.log.keep(trace, Kept.SEGMENT)



def _after_rewind(rounds: Sequence[RoundTrace]) -> bool:
    """Whether the next round goes on from a rewind (past a go-on turn): its text is the rewrite."""
    last = next((r for r in reversed(rounds) if r.action is not Action.GO_ON), None)
    return last is not None and last.action is Action.REWIND


# -- controller.rewrite_unsupported: steps of the run, apart so `Run` reads as the round --------------
def _goes_on(run: Run, trace: RoundTrace) -> bool:
    """Whether another round follows `trace`."""
    if run.counters.ground:  # the kept segment is written again first, even after its end of turn
        return True
    if run.counters.done:
        return False
    if trace.kept in (Kept.NOTHING, Kept.WAITING, Kept.SET_ASIDE):
        return True  # a rewrite follows, or the set-aside segment had not ended the answer (else done)
    if trace.action is Action.REWIND:
        return True  # the model writes on from the kept words, with the passages
    if trace.action is Action.CONTINUE and trace.injection is not None and trace.injection.added:
        return True  # passages follow this segment: the model reads them, even after its end of turn
    return not (trace.segment.finished or not trace.segment.token_ids)  # end of turn, or nothing more


def _decision_state(run: Run) -> DecisionState:
    """What the decider (and `on_round_start`) sees before this round's segment."""
    c = run.controller
    state = DecisionState(question=run.question, draft=c.context.draft, passages=c.context.passages,
                          round_index=len(run.rounds), retrievals_done=run.counters.retrievals,
                          generator=c.generator, segments=kept_segments(run.rounds), history=list(run.history))
    last = next((r for r in reversed(run.rounds) if r.query is not None), None)
    if last is not None:
        state.last_query, state.last_hits = last.query, list(last.hits)
    return state


def _unused(rounds: Sequence[RoundTrace], why: str) -> dict[str, str]:
    """The passages of the last retrieval that no kept text was written from, each with `why`."""
    last = next((r for r in reversed(rounds) if r.injection is not None and r.injection.added), None)
    return dict.fromkeys(last.injection.added, why) if last is not None else {}


def _rewrite_prompt(run: Run) -> tuple[Segment, list[Piece], int] | None:
    """The last kept segment, the strict grounding prompt to write it again, and the tokens
    the rewrite may take; None when it cannot be written again (see `grounding_pieces`)."""
    c, kept = run.controller, kept_segments(run.rounds)
    if not kept:
        return None
    budget = min(c.generation.max_segment_tokens,
                 c.generation.max_answer_tokens - run.counters.generated + len(kept[-1].token_ids))
    pieces = c.context.grounding_pieces(kept[-1], budget)
    return None if pieces is None else (kept[-1], pieces, budget)

def _grounded_rewrite(run: Run) -> RoundTrace | None:
    """The last kept segment, flagged unsupported, written once more under the strict grounding
    prompt (action `ground`); the rewrite replaces it only if it is supported."""
    c, n = run.controller, run.counters
    prompt = run.rewrite or _rewrite_prompt(run)  # made when the round ended; a restored run makes it
    n.ground, run.rewrite = False, None
    if prompt is None:
        return None
    original, pieces, budget = prompt
    run.evicted = []  # nothing is fitted for the rewrite: it takes the place of the original
    state = _decision_state(run)
    state.rewrite_of = original
    run.observers.on_round_start(len(run.rounds), state)
    timings = dict.fromkeys(STAGES, 0.0)
    with _timer(timings, "generate"):  # the decider's early stop is for its own judgement: not here
        rewrite = c.generator.next_segment(pieces, dataclasses.replace(c.stop, early=None), budget,
                                           on_token=run.observers.token_sink)
    rewrite.context_ids = [h.chunk_id for h in c.context.passages]
    flagged = " ".join(run.rounds[-1].unsupported)
    decision = Decision(False, 0.0, f"written again under the strict grounding prompt: {flagged!r} was unsupported",
                        decider="grounding", segment_text=rewrite.text)
    trace = RoundTrace(index=len(run.rounds), segment=rewrite, decision=decision, action=Action.GROUND,
                       timings=timings, tokens_prefilled=rewrite.tokens_prefilled,
                       tokens_reused=rewrite.tokens_reused, kept=Kept.NOTHING)
    with _timer(timings, "decide"):
        trace.fallback = c.checks.ground_fault(rewrite)
    if trace.fallback:  # the original stays; the answer ends where it ended
        n.done = original.finished
    else:
        run.log.keep(trace, Kept.REWRITE)
        n.generated += len(rewrite.token_ids) - len(original.token_ids)
        n.done = False
    return run._end_round(trace)


def _record_context(run: Run, trace: RoundTrace) -> None:
    """The round's evictions, token budget, answer so far and retrieval count."""
    if evicted := run.evicted:  # passages evicted before this segment to fit the model's context
        trace.injection = trace.injection or Injection()
        trace.injection.evicted = evicted + trace.injection.evicted
    trace.budget = run.controller.context.budget()
    trace.draft = run.controller.checks.clean(run.controller.context.draft)
    trace.retrieval_round = run.counters.retrievals


def _as_hit(hit: Hit | str, request: SearchRequest, i: int) -> Hit:
    """A supplied hit; a plain text becomes a passage named after the search it answers."""
    if isinstance(hit, Hit):
        return hit
    name = f"{request.id}-{i + 1}"
    return Hit(chunk_id=name, doc_id=name, title=request.query.text, text=str(hit), score=1.0)


class _timer:
    """Adds the block's wall time to `timings[stage]`."""

    def __init__(self, timings: dict[str, float], stage: str):
        self.timings, self.stage = timings, stage

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.stage] += time.perf_counter() - self.start
