"""Where the passages and the answer's segments sit, in the order the model reads them.

`append` (default): the up-front passages go with the question; each injection is a block of its
own after the segment that asked for it. `prefix`: injected passages join the up-front ones, in
front of the question, as FLARE and DRAGIN do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from rigkit.trace import Hit, Segment

__all__ = ["Block", "Layout"]


@dataclass
class Block:
    """One injection in the append layout: the passages that are still in context."""

    hits: list[Hit] = field(default_factory=list)
    instruction: str = ""  # fixed when injected, so the block renders the same every round
    nudge: bool = False  # no passages: a user turn asking the model to go on from those above


class Layout:
    """The up-front passages, then accepted segments and passage blocks in order (append-only,
    except that an eviction empties a passage's place and a grounded rewrite replaces the last
    segment)."""

    def __init__(self, initial: list[Hit] | None = None):
        self.initial: list[Hit] = list(initial or [])  # before the question: given, or `prefix` injections
        self.events: list[Segment | Block] = []

    def accept(self, segment: Segment) -> None:
        self.events.append(segment)

    def add(self, hits: list[Hit], instruction: str, prefix: bool) -> None:
        """Place injected passages: with the up-front ones (`prefix`), or as a block (`append`)."""
        if prefix:
            self.initial.extend(hits)
        elif hits:
            self.events.append(Block(hits, instruction))

    def nudge(self, instruction: str) -> None:
        """A user turn of `instruction` alone after the last event (see `Block.nudge`)."""
        self.events.append(Block([], instruction, nudge=True))

    @property
    def nudged(self) -> bool:
        """Whether the last event is a nudge: the model was already asked to go on."""
        return bool(self.events) and isinstance(self.events[-1], Block) and self.events[-1].nudge

    def replace_last(self, segment: Segment) -> None:
        """Put `segment` in place of the last accepted segment, which must be the last event."""
        if not self.events or not isinstance(self.events[-1], Segment):
            raise ValueError("only the last accepted segment can be replaced, and passages follow it")
        self.events[-1] = segment

    def blocks(self) -> Iterator[Block]:
        return (e for e in self.events if isinstance(e, Block))

    def segments(self) -> Iterator[Segment]:
        return (e for e in self.events if isinstance(e, Segment))

    @property
    def passages(self) -> list[Hit]:
        """Passages now in context, in the order they were injected."""
        return self.initial + [h for b in self.blocks() for h in b.hits]

    def remove(self, chunk_id: str) -> None:
        """Take a passage out of wherever it sits."""
        self.initial = [h for h in self.initial if h.chunk_id != chunk_id]
        for block in self.blocks():
            block.hits = [h for h in block.hits if h.chunk_id != chunk_id]

    def draft_parts(self) -> list[tuple[str, Segment]]:
        """The draft as (text, accepted segment) pieces, in order; they concatenate to the draft."""
        parts: list[tuple[str, Segment]] = []
        last, after_passages = "", False
        for event in self.events:
            if isinstance(event, Block):
                after_passages = True
                continue
            text = event.text
            if after_passages and last and not last[-1].isspace() and not text[:1].isspace():
                text = " " + text  # a new assistant turn starts without the space a sentence needs
            parts.append((text, event))
            last, after_passages = (last + text)[-1:], False
        return parts

    @property
    def draft(self) -> str:
        """The accepted answer text so far (raw: markers included)."""
        return "".join(text for text, _ in self.draft_parts())
