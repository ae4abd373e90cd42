"""What every endpoint calls: one loaded model and index, reached through the usual controller.

`RigService` loads its generator and retriever once through `rigkit.build` and, per request,
builds a controller over those same parts (`build_controller(config, generator=...,
retriever=...)`), so the server runs exactly the loop `rigkit ask` runs: there is no second copy
of it here. Model work goes through the `ModelWorker` (bounded queue, `workers` threads); each
thread has its own generator (built by `generator_factory`, by default from the config), so
concurrent loops share no KV cache or sampling settings; searches take turns on the one index
(`rigkit.serve.searcher`). `workers` defaults to the backend's (`rigkit.build.default_concurrency`):
1 for an in-process model, several for a served one, whose server batches the concurrent calls.

Client-side tools: when a request declares a `search` tool, its run is stepped here
(`RIGController.start`) and pauses where the decider wants a search (a `SearchRequest`). A round
with several needs (several marker phrases, or several intents of a `marker` / `keywords` query
builder, which makes its query from them) asks for one search per need: one assistant message
with several `tool_calls`. The paused run is kept here under its tool call ids (at most
`MAX_PAUSED` ids, each for `PAUSED_SECONDS`); the next request, carrying the `role: "tool"`
results, resumes it with them over that request's parts (`RIGController.restore`: the context is
rebuilt from the run's log, so nothing written before is generated again). When the
paused run is gone (expired, or another server), the results are read as passages given before
the question and the answer is written afresh.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rigkit.build import Serving
from rigkit.config import RunConfig
from rigkit.controller import RoundCallback
from rigkit.errors import RunStateError
from rigkit.serve.conversations import Conversations
from rigkit.serve.paused import PausedRuns, PerNeedQueries
from rigkit.serve.searcher import SharedSearcher
from rigkit.serve.tools import SEARCH, Tool, declare, model_calls, tools_prompt
from rigkit.serve.worker import Job, ModelWorker
from rigkit.streaming import Cancelled, StreamEvent, TokenStream
from rigkit.text import detect_language
from rigkit.trace import Hit, RIGResult, RoundTrace, SearchRequest
from rigkit.truncation import cap_text

__all__ = ["RigService", "AskOptions", "ToolCall", "ToolRound", "ToolStep", "round_summary"]


@dataclass(frozen=True)
class AskOptions:
    """Per-request settings (sampling and loop limits); None keeps the served config's value."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    max_rounds: int | None = None
    top_k: int | None = None
    decider: str | None = None
    threshold: float | None = None


@dataclass
class ToolRound:
    """One finished client-side tool round: the calls of one assistant message and their results."""

    call_ids: list[str]
    queries: list[str]
    results: list[str]
    names: list[str] = field(default_factory=list)  # each call's tool ("search" when not given)


@dataclass
class ToolCall:
    """One call the client is asked to run: a tool and its arguments (a `search` has a `query`)."""

    call_id: str
    query: str = ""
    name: str = SEARCH
    arguments: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.arguments:
            self.arguments = {"query": self.query}
        self.query = self.query or str(self.arguments.get("query", ""))


@dataclass
class ToolStep:
    """The outcome of one tool-mode request: a finished answer, or searches for the client."""

    result: RIGResult | None = None
    calls: list[ToolCall] = field(default_factory=list)
    draft: str = ""
    tokens: dict[str, int] = field(default_factory=dict)

    @property
    def queries(self) -> list[str]:
        return [c.query for c in self.calls if c.name == SEARCH]


