"""The typed, versioned record of a RIG run.

Everything that crosses module lines is a plain dataclass defined here: what the generator
produced (`Segment`), what a decider judged (`Decision`), what was searched (`Query`), what came
back (`Hit`), what the context manager did with it (`Injection`, `TokenBudget`), and one
`RoundTrace` per round inside a `RIGResult`. Widgets, plots and metrics are pure functions of
these; a result serialises to JSON and loads back exactly, so a notebook can replay a run
without a model. `RIGResult.to_html()` is the one view reached from here, imported when called.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

__all__ = [
    "TRACE_VERSION",
    "Action",
    "Kept",
    "set_aside_round",
    "Segment",
    "Span",
    "Decision",
    "Query",
    "Hit",
    "Injection",
    "HistoryFit",
    "TokenBudget",
    "RoundTrace",
    "Attribution",
    "Suspicion",
    "RemovedCitation",
    "RIGResult",
    "SearchRequest",
    "round_from_dict",
    "derived_kept",
    "kept_order",
    "kept_segments",
    "kept_part",
    "kept_segment",
    "answer_end",
]

# 2: segments record the passages they could see; results record per-sentence attributions.
# 3: rounds record fallbacks, loop-guard hits and unsupported sentences; results record the short
#    answer, a trimmed unfinished ending and the draft before the first retrieval.
# 4: a round may be a grounded rewrite (action ground); run states log a segment's replacement.
# 5: rounds record what they kept in the answer (`kept`); older rounds derive it from their action.
TRACE_VERSION = 5


class Action(str, Enum):
    """What the loop did with a round's segment.

    String-valued, so a trace's JSON holds the plain word and older results load unchanged.
    """

    ACCEPT = "accept"  # kept: the decider did not fire
    CONTINUE = "continue"  # kept, and the retrieved passages follow it
    REGENERATE = "regenerate"  # set aside and written again after the passages (FLARE-style)
    REWIND = "rewind"  # kept up to the flagged word; the rest is written again after the passages
    SKIP = "skip"  # the decider fired but no retrieval round or answer token was left: kept
    # the rewrite came back empty at end of turn: the model is asked, in a turn of its own, to go
    # on from the passages; the set-aside segment still waits
    GO_ON = "go_on"
    RESTORE = "restore"  # the rewrite came back empty at end of turn even so: the set-aside segment is kept
    # the rewrite added nothing, or no new passage supports it while one supports the set-aside
    # segment: that segment is kept, now with the passages before it as its evidence, and the
    # rewrite is dropped
    FALLBACK = "fallback"
    REPEAT = "repeat"  # the segment repeated an earlier sentence: the repeat is cut and the answer ends
    # controller.rewrite_unsupported: the previous round's kept segment held an unsupported sentence
    # and was written once more under the strict grounding prompt; the rewrite replaces it when it
    # is supported, else it is dropped and `fallback` says why
    GROUND = "ground"

    # print and format as the word itself ("accept"), as a plain string would
    __str__ = str.__str__
    __format__ = str.__format__


class Kept(str, Enum):
    """What a round left in the answer, recorded by the loop where it decides it.

    The one rule for "which segments make up the answer" is `kept_order`, read from these.
    """

    NOTHING = ""  # set aside to be written again, a dropped rewrite, a repeat cut at its start
    SEGMENT = "segment"  # its own segment, whole
    # the start of its own segment (`RoundTrace.kept_chars` long): up to where it repeated the answer
    # (action repeat: the answer ends), or up to the flagged word (action rewind: the rest is written
    # again after the passages)
    PREFIX = "prefix"
    SET_ASIDE = "set_aside"  # the previous round's set-aside segment, put back (its own rewrite is dropped)
    REWRITE = "rewrite"  # its own segment, in place of the last kept one (a kept grounded rewrite)
    WAITING = "waiting"  # nothing yet: the model was asked to go on from the passages, the set-aside segment waits

    __str__ = str.__str__
    __format__ = str.__format__


def derived_kept(action: Action | str, fallback: str = "") -> Kept:
    """What a round recorded before trace version 5 kept, read from its action (once, on load)."""
    action = Action(action)
    if action in (Action.ACCEPT, Action.CONTINUE, Action.SKIP):
        return Kept.SEGMENT
    if action in (Action.RESTORE, Action.FALLBACK):
        return Kept.SET_ASIDE
    if action is Action.GROUND:
        return Kept.NOTHING if fallback else Kept.REWRITE
    if action is Action.GO_ON:
        return Kept.WAITING
    return Kept.NOTHING  # regenerate; a repeat's kept start was not recorded


@dataclass
class Segment:
    """One piece of generated text, usually a sentence, with per-token evidence.

    `tokens`, `token_ids`, `logprobs` and `entropies` are parallel lists, one entry per generated
    token. Log-probabilities and entropies (in nats) come from the model's raw logits.
    """

    text: str
    tokens: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    # per token, top-1 minus top-2 probability (TARG's margin); empty where the backend gives no
    # second-best token (served models), parallel to `tokens` otherwise
    margins: list[float] = field(default_factory=list)
    # per token, what the model nearly wrote: its top choices as {text: probability}, most likely
    # first; in-process only (empty elsewhere), shown on hover in the views
    alternatives: list[dict[str, float]] = field(default_factory=list)
    finish_reason: str = "stop"  # "stop" (sentence or marker end), "end_of_turn", "length"
    tokens_prefilled: int = 0  # prompt tokens this call had to run through the model
    tokens_reused: int | None = 0  # prompt tokens served from the KV cache; None: the server did not say
    # Last-layer attention among the segment's own tokens, (n_tokens, n_tokens); filled on demand
    # by a decider that needs it (DRAGIN), otherwise None.
    attention: list[list[float]] | None = None
    # Chunk ids of the passages in context when this segment was generated (set by the
    # controller): what its sentences may cite. None in traces older than version 2.
    context_ids: list[str] | None = None
    # A chat model's reasoning (`reasoning_content` or a `<think>` block): shown, never part of the
    # text, the tokens or the scores. Empty for models that do not reason aloud.
    reasoning: str = ""
    # How a chat server continued the draft: "continue" (the final assistant message), "new_turn"
    # (a user turn carrying the draft), "" (nothing to continue, or not a chat server).
    continuation: str = ""

    @property
    def probs(self) -> list[float]:
        return [math.exp(lp) for lp in self.logprobs]

    def upto(self, cut: int) -> Segment | None:
        """The whole tokens that end at or before character `cut`, as a paused segment (None: no text)."""
        count = seen = 0
        for token in self.tokens:
            if seen + len(token) > cut:
                break
            seen, count = seen + len(token), count + 1
        if not self.text[:seen].strip():
            return None
        return dataclasses.replace(
            self, text=self.text[:seen], tokens=self.tokens[:count], token_ids=self.token_ids[:count],
            logprobs=self.logprobs[:count], entropies=self.entropies[:count], margins=self.margins[:count],
            alternatives=self.alternatives[:count], finish_reason="stop", attention=None)

    @property
    def finished(self) -> bool:
        """True when the model ended its answer (end of turn) rather than pausing."""
        return self.finish_reason == "end_of_turn"


@dataclass
class Span:
    """A triggering span: token indices [start, end) in the segment, and its text."""

    start: int
    end: int
    text: str
    score: float = 0.0
    char_start: int = -1  # character offsets of the span in the segment text (-1: unknown)
    char_end: int = -1


@dataclass
class Decision:
    """A decider's verdict on one segment. `score` in [0, 1] is how strongly it wants retrieval."""

    retrieve: bool
    score: float
    reason: str
    decider: str = ""
    threshold: float | None = None  # in the decider's own unit (see `unit`)
    unit: str = ""  # what `threshold` measures: "probability", "nats", "tokens", "score"...
    score_threshold: float | None = None  # the same cut on the [0, 1] score scale, if it has one
    intents: list[str] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    extra_forward_passes: int = 0  # e.g. DRAGIN's attention pass
    segment_text: str = ""  # the judged segment's text (set by the controller)
    evidence: dict[str, Any] = field(default_factory=dict)  # decider-specific, JSON-able

    @classmethod
    def by(cls, decider: Any, retrieve: bool, score: float, reason: str, **fields: Any) -> Decision:
        """A verdict stamped with what `decider` declares: its `name`, `threshold`, `unit` and
        `score_threshold` (each left at the field's default where the decider has none)."""
        declared = {k: getattr(decider, k) for k in ("threshold", "unit", "score_threshold") if hasattr(decider, k)}
        return cls(retrieve, score, reason, decider=getattr(decider, "name", ""), **declared, **fields)


