"""The classifier decider: a trained retrieval-trigger model thresholds its probability.

The decider is given its model (`TriggerScorer`), so a notebook can plug in any scorer.
`rigkit.deciders.trigger_model.TriggerModel` is the one `rigkit trigger train` writes;
`rigkit.build.build_decider` opens such a file for `--decider classifier --trigger-model FILE`
(`rigkit.trigger.trigger_decider(path)` is the same from Python). The question comes from
`DecisionState.question`, hidden states from the generator (`generator=` here, else
`state.generator`). `Decision.score` is the model's probability, so it compares with the other
deciders on the same labels by ROC / PR.

Threshold: an explicit `threshold` wins; with none, the threshold the scorer carries (chosen on
the dev split and stored in the model file) is used; a scorer without one falls back to 0.7.
Spans: the low-probability content tokens (below the scorer's `low_prob`), each widened to the
whole words it touches, with character offsets, so a masked query removes exactly them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from rigkit.deciders.base import LOGPROBS, DecisionState
from rigkit.deciders.probability import content_tokens
from rigkit.deciders.spans import word_spans
from rigkit.errors import InputError
from rigkit.generation.protocol import SupportsHiddenStates
from rigkit.trace import Decision, Segment

__all__ = ["ClassifierDecider", "TriggerScorer", "DEFAULT_THRESHOLD"]

DEFAULT_THRESHOLD = 0.7


@runtime_checkable
class TriggerScorer(Protocol):
    """A trained "does this segment need retrieval?" model, as the decider sees it."""

    threshold: float | None  # the cut chosen on dev, or None
    low_prob: float  # a content token below this probability is a triggering span
    needs_hidden: bool  # whether `probability` needs the generator's hidden state
    name: str  # shown in the decision's evidence (e.g. the model file's name)
    feature_sets: tuple[str, ...]  # what the model reads, shown in the evidence

    def probability(self, question: str, segment: Segment, hidden: Sequence[float] | None) -> float:
        """p(needs retrieval) for `segment` of an answer to `question`."""
        ...

    def check_generator(self, generator: Any) -> None:
        """Raise a clear error when `generator` cannot give what the model needs."""
        ...


class ClassifierDecider:
    """`ClassifierDecider(scorer)`: retrieve when p(needs retrieval) >= threshold."""

    name = "classifier"
    policy = "regenerate"  # a flagged sentence is written again from the passages, as FLARE
    needs = frozenset({LOGPROBS})  # its hidden-state features are checked when it is given the generator
    unit = "probability"
    default_threshold = DEFAULT_THRESHOLD  # a model file's stored cut comes first

    def __init__(
        self,
        model: TriggerScorer | None = None,
        threshold: float | None = None,
        generator: Any | None = None,
    ):
        if model is None:
            raise InputError(
                "the classifier decider needs a trained model file: --trigger-model FILE "
                "(train one with `rigkit trigger train`)"
            )
        if not isinstance(model, TriggerScorer):
            raise InputError(
                f"the classifier decider is given a loaded trigger model, not {type(model).__name__}: "
                "use rigkit.trigger.trigger_decider(path) or ClassifierDecider(load_trigger(path))"
            )
        self.model = model
        self.generator = generator
        if generator is not None:
            model.check_generator(generator)
        stored = model.threshold
        self.threshold = float(
            threshold if threshold is not None else stored if stored is not None else DEFAULT_THRESHOLD
        )
        self.threshold_source = (
            "given" if threshold is not None else "model file (dev)" if stored is not None else "default"
        )
        self._checked = generator is not None

    @property
    def score_threshold(self) -> float:
        return self.threshold

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        if not segment.text.strip():
            return Decision.by(self, False, 0.0, "empty segment")
        hidden = self._hidden(segment, state) if self.model.needs_hidden else None
        score = float(self.model.probability(state.question, segment, hidden))
        retrieve = score >= self.threshold
        low = self.model.low_prob
        flagged = [i for i in content_tokens(segment) if math.exp(segment.logprobs[i]) < low] \
            if len(segment.logprobs) == len(segment.tokens) else []
        spans = word_spans(segment, flagged, [1.0 - math.exp(lp) for lp in segment.logprobs])
        verb = ">=" if retrieve else "<"
        return Decision.by(
            self,
            retrieve=retrieve,
            score=score,
            reason=f"trigger classifier p={score:.2f} {verb} threshold {self.threshold:.2f}",
            intents=[s.text for s in spans],
            spans=spans,
            evidence={
                "features": list(self.model.feature_sets),
                "model_file": self.model.name or None,
                "threshold_source": self.threshold_source,
            },
        )

    def _hidden(self, segment: Segment, state: DecisionState) -> list[float]:
        generator = self.generator or state.generator
        if not self._checked:
            self.model.check_generator(generator)
            self._checked = self.generator is not None
        if not isinstance(generator, SupportsHiddenStates):  # check_generator let it through
            raise InputError(f"{type(generator).__name__} cannot produce hidden states")
        return list(generator.segment_hidden_state(segment))
