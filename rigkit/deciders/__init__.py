"""Deciders: after each segment, judge whether the answer needs outside knowledge now.

`DECIDERS` maps a name to a class; `decider_from_config(DeciderConfig)` builds one, wraps it with
the entity checklist when asked, builds composites from their members and opens a classifier's
trained file (`trigger_model`, read by `trigger_model.load_trigger`). Runs build their decider
with `rigkit.build.build_decider`, which calls it. See each module for the paper it follows:
marker (Toolformer-style), prob (FLARE), entropy (DRAGIN RIND), keyword (cue rules), classifier
(trained trigger), composite, always / every_n / never (baselines).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from rigkit.config import DeciderConfig
from rigkit.deciders.base import (
    DEFAULT_POLICY,
    POLICIES,
    Decider,
    DecisionState,
    decider_needs,
    decider_policy,
)
from rigkit.deciders.baselines import AlwaysRetrieve, EveryNTokens, NeverRetrieve
from rigkit.deciders.classifier import ClassifierDecider, TriggerScorer
from rigkit.deciders.compare import compare_deciders
from rigkit.deciders.composite import CompositeDecider
from rigkit.deciders.entities import EntityChecklist
from rigkit.deciders.entropy import EntropyDecider
from rigkit.deciders.keyword import KeywordDecider
from rigkit.deciders.margin import MarginDecider
from rigkit.deciders.marker import MarkerDecider
from rigkit.deciders.probability import ProbabilityDecider
from rigkit.errors import InputError
from rigkit.generation.protocol import check_needs

__all__ = [
    "Decider",
    "DecisionState",
    "POLICIES",
    "DEFAULT_POLICY",
    "decider_policy",
    "TriggerScorer",
    "ClassifierDecider",
    "DECIDERS",
    "default_threshold",
    "check_decider_name",
    "check_decider_support",
    "decider_needs",
    "decider_from_config",
    "compare_deciders",
    "AlwaysRetrieve",
    "EveryNTokens",
    "NeverRetrieve",
    "CompositeDecider",
    "EntityChecklist",
    "EntropyDecider",
    "KeywordDecider",
    "MarkerDecider",
    "ProbabilityDecider",
    "MarginDecider",
]


class _Registry(Mapping):
    """name -> class; entries given as "module:Class" are imported on first access, so a missing
    optional module does not break `import rigkit.deciders`."""

    def __init__(self, entries: dict[str, type | str]):
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> type:
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            try:
                entry = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise InputError(f"decider {name!r} is not available here: {exc}") from exc
            self._entries[name] = entry
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __setitem__(self, name: str, cls: type | str) -> None:
        """Register your own decider class: `DECIDERS["mine"] = MyDecider`."""
        self._entries[name] = cls


DECIDERS: _Registry = _Registry(
    {
        "marker": MarkerDecider,
        "prob": ProbabilityDecider,
        "entropy": EntropyDecider,
        "keyword": KeywordDecider,
        "classifier": ClassifierDecider,
        "composite": CompositeDecider,
        "always": AlwaysRetrieve,
        "every_n": EveryNTokens,
        "never": NeverRetrieve,
        "entity": EntityChecklist,
        "margin": MarginDecider,
    }
)


def check_decider_support(config: DeciderConfig, generator: Any) -> None:
    """Refuse, in one line naming the decider, one that needs what `generator` cannot give (its
    class's `needs`: log-probabilities, attentions). `config` is a `DeciderConfig`; composite
    members are checked too. Called where a run is assembled, before any question; the trained
    classifier checks its hidden-state features itself when it is given the generator."""
    text_only = [n for n, cls in DECIDERS.items() if getattr(cls, "needs", None) == frozenset()]
    for member in (config, *config.members):
        if member.name in DECIDERS:  # an unknown name is refused when the decider is built
            check_needs(member.name, decider_needs(DECIDERS[member.name], member.params), generator, text_only)


def default_threshold(name: str) -> tuple[float | None, str]:
    """(default threshold, its unit) that decider `name` declares; (None, "") where it has none."""
    cls = DECIDERS[check_decider_name(name)]
    return getattr(cls, "default_threshold", None), getattr(cls, "unit", "")


def check_decider_name(name: str) -> str:
    """`name` if `DECIDERS` holds it; else an InputError naming the known deciders."""
    if name not in DECIDERS:
        raise InputError(f"unknown decider {name!r}; known: {', '.join(DECIDERS)}")
    return name


def decider_from_config(config: DeciderConfig, generator: object | None = None) -> Decider:
    """The decider `config` describes; the entity-checklist options wrap it.

    `config.threshold` None keeps the decider's default; `config.params` go to its constructor
    as keyword arguments. The generator is passed to deciders whose constructor takes one.
    A classifier's `trigger_model` file is opened with `trigger_model.load_trigger` (its
    `embedder` param replaces the sentence-embedding model the file names).
    """
    check_decider_name(config.name)
    if config.name == "composite":
        if not config.members:
            raise InputError("decider 'composite' needs members (decider.members in the config)")
        members = [decider_from_config(m, generator) for m in config.members]
        kwargs: dict[str, Any] = {
            "members": members, "combine": config.combine, "weights": config.weights,
        }
        decider = _construct(CompositeDecider, config, kwargs, generator)
    elif config.name == "entity":
        decider = _construct(
            EntityChecklist, config, {"skip_if_no_entity": config.skip_if_no_entity}, generator
        )
        return decider
    else:
        cls = DECIDERS[config.name]
        extra: dict[str, Any] = {}
        if config.trigger_model:
            config, extra["model"] = _load_model(config)
        decider = _construct(cls, config, extra, generator)
    if config.entity_checklist or config.skip_if_no_entity:
        decider = EntityChecklist(
            decider, checklist=config.entity_checklist, skip_if_no_entity=config.skip_if_no_entity
        )
    return decider


def _load_model(config: DeciderConfig) -> tuple[DeciderConfig, TriggerScorer]:
    """(config without the loader's `embedder` param, the model its `trigger_model` file holds)."""
    from rigkit.deciders.trigger_model import load_trigger  # sklearn and skops: only when asked

    params = dict(config.params)
    model = load_trigger(config.trigger_model, embedder=params.pop("embedder", None))
    return dataclasses.replace(config, params=params), model


def _construct(cls: type, config: DeciderConfig, kwargs: dict[str, Any], generator) -> Decider:
    kwargs = {**kwargs, **config.params}
    if config.threshold is not None:
        kwargs["threshold"] = config.threshold
    accepted = inspect.signature(cls).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    if generator is not None and ("generator" in accepted or takes_any):
        kwargs.setdefault("generator", generator)
    unknown = [k for k in kwargs if k not in accepted and not takes_any]
    if unknown:
        known = [k for k in accepted if k not in ("self", "members")]
        raise InputError(
            f"decider {config.name!r} does not take {', '.join(sorted(unknown))}; "
            f"its options: {', '.join(known)}"
        )
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InputError(f"decider {config.name!r}: {exc}") from exc