@dataclass
class Query:
    """What was searched, how it was built, and what building it cost."""

    text: str
    mode: str
    intent: str = ""
    llm_calls: int = 0
    fallback_from: str | None = None  # e.g. "marker" when a too-short marker phrase fell back
    # several searches for one need (query mode `multi`, a marker's `a ## b`), merged by RRF;
    # `text` then joins them with " ## ". Empty: `text` is the one search (older traces too).
    subqueries: list[str] = field(default_factory=list)
    # the knowledge base this search names (a marker's `@name`, a tool call's `source`); "": the
    # run's routing rules decide, else every source is searched (retrieval.sources)
    source: str = ""

    @property
    def searches(self) -> list[str]:
        """What the controller searches for this query: the sub-queries, else `text` alone."""
        return list(self.subqueries) or [self.text]


@dataclass
class Hit:
    """One retrieved chunk with its fused score and its rank/score in every retriever."""

    chunk_id: str
    doc_id: str
    title: str
    text: str
    score: float
    ranks: dict[str, int] = field(default_factory=dict)  # retriever name -> 1-based rank
    scores: dict[str, float] = field(default_factory=dict)  # retriever name -> raw score
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # the knowledge base it came from (retrieval.sources); "" in a run of one


@dataclass
class Injection:
    """What the context manager did with a round's hits (chunk ids)."""

    added: list[str] = field(default_factory=list)
    dropped_duplicates: list[str] = field(default_factory=list)
    dropped_budget: list[str] = field(default_factory=list)
    # hits scoring far below the search's best (context.cut_bm25_share / cut_dense_gap): never injected
    dropped_relevance: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    # passages cut to `max_passage_tokens` on the way in (their hit's metadata holds the original
    # length): a cut is recorded, never silent
    truncated: list[str] = field(default_factory=list)
    tokens_added: int = 0  # passage tokens the added passages occupy (ids, titles, headers included)
    # passages shortened on the way in: chunk id -> {"before", "after" (tokens of the text),
    # "mode" (extractive | abstractive), "text" (what the model read), "seconds"}
    compressed: dict[str, dict[str, Any]] = field(default_factory=dict)
    passage_budget: int = 0  # the budget in force: max_retrieval_tokens, or passage_share of the window if smaller


