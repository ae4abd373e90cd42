"""The RIG loop's owner of parts: generate a segment, decide, search, inject, continue or regenerate.

Retrieval-Interleaved Generation retrieves where a gap shows up in the draft rather than once
before writing. `max_rounds` counts retrieval rounds: once they are spent, generation goes on to
the end of the answer from what is already in context, and `low_confidence` is set only if a
decider still wanted retrieval after that. The controller holds the parts and starts a `Run`
per question (`rigkit.run`: the rounds themselves); a finished run becomes its `RIGResult` here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rigkit.answer_checks import AnswerChecks
from rigkit.callbacks import RoundCallback
from rigkit.citations import written_with
from rigkit.config import ControllerConfig, GeneratorConfig, QueryConfig
from rigkit.context import ContextManager
from rigkit.deciders.base import POLICIES, Decider, decider_policy
from rigkit.errors import InputError, RunStateError
from rigkit.generation.protocol import Generator, SupportsReset
from rigkit.grounding import ground as cite_and_check
from rigkit.guards import QueryGuard, whole_sentences
from rigkit.queries import QueryBuilder
from rigkit.retrieval.base import Retriever
from rigkit.run import STAGES, Run
from rigkit.run_state import RunState
from rigkit.short_answer import SHORT_ANSWER_MODES
from rigkit.text import check_question, strip_citations
from rigkit.trace import Hit, RIGResult, RoundTrace, SearchRequest
from rigkit.transcript import StopRule

__all__ = ["RIGController", "Run", "RoundCallback"]


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
        self.checks = AnswerChecks(self.config, context, generator, embed)
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
        if self.policy == "rewind" and context.config.layout != "prefix":
            raise InputError("controller.policy rewind goes on from the middle of a sentence, which reads as one "
                             "answer only in the prefix layout (passages before the question): set "
                             "context.layout=prefix")
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

    def start(self, question: str, passages: Sequence[Hit] = (), history: Sequence[tuple[str, str]] = (),
              reset: bool = True) -> Run:
        """A `Run` of `question`, stepped by its caller; it pauses at each search (see `Run`).
        `reset`: the generator forgets its cache and is seeded afresh (a new question)."""
        self._check_question(question)
        if reset and isinstance(self.generator, SupportsReset):
            self.generator.reset(self.generation.seed)
        self.context.start(question, passages, history)
        return Run(self, question, list(passages), [tuple(t) for t in history])

    def restore(self, state: RunState | str, reset: bool = True) -> Run:
        """A run saved with `Run.state()` (or its JSON), rebuilt over this controller's parts: the
        context is rebuilt from the run's log, no model call. A state that is malformed, or was
        saved by another controller or for another question, is a `RunStateError`. `reset=False`:
        the generator goes on from where it is (a served run resumed within its own request's life)."""
        # a state made in memory is checked as its JSON would be: nothing in it is trusted
        state = RunState.from_json(state) if isinstance(state, (str, bytes)) else RunState.from_dict(
            dataclasses.asdict(state) if isinstance(state, RunState) else state)
        history = [(q, a) for q, a in state.history]
        if state.fingerprint != self.fingerprint(state.question, state.passages, history):
            raise RunStateError("this saved run was made by another controller (model or settings) "
                                "or for another question: it is not restored here")
        return self.start(state.question, state.passages, history, reset=reset).restored(state)

    def fingerprint(self, question: str, passages: Sequence[Hit], history: Sequence[tuple[str, str]]) -> str:
        """What a saved run must match to be restored here: the model, the settings, the question."""
        named = {"model": self.generator.spec or type(self.generator).__name__, "decider": type(self.decider).__name__,
                 "config": dataclasses.asdict(self.config), "generation": dataclasses.asdict(self.generation),
                 "run": self.run_config, "policy": self.policy, "top_k": self.top_k, "question": question,
                 "passages": [h.chunk_id for h in passages], "history": [list(t) for t in history]}
        return hashlib.sha256(json.dumps(named, sort_keys=True, default=str).encode()).hexdigest()[:32]

    # -- the result ----------------------------------------------------------------------------
    def result(self, run: Run) -> RIGResult:
        """The finished `run` as its result: the clean answer, its citations and checks, what it cost."""
        totals = {stage: sum(r.timings.get(stage, 0.0) for r in run.rounds) for stage in STAGES}
        totals["total"] = time.perf_counter() - run.started
        prefilled = sum(r.tokens_prefilled for r in run.rounds)
        known = [r.tokens_reused for r in run.rounds if r.tokens_reused is not None]
        # a served model that does not report its prefix cache: "unknown", never a false 0
        reused = sum(known) if len(known) == len(run.rounds) else None
        generated = sum(len(r.segment.token_ids) for r in run.rounds)
        parts = [(text, seg.context_ids) for text, seg in self.context.draft_parts()]
        answer, trimmed = self.checks.ending(self.checks.clean(self.context.draft))
        # citations (by word overlap, or the model's own [n] checked against what it saw), facts
        grounded = cite_and_check(
            answer, run.question, self.context.seen_passages,
            written_with(parts, self.checks.clean), cite=self.context.config.cite,
            numbers=self.context.passage_numbers, tags=self.citations,
            warn_unretrieved=self.config.warn_no_retrieval and self.citations)
        if self.config.end_on_sentence and answer and not trimmed and whole_sentences(answer) != answer:
            grounded.warnings.append("the answer ends mid-sentence and holds no whole sentence to keep")
        return RIGResult(
            question=run.question,
            answer=grounded.answer,
            rounds=run.rounds,
            used_retrieval_times=run.counters.retrievals,
            citations=grounded.cited,
            tokens={"prompt": prefilled + (reused or 0), "generated": generated, "prefilled": prefilled, "reused": reused},
            timings=totals,
            low_confidence=run.counters.low_confidence,
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
            warnings=run.counters.warnings + grounded.warnings,
            short_answer=self.checks.short_answer(run.question, strip_citations(grounded.answer)),
            trimmed=trimmed,
            pre_retrieval_draft=run.counters.pre_draft,
        )

    def _check_question(self, question: str) -> None:
        check_question(question)
        limit = self.context.context_limit - self.generation.max_answer_tokens
        size = self.generator.count_tokens(question)
        if size > limit:
            raise InputError(
                f"the question is {size} tokens; the model's context leaves room for {limit} "
                f"(context {self.context.context_limit} minus {self.generation.max_answer_tokens} for the answer)"
            )
