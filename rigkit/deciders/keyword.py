"""Keyword / cue decider: rules a reader would apply, with no model internals.

Two signals. Hedging cues ("I'm not sure", "我不确定", "根据相关信息", ...) say the model knows
it lacks a fact; the lists are data (rigkit/resources/cues_en.txt, cues_zh.txt) and can be
replaced or extended. Fact-shaped strings (numbers, dates, codes, proper names) that no injected
passage mentions, and that the question did not already give, are claims nothing supports yet.
Score: 1.0 with a cue, else 1 - 0.5**k for k unsupported facts (0.5 for one, 0.75 for two...);
retrieve when score >= threshold (default 0.5: a cue or one unsupported fact).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from rigkit.deciders.base import DecisionState
from rigkit.deciders.spans import char_span
from rigkit.text import fact_words, has_cjk, load_word_list, mentions, passage_mentions
from rigkit.trace import Decision, Segment

__all__ = ["KeywordDecider", "load_cues"]


def load_cues(sources: Iterable[str | Path] = ("cues_en", "cues_zh")) -> list[str]:
    """Cue phrases from resource names (`cues_en`) or .txt paths, one per line."""
    cues: list[str] = []
    for source in sources:
        cues.extend(load_word_list(source))
    return cues


class KeywordDecider:
    """Hedging cues and unsupported fact-shaped tokens; see the module docstring."""

    name = "keyword"
    needs: frozenset[str] = frozenset()  # the text alone
    policy = "regenerate"  # the unsupported claim is written again from the passages
    unit = "score"
    default_threshold = 0.5

    @property
    def score_threshold(self) -> float:
        return self.threshold

    def __init__(
        self,
        threshold: float = default_threshold,
        cues: Sequence[str] | None = None,
        cue_files: Sequence[str | Path] = ("cues_en", "cues_zh"),
        extra_cues: Sequence[str] = (),
        check_facts: bool = True,
        question_supports: bool = True,
    ):
        self.threshold = threshold
        self.cues = list(cues) if cues is not None else load_cues(cue_files)
        self.cues += list(extra_cues)
        self.check_facts = check_facts
        self.question_supports = question_supports  # facts the question states are given
        self._cue_res = [(cue, _cue_pattern(cue)) for cue in self.cues if cue.strip()]

    def decide(self, segment: Segment, state: DecisionState) -> Decision:
        text = segment.text
        if not text.strip():
            return Decision.by(self, False, 0.0, "empty segment: nothing to judge")
        cue_hits = self._cues_in(text)
        facts = fact_words(text) if self.check_facts else []
        unsupported = [
            f
            for f in facts
            if not passage_mentions(state.passages, f.text)
            and not (self.question_supports and mentions(state.question, f.text))
        ]
        score = 1.0 if cue_hits else 1.0 - 0.5 ** len(unsupported)
        spans = [char_span(segment, s, e, 1.0) for s, e, _ in cue_hits]
        spans += [char_span(segment, f.start, f.end, 0.5) for f in unsupported]
        spans.sort(key=lambda s: s.char_start)
        parts = []
        if cue_hits:
            parts.append("hedging cue " + ", ".join(repr(c) for _, _, c in cue_hits[:3]))
        if unsupported:
            listed = ", ".join(repr(f.text) for f in unsupported[:4])
            parts.append(f"{len(unsupported)} unsupported fact(s) {listed}")
        reason = "; ".join(parts) or (
            f"no hedging cue; {len(facts)} fact(s), all supported" if facts else "no cue, no facts"
        )
        return Decision.by(
            self,
            retrieve=score >= self.threshold and score > 0,
            score=score,
            reason=reason,
            intents=[f.text for f in unsupported],
            spans=spans,
            evidence={
                "cues": [c for _, _, c in cue_hits],
                "unsupported": [f.text for f in unsupported],
                "supported": [f.text for f in facts if f not in unsupported],
            },
        )

    def _cues_in(self, text: str) -> list[tuple[int, int, str]]:
        """Matched cues (start, end, cue), longest first where they overlap, in text order."""
        normalised = text.replace("’", "'")
        hits = [(m.start(), m.end(), cue) for cue, rx in self._cue_res for m in rx.finditer(normalised)]
        hits.sort(key=lambda h: (-(h[1] - h[0]), h[0]))
        kept: list[tuple[int, int, str]] = []
        for h in hits:
            if all(h[1] <= k[0] or k[1] <= h[0] for k in kept):
                kept.append(h)
        return sorted(kept)


def _cue_pattern(cue: str) -> re.Pattern[str]:
    body = re.escape(cue.strip().replace("’", "'"))
    body = body.replace(r"\ ", r"\s+")
    if has_cjk(cue):
        return re.compile(body)
    return re.compile(rf"(?<!\w){body}(?!\w)", re.IGNORECASE)
