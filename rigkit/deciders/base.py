"""The `Decider` extension point: judge after each segment whether to retrieve now.

A decider also declares what the loop does with the segment that made it fire (`policy`):
- "continue": keep the segment, inject the passages after it and go on (IRCoT / FS-RAG, FL-RAG,
  markers: the sentence stays and the next one reads the new passages);
- "regenerate": drop the segment and write it again with the passages in context (FLARE's
  look-ahead: the flagged sentence is only a draft of what to search for);
- "rewind": keep the segment up to its first flagged word (the decision's spans) and write on from
  there with the passages: only the doubtful word onward is written again. It continues a sentence
  mid-way, so it needs the prefix layout, where the draft stays one assistant message.
A decider that declares nothing gets `DEFAULT_POLICY`; a run may override it
(`controller.policy` in the config, `--policy` on `rigkit ask`).

A decider class declares what it needs of the model besides the text (`needs`, read by
`decider_needs`): the tokens' log-probabilities, the model's attentions, extra forward passes.
A decider whose needs depend on its settings says so in `needs_for(params)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rigkit.errors import InputError
from rigkit.generation.protocol import ATTENTION, EXTRA_PASSES, LOGPROBS
from rigkit.trace import Decision, Hit, Query, Segment

__all__ = ["Decider", "DecisionState", "POLICIES", "DEFAULT_POLICY", "decider_policy",
           "LOGPROBS", "ATTENTION", "EXTRA_PASSES", "decider_needs"]

POLICIES = ("continue", "regenerate", "rewind")
DEFAULT_POLICY = "regenerate"


def decider_needs(cls: type, params: Mapping[str, Any] | None = None) -> frozenset[str]:
    """What decider class `cls`, built with `params`, needs of the model (empty: the text alone)."""
    needs_for = getattr(cls, "needs_for", None)
    return frozenset(needs_for(dict(params or {})) if callable(needs_for) else getattr(cls, "needs", ()))


@dataclass
class DecisionState:
    """What a decider (and the query builder after it) may know besides the segment itself."""

    question: str
    draft: str = ""  # accepted answer text before this segment
    passages: list[Hit] = field(default_factory=list)  # passages now in context
    round_index: int = 0  # index of the segment being judged
    retrievals_done: int = 0
    tokens_since_retrieval: int = 0  # generated tokens since the last retrieval, this segment included
    generator: object | None = None  # the generator, for deciders that need model internals
    segments: list[Segment] = field(default_factory=list)  # accepted segments before this one
    last_query: Query | None = None  # the previous retrieval's query, if any
    last_hits: list[Hit] = field(default_factory=list)  # ... and what it found
    history: list[tuple[str, str]] = field(default_factory=list)  # earlier (question, answer) turns
    # the segment this one is written to replace if it earns its place (the set-aside segment of a
    # regenerate, or the kept one a grounded rewrite redoes); None: a new segment. Streams hold such text.
    rewrite_of: Segment | None = None


@runtime_checkable
class Decider(Protocol):
    """`decide(segment, state) -> Decision` with `Decision.score` in [0, 1].

    Optional class attribute: `policy` ("continue" | "regenerate" | "rewind", see the module docstring).
    """

    def decide(self, segment: Segment, state: DecisionState) -> Decision: ...


def decider_policy(decider: object) -> str:
    """The policy `decider` declares (`DEFAULT_POLICY` when it declares none), validated."""
    policy = getattr(decider, "policy", None) or DEFAULT_POLICY
    if policy not in POLICIES:
        name = getattr(decider, "name", type(decider).__name__)
        raise InputError(f"decider {name!r} declares policy {policy!r}; use one of {POLICIES}")
    return policy