@dataclass
class HistoryFit:
    """What became of earlier turns beyond `max_history_tokens`: one summary turn, or dropped."""

    kept_turns: int = 0  # the most recent turns, kept word for word
    older_turns: int = 0  # the turns before them that did not fit
    older_tokens: int = 0
    summary: str = ""  # the generator's summary of the older turns; "" when they were dropped
    summary_tokens: int = 0  # the summary turn as rendered, template tokens included
    summarized_turns: int = 0  # the newest older turns the summary covers; those before them were dropped

    @property
    def dropped(self) -> bool:
        return self.older_turns > 0 and not self.summary


@dataclass
class TokenBudget:
    """Where the context's tokens go at one moment, against the model's limit.

    `passages` is everything the passages occupy: each one's citation id, title and text and the
    header, instruction and turn tokens of the message that carries them; `max_retrieval_tokens`
    bounds exactly that number, for plain RAG and RIG alike. `system` is the system prompt plus
    the chat template's own tokens. The parts add up to the prompt's length.
    """

    system: int = 0
    question: int = 0
    passages: int = 0
    draft: int = 0
    limit: int = 0
    max_retrieval_tokens: int = 0

    @property
    def used(self) -> int:
        return self.system + self.question + self.passages + self.draft

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)


@dataclass
class RoundTrace:
    """Everything a notebook needs to show one round without re-running it.

    A round is one generated segment plus, when the decider fired, its retrieval.
    """

    index: int
    segment: Segment
    decision: Decision
    query: Query | None = None
    hits: list[Hit] = field(default_factory=list)
    injection: Injection | None = None
    action: Action = Action.ACCEPT
    error: str | None = None  # a retriever/query error recorded instead of crashing the run
    budget: TokenBudget = field(default_factory=TokenBudget)
    draft: str = ""  # the clean answer text after this round
    tokens_prefilled: int = 0
    tokens_reused: int | None = 0  # None: unknown (a served model that does not report it)
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    retrieval_round: int = 0  # how many retrievals had happened after this round
    fallback: str = ""  # why a rewrite was dropped for the segment it was to replace (action fallback or ground)
    # passages retrieved for the set-aside segment that no kept text was written from (action
    # restore or fallback): chunk id -> why
    unused: dict[str, str] = field(default_factory=dict)
    guards: list[str] = field(default_factory=list)  # loop guards that fired: "<guard>: <detail>"
    # sentences of the kept segment no passage it could see supports (cosine < the threshold)
    unsupported: list[str] = field(default_factory=list)
    # what this round left in the answer (see `Kept`); None: not recorded, derived from `action`
    kept: Kept | None = None
    kept_chars: int | None = None  # Kept.PREFIX: the characters of the segment the answer kept (None: not recorded)

    def __post_init__(self) -> None:
        self.action = Action(self.action)
        self.kept = derived_kept(self.action, self.fallback) if self.kept is None else Kept(self.kept)


