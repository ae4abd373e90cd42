"""Top-1 minus top-2 margin decider: TARG's training-free retrieval gate ("Training-free Adaptive
Retrieval Gating", 2025), at token level.

TARG gates retrieval on how far the model's best next token stands above its second best: a
small margin means two continuations compete, which a missing fact causes and a confident
paraphrase does not. Its reported effect is 70-90% fewer retrievals at equal accuracy against
always-retrieve. Here the margin is in probability (p1 - p2, in [0, 1]; the logit margin is the
same ranking per token but has no fixed scale across models), read over content tokens only as the
`prob` decider does, so "the" / "a" hesitations do not fire. Score = 1 - (smallest content-token
margin), and `retrieve` is exactly `score > 1 - threshold`.

The margins come from the generator (`Segment.margins`, the in-process backend fills them from the
same raw logits as the probabilities); a backend without them is an error, not a silent fallback.
"""

from __future__ import annotations

from rigkit.deciders.base import LOGPROBS, DecisionState
from rigkit.deciders.probability import content_tokens
from rigkit.deciders.spans import spans_from_tokens
from rigkit.trace import Decision, Segment

__all__ = ["MarginDecider"]


class MarginDecider:
    """Retrieve when a content token's top-1 minus top-2 probability margin is below `threshold`."""

    name = "margin"
    policy = "regenerate"  # as FLARE: the flagged sentence is written again with the passages
    # the scores of every token, not only the chosen one's: an in-process model (checked in `decide`)
    needs = frozenset({LOGPROBS})
    unit = "probability margin"
    default_threshold = 0.1

    @property
    def score_threshold(self) -> float:
        """score = 1 - smallest content-token margin, so margin < t is score > 1 - t."""
        return 1.0 - self.threshold

    def __init__(self, threshold: float = default_threshold):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"margin threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        content = content_tokens(segment) if segment.text.strip() else []
        if not content:
            why = "empty segment" if not segment.text.strip() else "no content words"
            return Decision.by(self, False, 0.0, f"{why}: nothing to judge")
        if len(segment.margins) != len(segment.tokens):
            raise ValueError(
                f"the margin decider needs each token's top-1 minus top-2 probability; this backend "
                f"gave {len(segment.margins)} for {len(segment.tokens)} tokens (use the in-process backend)"
            )
        margins = segment.margins
        low = [i for i in content if margins[i] < self.threshold]
        weakest = min(content, key=lambda i: margins[i])
        spans = spans_from_tokens(segment, low, [1.0 - m for m in margins])
        if low:
            listed = ", ".join(f"{s.text!r}" for s in spans[:4])
            reason = f"{len(low)} content token(s) with a margin below {self.threshold:g}: {listed}"
        else:
            reason = (f"all content tokens clear (smallest margin {margins[weakest]:.2f} "
                      f"at {segment.tokens[weakest].strip()!r})")
        return Decision.by(
            self, retrieve=bool(low), score=1.0 - margins[weakest], reason=reason,
            intents=[s.text for s in spans], spans=spans,
            evidence={"min_margin": margins[weakest], "min_token": weakest, "low_tokens": low,
                      "content_tokens": len(content)},
        )
