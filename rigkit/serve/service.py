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
results, resumes it with them: nothing written before is generated or replayed again. When the
paused run is gone (expired, or another server), the results are read as passages given before
the question and the answer is written afresh.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rigkit.config import RunConfig
from rigkit.controller import RoundCallback
from rigkit.serve.schemas import RequestError
from rigkit.serve.searcher import SharedSearcher
from rigkit.serve.worker import Job, ModelWorker
from rigkit.streaming import Cancelled, StreamEvent, TokenStream
from rigkit.trace import Hit, RIGResult, RoundTrace, SearchRequest

__all__ = ["RigService", "AskOptions", "ToolCall", "ToolRound", "ToolStep", "round_summary", "MAX_PAUSED",
           "PAUSED_SECONDS"]

MAX_PAUSED = 256  # tool call ids of paused client-tool runs kept; the oldest go first
PAUSED_SECONDS = 900.0  # how long a paused run waits for its tool results


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


@dataclass
class ToolCall:
    """One search the client is asked to run."""

    call_id: str
    query: str


@dataclass
class ToolStep:
    """The outcome of one tool-mode request: a finished answer, or searches for the client."""

    result: RIGResult | None = None
    calls: list[ToolCall] = field(default_factory=list)
    draft: str = ""
    tokens: dict[str, int] = field(default_factory=dict)

    @property
    def queries(self) -> list[str]:
        return [c.query for c in self.calls]


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

        workers = default_concurrency(config.generator) if workers is None else workers
        if generator is not None and generator_factory is None and workers > 1:
            raise ValueError("several workers need a generator_factory: one generator per worker")
        if retriever is None:
            retriever = build_retriever(config.retrieval)
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
        self._paused: OrderedDict[str, tuple[float, str, Any]] = OrderedDict()  # call id -> (when, question, run)
        self._paused_lock = threading.Lock()
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
        controller = self._controller(options, callbacks, generator=generator, stop=_stop_check(job))
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
    ) -> ToolStep:
        """Client-side tools: run until the loop pauses at a search the client has not done yet."""
        generator = self.generator_of(job.slot)
        stream, callbacks = self._callbacks(job, on_event, on_round, hold)
        run = self._take_paused(question, rounds[-1]) if rounds else None
        with _sampling(generator, options):
            if run is None:  # a new question, or its paused run is gone: the results go before it
                controller = self._controller(options, callbacks, generator=generator, stop=_stop_check(job))
                controller.query_builder = _PerNeedQueries(controller.query_builder)
                run = controller.start(question, [h for r in rounds for h in self._tool_hits(r)], history)
            else:
                run.controller.generator, run.controller.callbacks = generator, callbacks
                run.resume(run.request.id, self._tool_hits(rounds[-1]))
            while (step := run.step()) is not None:
                if isinstance(step, SearchRequest):
                    return self._ask_client(run, step, stream.committed)
        return ToolStep(result=run.result, draft=stream.committed)

    def _ask_client(self, run: Any, request: SearchRequest, draft: str) -> ToolStep:
        """The paused run kept under its calls' ids: one call per need of the round."""
        queries = run.controller.query_builder.queries() or request.queries
        calls = [ToolCall(f"call_{uuid.uuid4().hex[:24]}", q) for q in queries]
        with self._paused_lock:
            now = time.monotonic()
            for call in calls:  # a client may answer the calls of one message in any order
                self._paused[call.call_id] = (now, run.question, run)
            while self._paused and (len(self._paused) > MAX_PAUSED
                                    or now - next(iter(self._paused.values()))[0] > PAUSED_SECONDS):
                self._paused.popitem(last=False)
        generated = sum(len(r.segment.token_ids) for r in run.rounds) + len(run.paused[1].segment.token_ids)
        return ToolStep(calls=calls, draft=draft, tokens={"generated": generated})

    def _take_paused(self, question: str, answered: ToolRound) -> Any:
        """The paused run the results of `answered` are for (taken: one continuation resumes it)."""
        with self._paused_lock:
            found = {id(e[2]): e for c in answered.call_ids if (e := self._paused.get(c)) is not None}
            if len(found) > 1:
                raise RequestError("messages: the tool results answer searches of different answers; send the "
                                   "results of one assistant message's tool calls", "messages")
            if not found:
                return None
            when, asked, run = next(iter(found.values()))
            if asked != question:
                raise RequestError(f"messages: tool call {answered.call_ids[0]!r} was asked for another question "
                                   f"({asked[:80]!r})", "messages")
            for c in [c for c, e in self._paused.items() if e[2] is run]:
                del self._paused[c]
        return None if time.monotonic() - when > PAUSED_SECONDS else run

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

    def _controller(self, options: AskOptions, callbacks: list[Any], generator: Any, retriever: Any = None,
                    stop: Callable[[], None] | None = None):
        from rigkit.build import build_controller

        config = self.config.with_decider(options.decider).override(
            generator={"max_answer_tokens": options.max_tokens, "seed": options.seed},
            controller={"max_rounds": options.max_rounds},
            retrieval={"top_k": options.top_k},
            decider={"threshold": options.threshold},
        )
        controller = build_controller(
            config, generator=generator, retriever=retriever or self.retriever,
            callbacks=callbacks,
        )
        summarizer = controller.context.summarizer
        if summarizer is not None and stop is not None:
            summarizer.check_stop = stop  # a client gone before the summary is asked for costs no model call
        return controller

    def _tool_hits(self, tool_round: ToolRound) -> list[Hit]:
        """The client's results as passages, each capped with a visible truncation note."""
        hits = []
        for call_id, text in zip(tool_round.call_ids, tool_round.results):
            hits.append(Hit(chunk_id=call_id, doc_id=call_id, title="search result",
                            text=self.cap_text(text), score=1.0, metadata={"tool_call_id": call_id}))
        return hits

    def cap_text(self, text: str) -> str:
        """At most `tool_result_tokens` tokens of `text`, then "[truncated]" when cut."""
        count = self.generator.count_tokens
        limit = self.tool_result_tokens
        if count(text) <= limit:
            return text
        note = " … [truncated]"
        words = text.split(" ")
        lo, hi = 0, len(words)
        while lo < hi:  # the longest word prefix that fits with the note
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if count(" ".join(words[:mid]) + note) <= limit else (lo, mid - 1)
        return " ".join(words[:lo]) + note


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


