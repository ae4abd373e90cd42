"""What the loop needs of a model: the `Generator` protocol and optional capabilities.

Every backend implements `Generator`. In-process models also offer model internals (attention,
hidden states) and a resettable cache; deciders and the trigger code ask for those with
`isinstance(generator, SupportsAttention)` and friends instead of probing attribute names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rigkit.trace import Segment
from rigkit.transcript import Piece, StopRule

__all__ = ["Generator", "SupportsAttention", "SupportsHiddenStates", "SupportsReset"]


@runtime_checkable
class Generator(Protocol):
    """The model behind a run. In-process (`HFGenerator`) or an HTTP backend."""

    def next_segment(
        self, prompt: Sequence[Piece], stop: StopRule, max_new_tokens: int
    ) -> Segment:
        """Continue `prompt` until `stop` fires, end of turn, or `max_new_tokens`."""
        ...

    def generate(self, prompt: str, max_new_tokens: int = 48) -> str:
        """A one-off helper call (e.g. a query rewrite): `prompt` as a user message, reply text."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """The chat template applied to `messages`, as text."""
        ...


@runtime_checkable
class SupportsAttention(Protocol):
    """A generator that can show the attention among a segment's tokens (DRAGIN)."""

    def segment_attention(self, segment: Segment) -> list[list[float]]: ...


@runtime_checkable
class SupportsHiddenStates(Protocol):
    """A generator that can pool the hidden state of a segment (trigger features)."""

    def segment_hidden_state(self, segment: Segment) -> list[float]: ...


@runtime_checkable
class SupportsReset(Protocol):
    """A generator with per-question state (a KV cache) to forget, and sampling to reseed."""

    def reset(self, seed: int | None = None) -> None: ...