class RigService:
    """The served run: config, generator, retriever, worker, and the pending tool turns."""

    def __init__(
        self,
        config: RunConfig,
        *,
        generator: Any = None,
        retriever: Any = None,
        max_queue: int = 8,
        workers: int | None = None,
        generator_factory: Callable[[], Any] | None = None,
        tool_result_tokens: int | None = None,
        load_model: bool = True,
    ):
        """Loads the index now, and the model now or (`load_model=False`) at the first question.

        `workers` loops run at once (None: the backend's default); the first uses `generator`,
        every other worker (and the first, when `generator` is None) one of its own from
        `generator_factory` (default: built from the config), made when that worker first runs."""
        self.config = config
        from rigkit.build import build_generator, build_retriever, default_concurrency
        from rigkit.serve.options import check_serve_options

        check_serve_options(max_queue=max_queue, workers=workers, tool_result_tokens=tool_result_tokens)

        workers = default_concurrency(config.generator) if workers is None else workers
        if generator is not None and generator_factory is None and workers > 1:
            raise ValueError("several workers need a generator_factory: one generator per worker")
        if retriever is None:  # a cross-encoder is loaded once, here; upr scores with each worker's model, per run
            upr = (config.retrieval.rerank or "").strip() == "upr"
            retriever = build_retriever(dataclasses.replace(config.retrieval, rerank="none") if upr else config.retrieval)
        if generator is None and load_model:
            generator = build_generator(config.generator)
        # the workers' rounds and /retrieve, /rpc, MCP searches share the index: one at a time, fairly
        self.retriever = SharedSearcher(retriever)
        self._generators: list[Any] = [generator] + [None] * (workers - 1)
        self._factory = generator_factory or (lambda: build_generator(self.config.generator))
        self._load_lock = threading.Lock()
        self.model_name = config.generator.model
        self.tool_result_tokens = tool_result_tokens or config.context.max_passage_tokens
        self.worker = ModelWorker(max_queue, workers)
        self.paused = PausedRuns()  # client-tool runs waiting for the client's results
        self.conversations = Conversations()  # histories kept for clients that name a conversation
        self.started = int(time.time())

    @property
    def generator(self) -> Any:
        """The first worker's model (names, token counts), loaded on first use when the service
        was built without it."""
        return self.generator_of(0)

    def generator_of(self, slot: int | None) -> Any:
        """The generator of worker `slot` (None: the first), made on first use."""
        slot = slot or 0
        if self._generators[slot] is None:
            with self._load_lock:
                if self._generators[slot] is None:
                    self._generators[slot] = self._factory()
        return self._generators[slot]

    # -- names -----------------------------------------------------------------------------------
    def model_ids(self) -> list[str]:
        """Names a request may give as `model`: the configured name, and the loaded spec."""
        names = [self.model_name]
        spec = self._generators[0].spec if self._generators[0] is not None else ""
        if spec and spec not in names:
            names.append(spec)
        return names

    # -- retrieval (no model needed) ----------------------------------------------------------
    def search(self, queries: Sequence[str], top_k: int, filters: Any = None,
               source: str | None = None) -> list[list[Hit]]:
        """Hits per query from the served index (one request for a remote index); `filters`
        restrict it to chunks whose metadata passes (`rigkit.retrieval.filters`), `source` to
        one knowledge base of several."""
        return self.retriever.search_many(list(queries), top_k, filters, source=source)

    # -- conversations kept here ----------------------------------------------------------------
    def history_of(self, conversation: str | None, history: Sequence[tuple[str, str]]) -> tuple[str | None, list]:
        """The conversation's id (None: stateless) and its kept turns before `history` (404 when
        the id is unknown or expired)."""
        if conversation is None:
            return None, list(history)
        conversation, kept = self.conversations.open(conversation)
        return conversation, kept + list(history)

    def remember(self, conversation: str | None, question: str, outcome: Any) -> Any:
        """`outcome` (an answer, or a tool step) after a finished answer joined `conversation`."""
        result = outcome.result if isinstance(outcome, ToolStep) else outcome
        if conversation is not None and result is not None:
            self.conversations.add(conversation, question, result.answer)
        return outcome

    # -- the RIG loop (on the worker thread) --------------------------------------------------
    def ask(
        self,
        job: Job,
        question: str,
        history: Sequence[tuple[str, str]] = (),
        options: AskOptions = AskOptions(),
        on_event: Callable[[StreamEvent], None] | None = None,
        on_round: Callable[[RoundTrace], None] | None = None,
        hold: bool = False,
    ) -> RIGResult:
        """Server-side RIG: one controller run; events are sent as they happen."""
        generator = self.generator_of(job.slot)
        stream, callbacks = self._callbacks(job, on_event, on_round, hold)
        controller = self._controller(options, callbacks, generator, Serving(check_stop=_stop_check(job)))
        with _sampling(generator, options):
            return controller.run(question, history=history)

    def tool_step(
        self,
        job: Job,
        question: str,
        history: Sequence[tuple[str, str]],
        rounds: Sequence[ToolRound],
        options: AskOptions = AskOptions(),
        on_event: Callable[[StreamEvent], None] | None = None,
        on_round: Callable[[RoundTrace], None] | None = None,
        hold: bool = True,
        tools: Mapping[str, Tool] | None = None,
    ) -> ToolStep:
        """Client-side tools: run until the loop pauses at a call the client has not answered yet.

        `tools` are the client's (default: its `search` alone); searches it did not declare are
        run here on the served index, and only its own tools' calls go back to it."""
        tools = dict(tools) if tools is not None else declare([{"name": SEARCH}])
        generator = self.generator_of(job.slot)
        stream, callbacks = self._callbacks(job, on_event, on_round, hold)
        paused = self.paused.take(question, rounds[-1].call_ids) if rounds else None
        language = detect_language(question)
        serving = Serving(queries=PerNeedQueries, check_stop=_stop_check(job),
                          tools_prompt=lambda protocol: tools_prompt(tools, protocol.open, protocol.close, language))
        controller = self._controller(options, callbacks, generator, serving)
        with _sampling(generator, options):
            run = None
            if paused is not None:  # goes on over this request's parts (its worker's model, its stream)
                saved, served = paused
                try:
                    run = controller.restore(saved.state(), reset=False)  # its sampling goes on
                except RunStateError:  # asked again with other settings: written afresh, as below
                    run = None
                else:
                    run.resume(run.request.id, served + self._tool_hits(rounds[-1]))
            if run is None:  # a new question, or its paused run is gone: the results go before it
                run = controller.start(question, [h for r in rounds for h in self._tool_hits(r)], history)
            while (step := run.step()) is not None:
                if not isinstance(step, SearchRequest):
                    continue
                calls, served = self._calls(run, step, tools)
                if not calls:  # every need was a search the client left to the served index
                    run.resume(step.id, served)
                    continue
                self.paused.keep(run, [c.call_id for c in calls], served)
                generated = sum(len(r.segment.token_ids) for r in run.rounds) + len(run.paused[1].segment.token_ids)
                return ToolStep(calls=calls, draft=stream.committed, tokens={"generated": generated})
        return ToolStep(result=run.result, draft=stream.committed)

    def _calls(self, run: Any, request: SearchRequest, tools: Mapping[str, Tool]) -> tuple[list[ToolCall], list[Hit]]:
        """The client's calls for a paused round (one per need), and the hits of the searches it
        left to the served index."""
        queries = run.controller.query_builder.queries() or request.queries
        markers = run.paused[1].decision.evidence.get("markers") or []
        phrases = [m["phrase"] for m in markers if m.get("phrase")]
        calls, served = [], []
        for name, arguments in model_calls(phrases, queries, tools, request.top_k, request.query.source):
            if name == SEARCH and SEARCH not in tools:
                served += self.search([arguments["query"]], request.top_k, source=request.query.source or None)[0]
            else:
                calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=arguments))
        return calls, served

    # -- helpers -------------------------------------------------------------------------------
    def _callbacks(self, job: Job, on_event, on_round, hold: bool) -> tuple[TokenStream, list[Any]]:
        stream = TokenStream(
            on_event or (lambda event: None), hold=hold,
            marker_tag=self.config.context.marker_tag, should_stop=job.cancelled.is_set,
        )
        callbacks: list[Any] = [stream]
        if on_round is not None:
            callbacks.append(_RoundSink(on_round))
        return stream, callbacks

    def _controller(self, options: AskOptions, callbacks: list[Any], generator: Any, serving: Serving):
        from rigkit.build import build_controller

        config = self.config.with_decider(options.decider).override(
            generator={"max_answer_tokens": options.max_tokens, "seed": options.seed},
            controller={"max_rounds": options.max_rounds},
            retrieval={"top_k": options.top_k},
            decider={"threshold": options.threshold},
        )
        # the served index is reranked once for every request (upr: here, over this worker's model);
        # a client gone before a history summary is asked for costs no model call (`check_stop`)
        return build_controller(config, generator=generator, retriever=self.retriever, callbacks=callbacks,
                                serving=serving)

    def _tool_hits(self, tool_round: ToolRound) -> list[Hit]:
        """The client's results as passages, each capped with a visible truncation note."""
        hits = []
        names = tool_round.names or [SEARCH] * len(tool_round.call_ids)
        for call_id, name, text in zip(tool_round.call_ids, names, tool_round.results):
            # the citation names the tool: [[citation:weather:call_…]]
            hits.append(Hit(chunk_id=f"{name}:{call_id}", doc_id=name, title=f"{name} result",
                            text=self.cap_text(text), score=1.0, metadata={"tool": name, "tool_call_id": call_id}))
        return hits

    def cap_text(self, text: str) -> str:
        """At most `tool_result_tokens` tokens of `text`, then "[truncated]" when cut."""
        count = self.generator.count_tokens
        return cap_text(text, self.tool_result_tokens, count, note=" … [truncated]")  # Chinese results are cut between characters


