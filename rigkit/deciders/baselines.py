"""Baseline deciders the literature compares against.

- `always`: retrieve after every sentence (IRCoT, Trivedi et al. 2023; FLARE's FS-RAG baseline).
- `every_n`: retrieve once N tokens were generated since the last retrieval (FL-RAG, the fixed
  length baseline of Ram et al. 2023 / FLARE), read from `state.tokens_since_retrieval`.
- `never`: closed-book.
An empty segment (the model ended with nothing new) is never a reason to retrieve.
`always` and `every_n` keep the sentence and continue with the new passages (policy "continue"),
as the published methods do; rewriting it would spend every round on the first sentence.
"""

from __future__ import annotations

from rigkit.deciders.base import DecisionState
from rigkit.trace import Decision, Segment

__all__ = ["AlwaysRetrieve", "EveryNTokens", "NeverRetrieve"]


def _empty(segment: Segment, name: str) -> Decision | None:
    if segment.text.strip():
        return None
    return Decision(False, 0.0, "empty segment: nothing to judge", decider=name)


class AlwaysRetrieve:
    """Retrieve after every non-empty segment."""

    name = "always"
    needs: frozenset[str] = frozenset()  # the text alone
    policy = "continue"  # IRCoT / FS-RAG keep each sentence and write the next with the passages
    unit, default_threshold = "", None  # no threshold

    def __init__(self, threshold: float | None = None):
        self.threshold = threshold  # accepted for a uniform constructor; unused

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        return _empty(segment, self.name) or Decision(
            True, 1.0, "retrieves after every segment", decider=self.name
        )


class EveryNTokens:
    """Retrieve when `n` or more tokens were generated since the last retrieval.

    Score is the fraction of the interval elapsed, capped at 1 (so retrieve == score >= 1).
    """

    name = "every_n"
    needs: frozenset[str] = frozenset()  # the text alone
    policy = "continue"  # FL-RAG keeps the window and continues with the passages
    unit = "tokens"
    default_threshold = 32  # N
    score_threshold = 1.0  # score = share of the interval elapsed: retrieve at 1

    def __init__(self, n: int = default_threshold, threshold: float | None = None):
        if threshold is not None:  # DeciderConfig.threshold may carry N
            n = int(threshold)
        if n < 1:
            raise ValueError(f"every_n needs n >= 1, got {n}")
        self.n = n
        self.threshold = float(n)

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        empty = _empty(segment, self.name)
        if empty:
            return empty
        since = state.tokens_since_retrieval
        retrieve = since >= self.n
        verb = "reached" if retrieve else "below"
        return Decision.by(
            self,
            retrieve,
            min(1.0, since / self.n),
            f"{since} tokens since last retrieval, {verb} n={self.n}",
            evidence={"tokens_since_retrieval": since},
        )


class NeverRetrieve:
    """Never retrieve (closed-book baseline)."""

    name = "never"
    needs: frozenset[str] = frozenset()  # the text alone
    policy = "regenerate"  # never fires: the policy is never used
    unit, default_threshold = "", None  # no threshold

    def __init__(self, threshold: float | None = None):
        self.threshold = threshold

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        return Decision(False, 0.0, "never retrieves (closed book)", decider=self.name)
