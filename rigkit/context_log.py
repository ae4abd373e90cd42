"""A run's changes to its context, made here and logged, so a saved run rebuilds its context exactly."""

from __future__ import annotations

from collections.abc import Sequence

from rigkit.context import ContextManager
from rigkit.run_state import ContextOp
from rigkit.trace import Hit, Injection, Kept, RoundTrace, Segment

__all__ = ["ContextLog"]


class ContextLog:
    """`fit`, `keep` (accept or replace a segment) and `inject` on the context, each logged in `ops`."""

    def __init__(self, context: ContextManager):
        self.context = context
        self.ops: list[ContextOp] = []

    def fit(self, reserve: int) -> list[str]:
        """Room for `reserve` tokens: the chunk ids of the passages evicted for it."""
        self.ops.append(ContextOp("fit", reserve=reserve))
        return self.context.fit(reserve)

    def keep(self, trace: RoundTrace, how: Kept, segment: Segment | None = None) -> None:
        """Put `segment` (the round's own by default) in the answer, and record on the round how:
        the one place a round's `kept` is decided."""
        trace.kept = how
        segment = segment or trace.segment
        if how is Kept.PREFIX:
            trace.kept_chars = len(segment.text)
        if how is Kept.REWRITE:
            self.ops.append(ContextOp("replace", segment=segment))
            self.context.replace_last(segment)
        else:
            self.ops.append(ContextOp("accept", segment=segment))
            self.context.accept(segment)

    def go_on(self, trace: RoundTrace) -> None:
        """A turn asking the model to go on from the passages; the round keeps nothing yet."""
        trace.kept = Kept.WAITING
        self.ops.append(ContextOp("go_on"))
        self.context.go_on()

    def inject(self, hits: Sequence[Hit]) -> Injection:
        self.ops.append(ContextOp("inject", hits=list(hits)))
        return self.context.inject(hits)

    def replay(self, ops: Sequence[ContextOp]) -> None:
        """The operations of a saved run, done again in order (no model call)."""
        for op in ops:
            if op.op == "fit":
                self.fit(op.reserve)
            elif op.op == "inject":
                self.inject(op.hits)
            elif op.op == "go_on":
                self.ops.append(op)
                self.context.go_on()
            elif op.op in ("accept", "replace") and op.segment is not None:
                self.ops.append(op)
                if op.op == "accept":
                    self.context.accept(op.segment)
                else:
                    self.context.replace_last(op.segment)