@dataclass
class Attribution:
    """One answer sentence: where it stands, which passages it could see, which it cites."""

    text: str
    start: int  # character offsets in the answer without citation tags
    end: int
    visible: list[str] = field(default_factory=list)  # chunk ids in context when it was written
    cited: str | None = None  # the supporting passage's chunk id; None when none supports it
    shared: int = 0  # content words it shares with the cited passage
    # passages the model cited itself with [n] and could see (context.cite: model); `cited` is the first
    model_cites: list[str] = field(default_factory=list)


@dataclass
class Suspicion:
    """An answer sentence holding facts (numbers, dates, names) that no passage it could see holds."""

    sentence: int  # index into `RIGResult.attributions`
    text: str
    facts: list[str] = field(default_factory=list)  # the unsupported facts, as written


@dataclass
class RemovedCitation:
    """A `[n]` the model wrote for a passage its sentence could not see: taken out of the answer."""

    label: str  # as the model wrote it, e.g. "[4]"
    number: int
    chunk_id: str | None  # the passage with that number; None when no passage had it
    sentence: int  # index into `RIGResult.attributions` of the sentence it was attached to
    reason: str


@dataclass
class RIGResult:
    """The outcome of one question: clean answer, every round, and what it cost."""

    question: str
    answer: str
    rounds: list[RoundTrace] = field(default_factory=list)
    used_retrieval_times: int = 0
    citations: list[str] = field(default_factory=list)
    tokens: dict[str, int] = field(
        default_factory=lambda: {"prompt": 0, "generated": 0, "prefilled": 0, "reused": 0}
    )
    timings: dict[str, float] = field(default_factory=dict)
    low_confidence: bool = False
    passages: list[Hit] = field(default_factory=list)  # passages in context at the end
    attributions: list[Attribution] = field(default_factory=list)  # one per answer sentence
    config: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)  # spec, source (gguf/hub/local), dtype
    policy: str = ""  # the run's continue / regenerate policy (the decider's, or overridden)
    errors: list[str] = field(default_factory=list)  # "round N: ..." per failed retrieval
    # what happened to passages given before the question (plain RAG): added, over budget, cut
    upfront: Injection | None = None
    history: HistoryFit | None = None  # set when earlier turns exceeded max_history_tokens
    # grounding checks (rigkit.grounding): sentences with facts no visible passage holds, model
    # citations removed as unseen, and warnings such as an answer that cites nothing
    suspicious: list[Suspicion] = field(default_factory=list)
    removed_citations: list[RemovedCitation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    request_id: str = ""  # the serving request's id (`X-Request-ID`), as its access-log line names it
    short_answer: str = ""  # the one-line short answer ("" when controller.short_answer is none)
    trimmed: str = ""  # an unfinished last sentence cut off the end of the answer
    pre_retrieval_draft: str | None = None  # the draft and flagged segment before the first retrieval
    version: int = TRACE_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RIGResult:
        if data.get("version", TRACE_VERSION) > TRACE_VERSION:
            raise ValueError(
                f"trace version {data['version']} is newer than this rigkit ({TRACE_VERSION})"
            )
        data = dict(data)
        data["rounds"] = [round_from_dict(r) for r in data.get("rounds", [])]
        data["passages"] = [Hit(**h) for h in data.get("passages", [])]
        data["attributions"] = [Attribution(**a) for a in data.get("attributions", [])]
        data["upfront"] = Injection(**data["upfront"]) if data.get("upfront") else None
        data["history"] = HistoryFit(**data["history"]) if data.get("history") else None
        data["suspicious"] = [Suspicion(**s) for s in data.get("suspicious", [])]
        data["removed_citations"] = [RemovedCitation(**c) for c in data.get("removed_citations", [])]
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> RIGResult:
        return cls.from_dict(json.loads(text))

    def to_html(self, lecture: bool = False) -> str:
        """This run as one self-contained HTML page (`rigkit.widgets.page.run_page`): no network,
        no scripts; `lecture=True` for a projector."""
        # Deferred: the trace is the bottom layer and must not load the view layer on import.
        from rigkit.widgets.page import run_page

        return run_page(self, lecture=lecture)

    def save_html(self, path: str | Path, lecture: bool = False) -> Path:
        """Write `to_html(lecture)` to `path` atomically (a reader never sees half a page)."""
        from rigkit.files import atomic_write_text

        return atomic_write_text(path, self.to_html(lecture=lecture))


@dataclass
class SearchRequest:
    """Where a run paused: the searches its round needs (each `top_k` deep, merged by RRF).

    The hits come back through `Run.resume(id, hits)`; `draft` is the answer so far with the
    flagged segment, `query` how the searches were built."""

    id: str
    round: int
    queries: list[str]
    top_k: int
    query: Query
    question: str = ""
    draft: str = ""


def round_from_dict(data: dict[str, Any]) -> RoundTrace:
    """A `RoundTrace` from its JSON form (`dataclasses.asdict`)."""
    data = dict(data)
    data["segment"] = Segment(**data["segment"])
    decision = dict(data["decision"])
    decision["spans"] = [Span(**s) for s in decision.get("spans", [])]
    data["decision"] = Decision(**decision)
    data["query"] = Query(**data["query"]) if data.get("query") else None
    data["hits"] = [Hit(**h) for h in data.get("hits", [])]
    data["injection"] = Injection(**data["injection"]) if data.get("injection") else None
    data["budget"] = TokenBudget(**data.get("budget", {}))
    data["action"] = Action(data.get("action", Action.ACCEPT))
    return RoundTrace(**data)


def kept_order(kept: Sequence[Kept | str]) -> list[int]:
    """The rounds whose segments make up the answer, in order, from what each round kept.

    The one rule for it: widgets, metrics, the decision tables and the loop itself read it here.
    """
    order: list[int] = []
    for i, word in enumerate(kept):
        if word in (Kept.SEGMENT, Kept.PREFIX):
            order.append(i)
        elif word == Kept.SET_ASIDE and (j := _past_waiting(kept, i)) >= 0:
            order.append(j)  # the set-aside segment: the round before, past any go-on turns
        elif word == Kept.REWRITE:
            order[-1:] = [i]
    return order


def kept_segments(rounds: Sequence[RoundTrace]) -> list[Segment]:
    """The segments the answer kept so far, in order, each as it stands in the answer."""
    return [kept_part(rounds[i]) for i in kept_order([r.kept or Kept.NOTHING for r in rounds])]


def kept_part(trace: RoundTrace) -> Segment:
    """The round's segment as the answer kept it: its start for a prefix whose length was recorded
    (traces before `kept_chars` show the whole segment), else whole."""
    if trace.kept is Kept.PREFIX and trace.kept_chars is not None:
        return trace.segment.upto(trace.kept_chars) or Segment(text="")
    return trace.segment


def kept_segment(rounds: Sequence[RoundTrace]) -> Segment | None:
    """The segment the last of `rounds` added to the answer (None: it added none)."""
    if not rounds or rounds[-1].kept in (None, Kept.NOTHING, Kept.WAITING):
        return None
    return kept_segments(rounds)[-1]


def answer_end(rounds: Sequence[RoundTrace]) -> tuple[Segment, bool] | None:
    """The last kept segment that holds text, and whether it was cut at a repeat; None: there is none."""
    order = [i for i in kept_order([r.kept or Kept.NOTHING for r in rounds]) if rounds[i].segment.text.strip()]
    if not order:
        return None
    last = rounds[order[-1]]
    return last.segment, last.kept is Kept.PREFIX and last.action is Action.REPEAT  # a rewind's kept start is no cut


def set_aside_round(rounds: Sequence[RoundTrace], end: int) -> int | None:
    """Index of the round whose segment was set aside for a rewrite, as seen from round `end`
    (a restore, fallback or go-on): the last `regenerate` before it, past any `go_on`."""
    i = _past_waiting([r.kept or Kept.NOTHING for r in rounds], end)
    return i if i >= 0 and rounds[i].action is Action.REGENERATE else None


def _past_waiting(kept: Sequence[Kept | str], end: int) -> int:
    """The last round before `end` that is not a go-on turn (-1: none)."""
    i = end - 1
    while i >= 0 and kept[i] == Kept.WAITING:
        i -= 1
    return i
