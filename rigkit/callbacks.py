"""What a run tells its observers: `RoundCallback` (the events) and `Observers` (many as one)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rigkit.deciders.base import DecisionState
from rigkit.trace import RoundTrace

__all__ = ["RoundCallback", "Observers"]


class RoundCallback:
    """Observers (notebook widgets, loggers, token streams) override the events they need.

    `on_token` receives each token's text as the model writes it, tentatively: a segment may
    still be regenerated or trimmed; `rigkit.streaming.TokenStream` turns it into answer text.
    An object that does not subclass this and has only some of the methods works too.
    """

    def on_round_start(self, index: int, state: DecisionState) -> None:
        """Before a round's segment is written; `state` is what the decider will see."""

    def on_token(self, text: str) -> None:
        """One token's text, as it is written."""

    def on_round_end(self, round_trace: RoundTrace) -> None:
        """After a round, with its full record."""


class Observers(RoundCallback):
    """A run's callbacks as one: each event goes to every callback that has a method for it.

    Gathered when a run starts, so callbacks appended to `controller.callbacks` since are seen,
    and an object with only some of the methods (not a `RoundCallback`) is still welcome.
    """

    def __init__(self, callbacks: Sequence[Any]):
        self.starts = _handlers(callbacks, "on_round_start")
        self.tokens = _handlers(callbacks, "on_token")
        self.ends = _handlers(callbacks, "on_round_end")

    def on_round_start(self, index: int, state: DecisionState) -> None:
        for handler in self.starts:
            handler(index, state)

    def on_token(self, text: str) -> None:
        for handler in self.tokens:
            handler(text)

    def on_round_end(self, round_trace: RoundTrace) -> None:
        for handler in self.ends:
            handler(round_trace)

    @property
    def token_sink(self) -> Callable[[str], None] | None:
        """The generator's `on_token`: None when nobody listens, so no streamer runs."""
        return self.on_token if self.tokens else None


def _handlers(callbacks: Sequence[Any], event: str) -> list[Callable[..., None]]:
    """Each callback's `event` method; a plain object without one is left out of that event."""
    return [getattr(c, event) for c in callbacks if hasattr(c, event)]


