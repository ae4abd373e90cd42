"""The retrieval-trigger classifier: "does this segment need retrieval?" learned from data.

Pipeline: `build_labels` (closed-book generation labelled by documented rules, or
`load_labels` for bring-your-own `text,label` tables) -> `train_trigger` (features by name,
split by question, threshold on dev) -> `save_trigger` / `load_trigger` (skops with an explicit
allow-list) -> `evaluate_trigger` (classifier vs prob / entropy / keyword deciders on the same
held-out labels) and `end_effect` (RIG answer quality with each decider). The trained file plugs
into the controller as `rigkit.deciders.classifier.ClassifierDecider` (`trigger_decider(path)`).
The file format and the features it is scored with live beside that decider
(`rigkit.deciders.trigger_model`, `rigkit.deciders.trigger_features`), so a run opens the file
without importing this package.
"""

from __future__ import annotations

from rigkit.deciders.trigger_features import FEATURE_SETS, FeatureExtractor, FeatureSpec
from rigkit.trigger.decider import trigger_decider
from rigkit.trigger.evaluate import TriggerReport, evaluate_trigger, signal_metrics
from rigkit.trigger.labels import RULES, agreement, build_labels
from rigkit.trigger.labelset import LabelledSegment, LabelSet, load_labels
from rigkit.trigger.model import TriggerModel, load_trigger, save_trigger, train_trigger

__all__ = [
    "FEATURE_SETS",
    "RULES",
    "FeatureExtractor",
    "FeatureSpec",
    "LabelSet",
    "LabelledSegment",
    "TriggerModel",
    "TriggerReport",
    "agreement",
    "build_labels",
    "end_effect",
    "evaluate_trigger",
    "load_labels",
    "load_trigger",
    "save_trigger",
    "signal_metrics",
    "train_trigger",
    "trigger_decider",
]


def __getattr__(name: str):
    # end_effect pulls in the controller and retrieval stack: load it only when asked for.
    if name == "end_effect":
        from rigkit.trigger.endeffect import end_effect

        return end_effect
    raise AttributeError(name)
