"""Entity checklist: track the question's entities and retrieve until passages cover them all.

Multi-hop questions name several things ("Who was born first, the director of X or of Y?");
a generation-signal decider may fire for X and never for Y. The checklist parses the question's
entities once (names, titles, codes, dates, numbers: `rigkit.text.question_entities`),
counts one as covered when an injected passage mentions it, and keeps asking for retrieval,
with the uncovered entities as intents, while any is not covered. With `skip_if_no_entity`,
segments that mention no entity at all (no question entity, no fact-shaped string) never
trigger retrieval, whatever the inner decider says.
It wraps another decider (`inner`) or, alone, acts as a decider of its own ("entity").
"""

from __future__ import annotations

from rigkit.deciders.base import Decider, DecisionState, decider_policy
from rigkit.text import fact_words, mentions, passage_mentions, question_entities
from rigkit.trace import Decision, Segment

__all__ = ["EntityChecklist"]


class EntityChecklist:
    """Wraps `inner` (or nothing) with the checklist and/or the skip-if-no-entity gate."""

    name = "entity"
    unit, default_threshold = "", None  # the wrapped decider's threshold is its own

    def __init__(
        self,
        inner: Decider | None = None,
        checklist: bool = True,
        skip_if_no_entity: bool = False,
        threshold: float | None = None,
    ):
        self.inner = inner
        self.checklist = checklist
        self.skip_if_no_entity = skip_if_no_entity
        self.threshold = threshold
        self._cache: tuple[str, list[str]] = ("", [])

    @property
    def policy(self) -> str:
        """The wrapped decider's policy; alone, "continue" (the checklist asks for what is
        missing; the sentence written so far stays)."""
        return decider_policy(self.inner) if self.inner is not None else "continue"

    def entities(self, question: str) -> list[str]:
        if self._cache[0] != question:
            self._cache = (question, question_entities(question))
        return self._cache[1]

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        if not segment.text.strip():
            return Decision(False, 0.0, "empty segment: nothing to judge", decider=self.name)
        entities = self.entities(state.question)
        covered = [e for e in entities if passage_mentions(state.passages, e)]
        missing = [e for e in entities if e not in covered]
        in_segment = [e for e in entities if mentions(segment.text, e)]
        evidence = {"entities": entities, "covered": covered, "missing": missing}
        label = f"{getattr(self.inner, 'name', 'inner')}+checklist" if self.inner else self.name
        if self.skip_if_no_entity and not in_segment and not fact_words(segment.text):
            return Decision(
                False, 0.0, "segment mentions no entity: retrieval skipped", decider=label,
                evidence={**evidence, "skipped": True},
            )
        inner = self.inner.decide(segment, state) if self.inner is not None else None
        if inner is not None and (inner.retrieve or not self.checklist or not missing):
            inner.evidence = {**inner.evidence, **evidence}
            inner.decider = label
            return inner
        if self.checklist and missing:
            listed = ", ".join(repr(e) for e in missing[:4])
            return Decision(
                True,
                max(inner.score if inner else 0.0, len(missing) / max(1, len(entities))),
                f"{len(missing)} of {len(entities)} question entities not yet covered: {listed}",
                decider=label,
                intents=missing,
                spans=inner.spans if inner else [],
                extra_forward_passes=inner.extra_forward_passes if inner else 0,
                evidence={**(inner.evidence if inner else {}), **evidence},
            )
        why = "all question entities covered" if entities else "no entities in the question"
        return Decision(False, 0.0, why, decider=label, evidence=evidence)
