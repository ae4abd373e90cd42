"""Plug a trained trigger model into the RIG loop as the classifier decider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rigkit.deciders.classifier import ClassifierDecider
from rigkit.trigger.model import TriggerModel, load_trigger

__all__ = ["trigger_decider"]


def trigger_decider(
    model: str | Path | TriggerModel,
    threshold: float | None = None,
    generator: Any | None = None,
    embedder: Any | None = None,
) -> ClassifierDecider:
    """`trigger_decider("trigger.skops")`: load the file (or take the model) and wrap it.

    `embedder` replaces the sentence-embedding model the file names; `generator` is checked now
    when the model reads hidden states (else at the first decision, from the decision state).
    """
    if not isinstance(model, TriggerModel):
        model = load_trigger(model, embedder=embedder)
    elif embedder is not None:
        model.embedder = embedder
    return ClassifierDecider(model, threshold=threshold, generator=generator)
