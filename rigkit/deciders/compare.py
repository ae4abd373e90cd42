"""Side-by-side comparison of deciders on the same generated segments.

Every decider sees exactly the same segments and the same state (question, draft, passages in
context so far), so their scores can be compared per segment, or against labels with ROC/PR.
From a saved `RIGResult` the state is rebuilt round by round from its trace: the draft before
the round, the hits injected in earlier rounds, and the tokens since the last retrieval.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rigkit.deciders.base import Decider, DecisionState
from rigkit.trace import Hit, RIGResult, Segment

__all__ = ["compare_deciders"]


def compare_deciders(
    segments_or_results: Segment | RIGResult | Iterable[Segment | RIGResult],
    deciders: Mapping[str, Decider],
    question: str = "",
    passages: list[Hit] | None = None,
    generator: object | None = None,
) -> list[dict[str, Any]]:
    """One row per segment: its text, and per decider `<name>.score` / `.retrieve` / `.reason`.

    Plain segments are judged as consecutive segments of one answer to `question` (with
    `passages` in context); results bring their own question, drafts and passages. The row's
    `"decisions"` holds the `Decision` objects; the other keys are JSON-able.
    `generator` is what the deciders may ask for model internals: without one, the entropy
    decider scores the entropy alone (its reason says "no model attached") unless a segment
    carries its attention already (`segment.attention`, kept by whichever decider fetched it).
    With one, it must give attention (`SupportsAttention`) or the entropy decider refuses it in
    one line, unless built with `use_attention=False`. Pass it only to judge the segment it
    generated last: `segment_attention` reads its KV cache, so older segments would get another
    segment's attention.
    """
    items = (
        [segments_or_results]
        if isinstance(segments_or_results, (Segment, RIGResult))
        else list(segments_or_results)
    )
    rows: list[dict[str, Any]] = []
    loose: list[Segment] = []
    for item in items + [None]:
        if isinstance(item, Segment):
            loose.append(item)
            continue
        if loose:
            rows += _judge(_states_for_segments(loose, question, passages), deciders, generator)
            loose = []
        if isinstance(item, RIGResult):
            rows += _judge(_states_for_result(item), deciders, generator)
        elif item is not None:
            raise TypeError(f"expected Segment or RIGResult, got {type(item).__name__}")
    return rows


def _states_for_segments(segments, question, passages):
    draft, since = "", 0
    for i, seg in enumerate(segments):
        since += len(seg.tokens)
        state = DecisionState(
            question=question, draft=draft, passages=list(passages or []), round_index=i,
            tokens_since_retrieval=since,
        )
        yield i, seg, state
        draft = (draft + " " + seg.text).strip() if draft else seg.text


def _states_for_result(result: RIGResult):
    passages: list[Hit] = []
    draft, since, done = "", 0, 0
    for trace in result.rounds:
        since += len(trace.segment.tokens)
        state = DecisionState(
            question=result.question, draft=draft, passages=list(passages),
            round_index=trace.index, retrievals_done=done, tokens_since_retrieval=since,
        )
        yield trace.index, trace.segment, state
        added = set(trace.injection.added) if trace.injection else set()
        passages += [h for h in trace.hits if h.chunk_id in added]
        if trace.query is not None:
            done, since = done + 1, 0
        draft = trace.draft


def _judge(states, deciders, generator) -> list[dict[str, Any]]:
    rows = []
    for index, segment, state in states:
        state.generator = generator
        row: dict[str, Any] = {"segment": index, "text": segment.text, "question": state.question}
        decisions = {}
        for name, decider in deciders.items():
            d = decider.decide(segment, state)
            decisions[name] = d
            row[f"{name}.score"] = d.score
            row[f"{name}.retrieve"] = d.retrieve
            row[f"{name}.reason"] = d.reason
        row["decisions"] = decisions
        rows.append(row)
    return rows
