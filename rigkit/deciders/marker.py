"""Marker decider: the model asks for retrieval itself by writing `<retrieve>need</retrieve>`
(Toolformer-style in-text calls; the system prompt tells it to do so only when a needed fact is
missing), or the tags of another marker protocol (`search-r1`'s `<search>`, `r1-searcher`,
`self-rag`'s `[Retrieval]`). Parsing, including full-width variants and markers cut at the token
limit, lives in `rigkit.markers`.

Score: 1.0 for a marker with a phrase (closed, or cut at the token limit) and for a complete
single-token marker (`[Retrieval]`, which carries no phrase), 0.75 for a tag cut off before any
phrase (the model meant to ask but the need is unknown), 0.0 for none.
"""

from __future__ import annotations

from rigkit.deciders.base import DecisionState
from rigkit.deciders.spans import char_span
from rigkit.markers import Marker, MarkerProtocol, find_markers, marker_evidence, resolve_protocol
from rigkit.trace import Decision, Segment

__all__ = ["MarkerDecider"]


class MarkerDecider:
    """Retrieve when the segment holds a retrieval marker; its phrases become the intents."""

    name = "marker"
    needs: frozenset[str] = frozenset()  # the text alone
    policy = "continue"  # the model's own request stays; the answer goes on after the passages
    unit = "score"
    default_threshold = 0.5

    @property
    def score_threshold(self) -> float:
        return self.threshold

    def __init__(
        self, tag: str = "retrieve", threshold: float = default_threshold, protocol: str | MarkerProtocol | None = None
    ):
        # a preset name, a protocol file or object; `tag` alone is an openrig-style <tag>
        self.protocol = resolve_protocol(protocol, tag)  # validated now, not mid-run
        self.tag = self.protocol.tag  # the <word> of word-tag protocols, None for literal tags
        self.threshold = threshold

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        protocol = self.protocol
        markers = find_markers(segment.text, protocol)
        if not markers:
            return Decision.by(self, False, 0.0, f"no {protocol.open} marker")
        spans = [char_span(segment, m.start, m.end, _score(m, protocol)) for m in markers]
        score = max(s.score for s in spans)
        phrases = [m.phrase for m in markers if m.phrase]
        cut = sum(not m.closed for m in markers)
        reason = f"{len(markers)} {protocol.open} marker(s)" + (
            f", {cut} cut at the token limit" if cut else ""
        )
        if phrases:
            reason += ": " + "; ".join(repr(p) for p in phrases[:3])
        return Decision.by(
            self,
            retrieve=score >= self.threshold,
            score=score,
            reason=reason,
            intents=phrases,
            spans=spans,
            evidence={"markers": [m._asdict() for m in markers], **marker_evidence(protocol)},
        )


def _score(marker: Marker, protocol: MarkerProtocol) -> float:
    if marker.phrase or (marker.closed and not protocol.close):
        return 1.0
    return 0.75
