"""Entropy decider: DRAGIN's RIND (Su et al., 2024, "DRAGIN: Dynamic Retrieval Augmented
Generation based on the Real-time Information Needs of Large Language Models").

RIND scores token i as  H_i * a_i * s_i : H_i the entropy of the model's distribution when it
wrote token i (nats, from raw logits), s_i zero for stop words and punctuation, and a_i the
largest attention any later token of the segment (the token itself included, as in DRAGIN's
column max) pays to it in the last layer. As in DRAGIN's code the attentions are normalised to
mean 1 over the segment, so RIND keeps the scale of the entropy and one threshold serves both
modes. Concessions:
- attention comes from `segment.attention` when a decider already fetched it, else from
  `generator.segment_attention(segment)` (`SupportsAttention`): the segment's own tokens only,
  one extra eager forward pass through the KV cache (a full-sequence eager pass is quadratic:
  33 s and 11.7 GB at 3,000 tokens for a 135M model, against 0.6 s for the segment alone).
  There is no silent fallback to entropy alone: a generator without that
  capability (a served model, a scripted one) is a one-line error naming the decider, and so
  is an in-process model that returns no attention; its own errors propagate.
- entropy alone (RIND with a_i = 1) only when asked for: `use_attention=False`
  (`decider.params.use_attention: false`, the mode for served models), or when no generator is
  attached at all (stored segments scored offline, e.g. trigger evaluation). The reason says
  which ("entropy only, as configured" / "entropy only, no model attached").
- DRAGIN's query formulation (QFS) attends from the trigger token over the whole context; here
  over the segment's earlier words. They are stored in `evidence["attended_words"]` for the
  `attention` query mode, which adds the question's key terms itself.
Score = 1 - exp(-max RIND): monotone in [0, 1); retrieve when max RIND > threshold.
"""

from __future__ import annotations

import math

from rigkit.deciders.base import ATTENTION, EXTRA_PASSES, LOGPROBS, DecisionState
from rigkit.deciders.spans import spans_from_tokens, token_words
from rigkit.errors import InputError, RigkitError
from rigkit.generation.protocol import SupportsAttention
from rigkit.text import is_stop, split_words
from rigkit.trace import Decision, Segment

__all__ = ["EntropyDecider"]


class EntropyDecider:
    """DRAGIN-style RIND: entropy x attention for content tokens; retrieve above `threshold`."""

    name = "entropy"
    policy = "regenerate"  # DRAGIN regenerates from the triggering point with the passages
    unit = "nats"
    default_threshold = 2.0
    needs = frozenset({LOGPROBS, ATTENTION, EXTRA_PASSES})  # the attention pass reads the KV cache

    @classmethod
    def needs_for(cls, params: dict) -> frozenset[str]:
        """Entropy alone (`use_attention: false`, the mode for served models) reads log-probabilities only."""
        return cls.needs if params.get("use_attention", True) else frozenset({LOGPROBS})

    @property
    def score_threshold(self) -> float:
        """score = 1 - exp(-max RIND), so RIND > t is score > 1 - exp(-t)."""
        return 1.0 - math.exp(-self.threshold)

    def __init__(self, threshold: float = default_threshold, use_attention: bool = True, top_words: int = 5):
        if threshold < 0:
            raise ValueError(f"entropy threshold must be >= 0 nats, got {threshold}")
        self.threshold = threshold
        self.use_attention = use_attention
        self.top_words = top_words

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        n = len(segment.tokens)
        if len(segment.entropies) != n:
            raise ValueError(f"segment has {n} tokens but {len(segment.entropies)} entropies")
        words = split_words(segment.text)
        tok_words = token_words(segment, words)
        content = [any(not is_stop(words[k].text) for k in ks) for ks in tok_words]
        if not any(content):
            why = "empty segment" if not segment.text.strip() else "no content words"
            return Decision.by(self, False, 0.0, f"{why}: nothing to judge")
        attention, passes, mode = self._attention(segment, state)
        weights = _column_max(attention) if attention is not None else [1.0] * n
        total = sum(weights)
        weights = [w * n / total for w in weights] if total > 0 else [1.0] * n
        rind = [segment.entropies[i] * weights[i] if content[i] else 0.0 for i in range(n)]
        trigger = max(range(n), key=lambda i: rind[i])
        flagged = [i for i in range(n) if rind[i] > self.threshold]
        spans = spans_from_tokens(segment, flagged, rind)
        attended = (
            _attended_words(segment, attention, trigger, words, tok_words, self.top_words)
            if attention is not None
            else []
        )
        if flagged:
            listed = ", ".join(f"{s.text!r}" for s in spans[:4])
            reason = f"RIND ({mode}) above {self.threshold:g} at {listed}"
        else:
            reason = f"max RIND ({mode}) {rind[trigger]:.2f} <= {self.threshold:g}"
        return Decision.by(
            self,
            retrieve=bool(flagged),
            score=1.0 - math.exp(-rind[trigger]),
            reason=reason,
            intents=[s.text for s in spans],
            spans=spans,
            extra_forward_passes=passes,
            evidence={
                "max_rind": rind[trigger],
                "trigger_token": trigger,
                "attention": attention is not None,
                "attended_words": attended,
                "rind": [round(r, 4) for r in rind],
            },
        )

    def _attention(
        self, segment: Segment, state: DecisionState
    ) -> tuple[list[list[float]] | None, int, str]:
        """The segment's (n, n) attention, the forward passes spent getting it, and the mode."""
        if not self.use_attention:
            return None, 0, "entropy only, as configured"
        generator = state.generator
        if segment.attention is not None:
            attention, passes = segment.attention, 0
        elif generator is None:
            return None, 0, "entropy only, no model attached"
        elif not isinstance(generator, SupportsAttention):
            raise InputError(
                f"decider 'entropy' needs the model's attention weights, which {_named(generator)} cannot "
                "give; use an in-process model, or entropy alone "
                "with decider.params.use_attention: false"
            )
        else:
            attention, passes = generator.segment_attention(segment), 1  # its errors propagate
            if not attention and segment.tokens:
                raise RigkitError(
                    f"decider 'entropy': {_named(generator)} returned no attention weights for the segment (the attention pass must run eager: "
                    "SDPA gives none); set decider.params.use_attention: false for entropy alone"
                )
            segment.attention = attention
        n = len(segment.tokens)
        if len(attention) != n or any(len(row) != n for row in attention):
            raise ValueError(f"attention must be ({n}, {n}) for this segment")
        return attention, passes, "entropy x attention"


def _named(generator: object) -> str:
    spec = getattr(generator, "spec", "")
    return f"{type(generator).__name__} ({spec})" if spec else type(generator).__name__


def _column_max(attention: list[list[float]]) -> list[float]:
    """a_i = max over j >= i of attention[j][i] (causal: later tokens attending to token i)."""
    n = len(attention)
    return [max(attention[j][i] for j in range(i, n)) for i in range(n)]


def _attended_words(segment, attention, trigger, words, tok_words, top) -> list[str]:
    """Content words before the trigger token that it attends to most, in text order."""
    best: dict[int, float] = {}
    for i in range(trigger):
        for k in tok_words[i]:
            if not is_stop(words[k].text):
                best[k] = max(best.get(k, 0.0), attention[trigger][i])
    trigger_words = set(tok_words[trigger])
    ranked = sorted((k for k in best if k not in trigger_words), key=lambda k: -best[k])
    return [words[k].text for k in sorted(ranked[:top])]
