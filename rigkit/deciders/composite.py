"""Composite decider: combine deciders so a cheap one can gate an expensive one.

- `any`: retrieve if any member does; score = max of member scores.
- `all`: retrieve if every member does; score = min of member scores.
- `vote`: weighted share of members voting to retrieve, compared with `threshold` (default 0.5);
  score = weighted mean of member scores.
Policy: "continue" when any member continues (see `CompositeDecider.policy`), else "regenerate".
With `lazy=True` (default) members run in order and stop as soon as the outcome is fixed: under
`all`, a cheap first member that says no spares the expensive second (e.g. DRAGIN's extra
attention pass). Skipped members are listed in `evidence["skipped"]` and do not enter the score,
so for ROC curves over all members' signals run with `lazy=False`.
"""

from __future__ import annotations

from collections.abc import Sequence

from rigkit.deciders.base import Decider, DecisionState, decider_policy
from rigkit.deciders.spans import merge_spans
from rigkit.trace import Decision, Segment

__all__ = ["CompositeDecider"]

_MODES = ("any", "all", "vote")


class CompositeDecider:
    """Any-of / all-of / weighted vote over member deciders."""

    name = "composite"
    unit = "vote share"  # the threshold is used by combine="vote" only
    default_threshold = 0.5

    def __init__(
        self,
        members: Sequence[Decider],
        combine: str = "any",
        weights: Sequence[float] = (),
        threshold: float = default_threshold,
        lazy: bool = True,
    ):
        if combine not in _MODES:
            raise ValueError(f"composite combine must be one of {_MODES}, got {combine!r}")
        if not members:
            raise ValueError("a composite decider needs at least one member")
        if weights and len(weights) != len(members):
            raise ValueError(f"{len(weights)} weights for {len(members)} members")
        self.members = list(members)
        self.combine = combine
        self.weights = list(weights) if weights else [1.0] * len(members)
        self.threshold = threshold
        self.lazy = lazy and combine != "vote"

    @property
    def policy(self) -> str:
        """"continue" when any member continues, else "regenerate".

        A continuing member (a marker, IRCoT's every-sentence baseline) relies on its segment
        staying in the transcript; regenerating it would throw away what that member acted on.
        """
        policies = {decider_policy(m) for m in self.members}
        return "continue" if "continue" in policies else "regenerate"

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        results: list[tuple[int, Decision]] = []
        for i, member in enumerate(self.members):
            d = member.decide(segment, state)
            results.append((i, d))
            if self.lazy and d.retrieve == (self.combine == "any"):
                break  # any: one yes settles it; all: one no settles it
        decisions = [d for _, d in results]
        if self.combine == "any":
            retrieve, score = any(d.retrieve for d in decisions), max(d.score for d in decisions)
        elif self.combine == "all":
            retrieve = all(d.retrieve for d in decisions) and len(results) == len(self.members)
            score = min(d.score for d in decisions)
        else:
            total = sum(self.weights)
            votes = sum(self.weights[i] for i, d in results if d.retrieve) / total
            score = sum(self.weights[i] * d.score for i, d in results) / total
            retrieve = votes >= self.threshold
        fired = [d for d in decisions if d.retrieve] if retrieve else []
        names = [d.decider or type(self.members[i]).__name__ for i, d in results]
        summary = "; ".join(f"{n}: {'yes' if d.retrieve else 'no'}" for n, d in zip(names, decisions))
        skipped = [
            getattr(m, "name", type(m).__name__) for m in self.members[len(results) :]
        ]
        return Decision(
            retrieve=retrieve,
            score=score,
            reason=f"{self.combine} of [{summary}]" + (f", skipped {skipped}" if skipped else ""),
            decider=self.name,
            threshold=self.threshold if self.combine == "vote" else None,
            unit="vote share" if self.combine == "vote" else "",
            intents=_unique(x for d in fired for x in d.intents),
            spans=merge_spans(segment, [s for d in fired for s in d.spans]),
            extra_forward_passes=sum(d.extra_forward_passes for d in decisions),
            evidence=_merged_evidence(names, decisions, skipped),
        )


def _merged_evidence(names, decisions, skipped) -> dict:
    evidence: dict = {
        "members": [
            {"decider": n, "retrieve": d.retrieve, "score": d.score, "reason": d.reason}
            for n, d in zip(names, decisions)
        ],
        "skipped": skipped,
    }
    # keep what query builders read (attention words, markers) from the members
    for d in decisions:
        for key in ("attended_words", "markers"):
            if key in d.evidence and key not in evidence:
                evidence[key] = d.evidence[key]
    return evidence


def _unique(items) -> list[str]:
    return list(dict.fromkeys(items))
