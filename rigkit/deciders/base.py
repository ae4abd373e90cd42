"""The `Decider` extension point: judge after each segment whether to retrieve now."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rigkit.trace import Decision, Hit, Segment

__all__ = ["Decider", "DecisionState"]


@dataclass
class DecisionState:
    """What a decider may know besides the segment itself."""

    question: str
    draft: str = ""  # accepted answer text before this segment
    passages: list[Hit] = field(default_factory=list)  # passages now in context
    round_index: int = 0  # index of the segment being judged
    retrievals_done: int = 0
    tokens_since_retrieval: int = 0  # generated tokens since the last retrieval, this segment included
    generator: object | None = None  # the generator, for deciders that need model internals


@runtime_checkable
class Decider(Protocol):
    """`decide(segment, state) -> Decision` with `Decision.score` in [0, 1]."""

    def decide(self, segment: Segment, state: DecisionState) -> Decision: ...
