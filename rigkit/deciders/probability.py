"""Token-probability decider: FLARE's active retrieval trigger (Jiang et al., 2023, "Active
Retrieval Augmented Generation").

FLARE retrieves when any token of the upcoming sentence has probability below a threshold θ.
Here stop words and punctuation do not count (a 135M model is often unsure about "the" versus
"a", which says nothing about missing facts), and the flagged tokens are widened to whole words
so the masked query (`rigkit.queries.MaskedQuery`) never leaves half a word behind.
Score = 1 - (lowest content-token probability): monotone, in [0, 1], and `retrieve` is exactly
`score > 1 - threshold`.

`pause_at` lets the segment stop at the first such word instead of the sentence end (DRAGIN,
Su et al. 2024, stops at the token): the rest of a sentence that will be rewritten is never
written (`controller.pause_at_flag`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rigkit.deciders.base import LOGPROBS, DecisionState
from rigkit.deciders.spans import spans_from_tokens, token_words
from rigkit.generation.stops import tokens_upto
from rigkit.text import is_stop, split_words
from rigkit.trace import Decision, Segment

__all__ = ["ProbabilityDecider", "content_tokens"]


def content_tokens(segment: Segment) -> list[int]:
    """Indices of tokens that overlap at least one non-stop word (not punctuation/space)."""
    words = split_words(segment.text)
    return [
        i
        for i, ks in enumerate(token_words(segment, words))
        if any(not is_stop(words[k].text) for k in ks)
    ]


class ProbabilityDecider:
    """Retrieve when a content token's probability is below `threshold` (FLARE's θ)."""

    name = "prob"
    policy = "regenerate"  # FLARE: the flagged sentence is rewritten with the passages
    needs = frozenset({LOGPROBS})
    unit = "probability"
    default_threshold = 0.3  # FLARE's θ

    @property
    def score_threshold(self) -> float:
        """score = 1 - lowest content-token probability, so p < θ is score > 1 - θ."""
        return 1.0 - self.threshold

    def __init__(self, threshold: float = default_threshold):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"prob threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold

    def pause_at(self, tokens: Sequence[str], logprobs: Sequence[float]) -> int | None:
        """Tokens to keep when a content word holding a token below the threshold has been written
        whole (the next character is not part of it), else None: that word is where it fires."""
        limit = math.log(self.threshold) if self.threshold > 0 else -math.inf
        if not any(lp < limit for lp in logprobs):
            return None
        segment = Segment(text="".join(tokens), tokens=list(tokens), logprobs=list(logprobs))
        words = split_words(segment.text)
        owners = token_words(segment, words)
        for i in content_tokens(segment):
            if logprobs[i] < limit:
                end = max(words[k].end for k in owners[i] if not is_stop(words[k].text))
                return tokens_upto(tokens, end) if end < len(segment.text) else None
        return None

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        if len(segment.logprobs) != len(segment.tokens):
            raise ValueError(
                f"segment has {len(segment.tokens)} tokens but {len(segment.logprobs)} logprobs"
            )
        content = content_tokens(segment) if segment.text.strip() else []
        if not content:
            why = "empty segment" if not segment.text.strip() else "no content words"
            return Decision.by(self, False, 0.0, f"{why}: nothing to judge")
        probs = [math.exp(lp) for lp in segment.logprobs]
        low = [i for i in content if probs[i] < self.threshold]
        weakest = min(content, key=lambda i: probs[i])
        score = 1.0 - probs[weakest]
        spans = spans_from_tokens(segment, low, [1.0 - p for p in probs])
        if low:
            listed = ", ".join(f"{s.text!r}" for s in spans[:4])
            reason = f"{len(low)} content token(s) below p={self.threshold:g}: {listed}"
        else:
            reason = (
                f"all content tokens confident (lowest p={probs[weakest]:.2f} "
                f"at {segment.tokens[weakest].strip()!r})"
            )
        return Decision.by(
            self,
            retrieve=bool(low),
            score=score,
            reason=reason,
            intents=[s.text for s in spans],
            spans=spans,
            evidence={
                "min_prob": probs[weakest],
                "min_token": weakest,
                "low_tokens": low,
                "content_tokens": len(content),
            },
        )
