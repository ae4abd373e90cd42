"""Plug a trained trigger model into the RIG loop as the classifier decider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rigkit.config import DeciderConfig
from rigkit.deciders.classifier import ClassifierDecider
from rigkit.deciders.trigger_model import TriggerModel

__all__ = ["trigger_decider"]


def trigger_decider(
    model: str | Path | TriggerModel,
    threshold: float | None = None,
    generator: Any | None = None,
    embedder: Any | None = None,
) -> ClassifierDecider:
    """`trigger_decider("trigger.skops")`: the classifier decider over a file (or a loaded model).

    A file goes through `rigkit.build.build_decider`, as `--trigger-model FILE` does. `embedder`
    replaces the sentence-embedding model the file names; `generator` is checked now when the
    model reads hidden states (else at the first decision, from the decision state).
    """
    if isinstance(model, TriggerModel):
        if embedder is not None:
            model.embedder = embedder
        return ClassifierDecider(model, threshold=threshold, generator=generator)
    from rigkit.build import build_decider

    params = {"embedder": embedder} if embedder is not None else {}
    config = DeciderConfig(name="classifier", trigger_model=str(model), threshold=threshold, params=params)
    return build_decider(config, generator)
