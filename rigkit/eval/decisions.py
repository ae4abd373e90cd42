"""Decision quality: did a decider retrieve where retrieval was needed, and only there?

Each question is labelled from two systems that answered it (result lines, no model), on one 0/1
score (the type-aware score by default):
- needed: closed-book wrong, `rag` right (retrieving turned a wrong answer right);
- not needed: closed-book right (the model knew it);
- out of reach: both wrong (one search with the question did not help either).

Per system: over-search is the share of not-needed questions where it retrieved at all;
under-search the share of needed questions where it never did; and of all its retrievals, the
share made on needed questions (each question weighs its number of retrievals).

The token-level check uses the gold chain (`rigkit.eval.gold`): on the needed questions, did the
decider fire in the segment where the missing fact was written? That segment is the first of the
answer that holds a fact of the chain (a bridge entity or the answer); where the answer holds
none, the one that holds the short answer it gave, else the first. Segments are read from the
rounds' texts where a line kept them, otherwise from the answer's sentences (the loop cuts
segments at sentence ends), and a round belongs to the segment it judged: a segment written
again after a retrieval is the same segment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rigkit.eval.answers import cover_match, typed_match
from rigkit.eval.gold import GoldChain
from rigkit.eval.paired import Share, per_question, ratio_interval, share_interval
from rigkit.text import split_sentences, strip_citations
from rigkit.trace import derived_kept, kept_order

__all__ = ["NEEDED", "NOT_NEEDED", "OUT_OF_REACH", "DecisionQuality", "with_type_aware", "need_labels",
           "decision_quality", "fact_segment", "fired_segments", "decision_table", "find_system"]

NEEDED, NOT_NEEDED, OUT_OF_REACH = "needed", "not needed", "out of reach"
LABEL_METRIC = "type_aware"


def with_type_aware(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, each with `type_aware` (computed from its answer where a line lacks it)."""
    out = []
    for row in rows:
        if "type_aware" not in row and row.get("answer") is not None and not row.get("error"):
            row = {**row, "type_aware": typed_match(row["answer"], row.get("question", ""), row.get("gold") or [])}
        out.append(row)
    return out


def find_system(systems: Sequence[str], name: str) -> str | None:
    """`name` itself, else the first `name [label]` a compared run added."""
    if name in systems:
        return name
    return next((s for s in systems if s.startswith(f"{name} [")), None)


def need_labels(rows: Sequence[dict[str, Any]], closed: str, rag: str,
                metric: str = LABEL_METRIC) -> dict[str, str]:
    """Question id -> needed / not needed / out of reach (a mean over runs counts right at >= .5)."""
    scores = per_question(rows, metric)
    book, searched = scores.get(closed, {}), scores.get(rag, {})
    labels = {}
    for qid in set(book) & set(searched):
        if book[qid] >= 0.5:
            labels[qid] = NOT_NEEDED
        else:
            labels[qid] = NEEDED if searched[qid] >= 0.5 else OUT_OF_REACH
    return labels


def _kept(rounds: Sequence[dict[str, Any]]) -> list[str]:
    """What each round of a result line kept (lines before trace version 5: read from its action)."""
    return [r["kept"] if "kept" in r else derived_kept(r.get("action") or "accept") for r in rounds]


def _segments(row: dict[str, Any]) -> list[str]:
    rounds = (row.get("summary") or {}).get("rounds") or []
    if rounds and all("text" in r for r in rounds):
        return [rounds[i]["text"] for i in kept_order(_kept(rounds))]
    return split_sentences(strip_citations(row.get("answer") or ""))


def fact_segment(row: dict[str, Any], chain: GoldChain | None) -> int:
    """The index of the segment where the missing fact was (or should have been) written."""
    segments = _segments(row)
    facts = [*(chain.facts if chain else []), *(row.get("gold") or [])]
    for wanted in (facts, [row.get("extracted_answer") or ""]):
        for i, text in enumerate(segments):
            if any(f and cover_match(text, [f]) for f in wanted):
                return i
    return 0


def fired_segments(row: dict[str, Any]) -> set[int]:
    """Indices of the segments a round fired on (a rewritten segment keeps its index)."""
    rounds = (row.get("summary") or {}).get("rounds") or []
    kept = _kept(rounds)
    # a round judges the segment after those kept before it; a kept grounded rewrite takes the last one's place
    return {len(kept_order(kept[:i])) for i, rnd in enumerate(rounds) if rnd.get("fire")}


@dataclass(frozen=True)
class DecisionQuality:
    """One system's decisions against the labels; shares carry 95% bootstrap intervals."""

    system: str
    counts: dict[str, int]  # label -> questions this system answered
    over: Share | None
    under: Share | None
    where_needed: Share | None
    at_fact: Share | None  # needed questions where it fired in the fact's segment


def decision_quality(rows: Sequence[dict[str, Any]], labels: Mapping[str, str],
                     gold: Mapping[str, GoldChain] | None = None,
                     skip: Sequence[str] = ()) -> list[DecisionQuality]:
    """Every system except `skip` (the labelling closed-book) against `labels`; first run only."""
    out = []
    for system in dict.fromkeys(r["system"] for r in rows):
        if system in skip:
            continue
        mine = {str(r["id"]): r for r in rows if r["system"] == system and int(r.get("run", 0)) == 0
                and not r.get("error") and str(r["id"]) in labels}
        if not mine:
            continue
        retrievals = {q: float(r.get("retrievals") or 0) for q, r in mine.items()}
        by_label = {lab: [q for q in mine if labels[q] == lab] for lab in (NEEDED, NOT_NEEDED, OUT_OF_REACH)}
        needed = by_label[NEEDED]
        at_fact = None
        decides = any(rnd.get("fire") for r in mine.values() for rnd in (r.get("summary") or {}).get("rounds") or [])
        if gold is not None and decides:  # plain RAG searches before writing: it never fires
            at_fact = share_interval([float(fact_segment(mine[q], gold.get(q)) in fired_segments(mine[q]))
                                      for q in needed]) if needed else None
        out.append(DecisionQuality(
            system, {lab: len(qs) for lab, qs in by_label.items()},
            share_interval([float(retrievals[q] > 0) for q in by_label[NOT_NEEDED]]) if by_label[NOT_NEEDED] else None,
            share_interval([float(retrievals[q] == 0) for q in needed]) if needed else None,
            ratio_interval([retrievals[q] * (labels[q] == NEEDED) for q in mine], list(retrievals.values())),
            at_fact))
    return out


def decision_table(qualities: Sequence[DecisionQuality]) -> tuple[list[str], list[list[str]]]:
    header = ["System", "Needed / not needed / out of reach", "Over-search [95%]", "Under-search [95%]",
              "Retrievals where needed [95%]", "Fired at the missing fact [95%]"]

    def cell(share: Share | None) -> str:
        return "–" if share is None else str(share)

    rows = [[q.system, " / ".join(str(q.counts[k]) for k in (NEEDED, NOT_NEEDED, OUT_OF_REACH)),
             cell(q.over), cell(q.under), cell(q.where_needed), cell(q.at_fact)] for q in qualities]
    return header, rows
