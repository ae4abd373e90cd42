"""Marker decider: the model asks for retrieval itself by writing `<retrieve>need</retrieve>`
(Toolformer-style in-text calls; the system prompt tells it to do so only when a needed fact is
missing). Parsing, including full-width variants and markers cut at the token limit, lives in
`rigkit.markers`.

Score: 1.0 for a marker with a phrase (closed, or cut at the token limit), 0.75 for a tag cut
off before any phrase (the model meant to ask but the need is unknown), 0.0 for none.
"""

from __future__ import annotations

from rigkit.deciders.base import DecisionState
from rigkit.deciders.text import char_span
from rigkit.markers import find_markers
from rigkit.trace import Decision, Segment

__all__ = ["MarkerDecider"]


class MarkerDecider:
    """Retrieve when the segment holds a retrieval marker; its phrases become the intents."""

    name = "marker"

    def __init__(self, tag: str = "retrieve", threshold: float = 0.5):
        self.tag = tag
        self.threshold = threshold
        find_markers("", tag)  # validates the tag now, not mid-run

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        markers = find_markers(segment.text, self.tag)
        if not markers:
            return Decision(
                False, 0.0, f"no <{self.tag}> marker", decider=self.name, threshold=self.threshold
            )
        spans = [char_span(segment, m.start, m.end, 1.0 if m.phrase else 0.75) for m in markers]
        score = max(s.score for s in spans)
        phrases = [m.phrase for m in markers if m.phrase]
        cut = sum(not m.closed for m in markers)
        reason = f"{len(markers)} <{self.tag}> marker(s)" + (
            f", {cut} cut at the token limit" if cut else ""
        )
        if phrases:
            reason += ": " + "; ".join(repr(p) for p in phrases[:3])
        return Decision(
            retrieve=score >= self.threshold,
            score=score,
            reason=reason,
            decider=self.name,
            threshold=self.threshold,
            intents=phrases,
            spans=spans,
            evidence={"markers": [m._asdict() for m in markers], "tag": self.tag},
        )
