"""The classifier decider: a trained retrieval-trigger model thresholds its probability.

The model file (see `rigkit.trigger`) says which features it needs; this decider computes exactly
those for each segment: the question comes from `DecisionState.question`, hidden states from the
generator (`generator=` here, else `state.generator`). `Decision.score` is the model's
probability, so it compares with the other deciders on the same labels by ROC / PR.

Threshold: an explicit `threshold` wins; with none, the threshold chosen on the dev split and
stored in the model file is used; a file without one falls back to 0.7 (the issue's default).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rigkit.deciders.base import DecisionState
from rigkit.errors import InputError
from rigkit.trace import Decision, Segment, Span

__all__ = ["ClassifierDecider", "DEFAULT_THRESHOLD"]

DEFAULT_THRESHOLD = 0.7


class ClassifierDecider:
    """`ClassifierDecider("trigger.skops")`: retrieve when p(needs retrieval) >= threshold."""

    name = "classifier"

    def __init__(
        self,
        model_path: str | Path | None = None,
        threshold: float | None = None,
        generator: Any | None = None,
        embedder: Any | None = None,
        model: Any | None = None,
    ):
        from rigkit.trigger.features import FeatureExtractor
        from rigkit.trigger.model import check_generator, load_trigger

        if model is None:
            if not model_path:
                raise InputError(
                    "the classifier decider needs a trained model file: --trigger-model FILE "
                    "(train one with `rigkit trigger train`)"
                )
            model = load_trigger(model_path)
        self.model = model
        self.generator = generator
        if generator is not None:
            check_generator(model.spec, generator)
        stored = getattr(model, "threshold", None)
        self.threshold = float(
            threshold if threshold is not None else stored if stored is not None else DEFAULT_THRESHOLD
        )
        self.threshold_source = (
            "given" if threshold is not None else "model file (dev)" if stored is not None else "default"
        )
        self.extractor = FeatureExtractor(model.spec, embedder)
        self._checked = generator is not None

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        from rigkit.trigger.features import FeatureInput, content_mask

        if not segment.text.strip():
            return Decision(False, 0.0, "empty segment", decider=self.name, threshold=self.threshold)
        hidden = self._hidden(segment, state) if "hidden" in self.model.spec.sets else None
        X = self.extractor.transform([FeatureInput(state.question, segment, hidden)])
        score = float(self.model.predict_proba(X)[0])
        retrieve = score >= self.threshold
        low = self.model.spec.low_prob
        mask = content_mask(segment.tokens)
        spans = [
            Span(i, i + 1, tok.strip(), score=1.0 - math.exp(lp))
            for i, (tok, lp, m) in enumerate(zip(segment.tokens, segment.logprobs, mask, strict=False))
            if m and math.exp(lp) < low
        ]
        verb = ">=" if retrieve else "<"
        return Decision(
            retrieve=retrieve,
            score=score,
            reason=f"trigger classifier p={score:.2f} {verb} threshold {self.threshold:.2f}",
            decider=self.name,
            threshold=self.threshold,
            intents=[s.text for s in spans],
            spans=spans,
            evidence={
                "features": list(self.model.spec.sets),
                "model_file": Path(self.model.path).name if self.model.path else None,
                "threshold_source": self.threshold_source,
            },
        )

    def _hidden(self, segment: Segment, state: DecisionState) -> list[float]:
        from rigkit.trigger.model import check_generator

        generator = self.generator or state.generator
        if not self._checked:
            check_generator(self.model.spec, generator)
            self._checked = self.generator is not None
        return list(generator.segment_hidden_state(segment))  # type: ignore[union-attr]