def _stop_check(job: Job) -> Callable[[], None]:
    """Raises `Cancelled` once the job's client has gone away."""

    def check() -> None:
        if job.cancelled.is_set():
            raise Cancelled("the client went away")

    return check


def grounding_summary(result: RIGResult) -> dict[str, Any]:
    """What the grounding checks found: sentences with unsupported facts, citations removed as
    unseen, and warnings (e.g. an answer that cites nothing)."""
    return {"suspicious": [dataclasses.asdict(s) for s in result.suspicious],
            "removed_citations": [dataclasses.asdict(c) for c in result.removed_citations],
            "warnings": list(result.warnings)}


def round_summary(trace: RoundTrace) -> dict[str, Any]:
    """The `round` event: decision, query, hits, injected ids, budget (not the token lists)."""
    d, b = trace.decision, trace.budget
    return {
        "index": trace.index,
        "action": trace.action,
        "segment": trace.segment.text,
        "decision": {"retrieve": d.retrieve, "score": d.score, "decider": d.decider,
                     "threshold": d.threshold, "reason": d.reason},
        "query": trace.query.text if trace.query else None,
        "hits": [{"id": h.chunk_id, "title": h.title, "score": h.score} for h in trace.hits],
        "injected": trace.injection.added if trace.injection else [],
        "budget": {**dataclasses.asdict(b), "used": b.used, "free": b.free},
        "error": trace.error,
    }


class _RoundSink(RoundCallback):
    def __init__(self, on_round: Callable[[RoundTrace], None]):
        self.on_round = on_round

    def on_round_end(self, round_trace: RoundTrace) -> None:
        self.on_round(round_trace)


class _sampling:
    """Per-request temperature / top_p on the shared generator, restored afterwards."""

    def __init__(self, generator: Any, options: AskOptions):
        self.generator = generator
        self.values = {k: v for k, v in (("temperature", options.temperature), ("top_p", options.top_p))
                       if v is not None and hasattr(generator, k)}

    def __enter__(self) -> None:
        self.saved = {k: getattr(self.generator, k) for k in self.values}
        for k, v in self.values.items():
            setattr(self.generator, k, v)

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            setattr(self.generator, k, v)