# Query builders whose query is made from the decision's intents themselves: several intents
# are several searches. The others (masked, rewrite, attention) search for the whole sentence.
SPLIT_QUERY_MODES = ("marker", "keywords")


class _PerNeedQueries:
    """The run's query builder, remembering the last round so its needs can be asked one by one.

    `queries()` builds one query per need of that round (each marker, else each intent, alone),
    distinct and in order; empty when the round has one need or the builder does not split."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.mode = getattr(inner, "mode", "")
        self.last: tuple[Any, ...] | None = None

    def build(self, question: str, draft: str, decision: Any, state: Any = None) -> Any:
        self.last = (question, draft, decision, state)
        return self.inner.build(question, draft, decision, state)

    def queries(self) -> list[str]:
        if self.last is None or self.mode not in SPLIT_QUERY_MODES:
            return []
        question, draft, decision, state = self.last
        needs = _needs(decision)
        if len(needs) < 2:
            return []
        texts: list[str] = []
        for need in needs:
            text = self.inner.build(question, draft, need, state).text.strip()
            if text and text not in texts:
                texts.append(text)
        return texts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _needs(decision: Any) -> list[Any]:
    """The decision split into one decision per need: per marker, else per intent."""
    markers = [m for m in (decision.evidence.get("markers") or []) if m.get("phrase")]
    if len(markers) > 1:
        return [dataclasses.replace(decision, intents=[m["phrase"]],
                                    evidence={**decision.evidence, "markers": [m]}) for m in markers]
    intents = decision.intents
    if len(intents) > 1:
        aligned = len(decision.spans) == len(intents)
        return [dataclasses.replace(decision, intents=[intent],
                                    spans=[decision.spans[i]] if aligned else list(decision.spans))
                for i, intent in enumerate(intents)]
    return [decision]


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
