"""The checks that keep retrieval from making an answer worse: a part the controller holds.

They say whether a rewrite earns its place over the segment it replaces,
where a segment starts repeating the answer, whether a kept sentence is supported by what it
could see (and whether its grounded rewrite is), where the answer ends, and its short answer
line. They read the controller's config, context and generator and change nothing; the loop acts
on what they say.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from rigkit.citations import attribute
from rigkit.config import ControllerConfig
from rigkit.context import ContextManager
from rigkit.generation.protocol import Generator
from rigkit.guards import first_repeat, ngram_overlap, phrase_loop_at, whole_sentences
from rigkit.markers import clean_answer
from rigkit.short_answer import ask_prompt, extract_answer, parse_short_reply
from rigkit.text import content_words, split_sentences, strip_citations
from rigkit.trace import Hit, Kept, RoundTrace, Segment, kept_segment, set_aside_round

__all__ = ["AnswerChecks"]


class AnswerChecks:
    """The answer-quality checks of `controller.*` settings, over the controller's parts."""

    def __init__(self, config: ControllerConfig, context: ContextManager, generator: Generator,
                 embed: Callable[[list[str]], Any] | None = None):
        self.config, self.context, self.generator = config, context, generator
        self.embed = embed  # texts -> unit vectors: the in-loop support check (controller.check_support)

    def clean(self, text: str) -> str:
        """The answer text: no markers, no citation tags the model wrote, single spaces."""
        return re.sub(r"[ \t]+", " ", strip_citations(clean_answer(text, self.context.protocol))).strip()

    def rewrite_fault(self, rounds: Sequence[RoundTrace], rewrite: Segment) -> str:
        """Why the rewrite of the set-aside segment does not earn its place ("" when it does).

        It adds nothing (it is empty, or repeats accepted text), or no passage the flagged round
        brought in supports it while one supports the set-aside segment. Support is the citation
        rule (`rigkit.citations.attribute`: every sentence shares two content words and half of
        its own with a passage); for the set-aside segment the passage must also hold one of its
        flagged words, the claim that was in doubt (a decider that flags no words leaves nothing
        a passage could confirm). With no entailment model, "contradicts the passages" is read
        as "unsupported". So a supported rewrite stays even when it drops the flagged word, and
        so does one when neither rests on the new passages: it was written with them in view.
        """
        if not self.config.rewrite_check:
            return ""
        if not rewrite.text.strip():
            return "the rewrite is empty"
        accepted = split_sentences(self.clean(self.context.draft))
        if accepted and ngram_overlap(rewrite.text, accepted) >= self.config.repeat_overlap:
            return "the rewrite repeats accepted text"
        at = set_aside_round(rounds, len(rounds))  # past a go-on turn
        flagged_round = rounds[at if at is not None else -1]
        added = set(flagged_round.injection.added if flagged_round.injection else ())
        new = [h for h in self.context.passages if h.chunk_id in added]
        flagged = content_words(" ".join(s.text for s in flagged_round.decision.spans))
        doubted = [h for h in new if flagged & content_words(f"{h.title} {h.text}")]
        if self.backing(rewrite.text, new) or not (backing := self.backing(flagged_round.segment.text, doubted)):
            return ""
        dropped = "" if flagged & content_words(rewrite.text) else \
            f": it drops the flagged {' '.join(sorted(flagged))!r}"
        return f"no new passage supports the rewrite, {', '.join(backing)} supports the set-aside segment{dropped}"

    def backing(self, text: str, passages: Sequence[Hit]) -> list[str]:
        """The passages among `passages` that support every sentence of `text`, as its citations
        would name them; [] when a sentence rests on none of them (or there is no sentence)."""
        attributions = attribute(self.clean(text), passages)
        if not attributions or any(a.cited is None for a in attributions):
            return []
        return list(dict.fromkeys(a.cited for a in attributions if a.cited))

    def repeat_at(self, segment: Segment) -> tuple[int, str] | None:
        """Where `segment` starts repeating the answer, and how: an earlier sentence again
        ("repeat") or a phrase going round inside its sentence ("phrase loop"); None: it does not."""
        if not self.config.repeat_guard or not segment.text.strip():
            return None
        cuts = [(at, kind) for at, kind in (
            (first_repeat(self.context.draft, segment.text, self.config.repeat_overlap), "repeat"),
            (phrase_loop_at(self.context.draft, segment.text), "phrase loop")) if at is not None]
        return min(cuts) if cuts else None

    def unsupported(self, segment: Segment) -> list[str] | None:
        """The sentences of `segment` no passage it could see supports (cosine below
        `support_threshold`); None where nothing is checked (check off, no passage, no sentence)."""
        if not self.config.check_support or self.embed is None or not segment.context_ids:
            return None
        sentences = split_sentences(self.clean(segment.text))
        ids = set(segment.context_ids)
        passages = [h for h in self.context.seen_passages if h.chunk_id in ids]
        if not sentences or not passages:
            return None
        vectors = self.embed(sentences + [f"{h.title}. {h.text}" for h in passages])
        sims = vectors[: len(sentences)] @ vectors[len(sentences):].T
        return [s for s, row in zip(sentences, sims) if float(row.max()) < self.config.support_threshold]

    def ground_fault(self, rewrite: Segment) -> str:
        """Why a grounded rewrite does not replace the last kept segment ("" when it does): it is
        empty, repeats the answer before that segment, or is not supported by its passages either."""
        if not self.clean(rewrite.text):
            return "the grounded rewrite is empty"
        before = self.context.draft_parts()[:-1]  # the original is the last part (`grounding_pieces`)
        accepted = split_sentences(self.clean("".join(text for text, _ in before)))
        if accepted and ngram_overlap(rewrite.text, accepted) >= self.config.repeat_overlap:
            return "the grounded rewrite repeats accepted text"
        unsupported = self.unsupported(rewrite)
        if unsupported:
            return f"the grounded rewrite is not supported either: {' '.join(unsupported)!r}"
        return "" if unsupported is not None else "the grounded rewrite could not be checked"

    def check_support(self, rounds: Sequence[RoundTrace]) -> None:
        """`controller.check_support`: the kept segment's sentences against the passages it saw."""
        # a grounded rewrite is checked as it is made; a repeat cut ends the answer
        if rounds[-1].kept in (Kept.SEGMENT, Kept.SET_ASIDE) and (kept := kept_segment(rounds)) is not None:
            rounds[-1].unsupported = self.unsupported(kept) or []

    def ending(self, answer: str) -> tuple[str, str]:
        """`controller.end_on_sentence`: (the answer up to its last whole sentence, the cut text)."""
        whole = whole_sentences(answer) if self.config.end_on_sentence else answer
        if not whole.strip() or whole == answer:
            return answer, ""
        return whole, answer[len(whole):].strip()

    def short_answer(self, question: str, answer: str) -> str:
        """`controller.short_answer`: extracted from the answer, or asked of the model."""
        mode = self.config.short_answer
        if mode == "none" or not answer.strip():
            return ""
        if mode == "ask":
            short = parse_short_reply(self.generator.generate(ask_prompt(question, answer), max_new_tokens=32))
            if short:
                return short
        return extract_answer(answer, question)
