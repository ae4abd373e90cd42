"""Every decider's spans keep one shape: offsets inside the segment, text == the sliced text,
sorted, non-overlapping; so the masked query removes exactly the flagged occurrences."""

from __future__ import annotations

import math

import pytest

from rigkit.config import QueryConfig
from rigkit.deciders import (
    AlwaysRetrieve,
    ClassifierDecider,
    CompositeDecider,
    EntityChecklist,
    EntropyDecider,
    EveryNTokens,
    KeywordDecider,
    MarkerDecider,
    NeverRetrieve,
    ProbabilityDecider,
)
from rigkit.deciders.base import DecisionState
from rigkit.queries import build_query_builder
from rigkit.testing import make_segment
from rigkit.trace import Segment


class FixedScorer:
    """A trained-model stand-in for the classifier decider: fixed probability, no features."""

    threshold, low_prob, needs_hidden, name, feature_sets = 0.5, 0.3, False, "fixed", ("probability",)

    def __init__(self, p=0.9):
        self.p = p

    def probability(self, question, segment, hidden):
        return self.p

    def check_generator(self, generator):
        return None


def tokens_segment(tokens, probs, finish="stop"):
    """A segment from explicit tokens (sub-word pieces allowed) and their probabilities."""
    return Segment(text="".join(tokens), tokens=list(tokens), token_ids=list(range(len(tokens))),
                   logprobs=[math.log(p) for p in probs], entropies=[-math.log(p) * 3 for p in probs],
                   finish_reason=finish)


YEARS = tokens_segment(["In", " 19", "3", "2", " and", " 198", "3", " it", " ran", "."],
                       [0.9, 0.9, 0.05, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9])
SEGMENTS = [
    make_segment("It was directed by Zoltan Brkic in 1931.", [0.9, 0.8, 0.7, 0.6, 0.08, 0.05, 0.5, 0.04]),
    make_segment("I'm not sure, but Zoltan Brkic won 3 awards in 1931 and 1983.",
                 [0.9, 0.2, 0.9, 0.1, 0.1, 0.1, 0.1, 0.9, 0.05, 0.9, 0.1, 0.1, 0.2]),
    make_segment("He asked <retrieve>Brkic birth year</retrieve> then wrote 1931.", [0.5] * 8),
    YEARS,
    make_segment(""),
]
DECIDERS = {
    "prob": ProbabilityDecider(0.3),
    "entropy": EntropyDecider(threshold=1.0),
    "keyword": KeywordDecider(),
    "marker": MarkerDecider(),
    "classifier": ClassifierDecider(FixedScorer()),
    "always": AlwaysRetrieve(),
    "every_n": EveryNTokens(4),
    "never": NeverRetrieve(),
    "composite": CompositeDecider([ProbabilityDecider(0.3), KeywordDecider(), MarkerDecider()], lazy=False),
    "entity+prob": EntityChecklist(ProbabilityDecider(0.3)),
}


@pytest.mark.parametrize("name", list(DECIDERS))
@pytest.mark.parametrize("index", range(len(SEGMENTS)))
def test_spans_satisfy_the_shared_invariants(name, index):
    segment = SEGMENTS[index]
    decision = DECIDERS[name].decide(segment, DecisionState("Who directed Nightfall, and when?",
                                                            tokens_since_retrieval=10))
    previous_end = 0
    for span in decision.spans:
        assert 0 <= span.char_start < span.char_end <= len(segment.text), span
        assert span.text == segment.text[span.char_start:span.char_end], span
        assert span.char_start >= previous_end, "spans are sorted and do not overlap"
        previous_end = span.char_end
        assert 0 <= span.start < span.end <= len(segment.tokens), span


def test_the_classifier_masks_exactly_the_flagged_occurrence():
    decision = ClassifierDecider(FixedScorer()).decide(YEARS, DecisionState("When did it run?"))
    decision.segment_text = YEARS.text
    assert [(s.text, s.char_start, s.char_end) for s in decision.spans] == [("1932", 3, 7)]
    query = build_query_builder(QueryConfig(mode="masked", include_question=False)).build(
        "When did it run?", "", decision)
    assert query.text == "In and 1983 it ran."
    assert "19 2" not in query.text and "198 " not in query.text


def test_classifier_spans_keep_neighbouring_words_apart():
    decision = ClassifierDecider(FixedScorer()).decide(SEGMENTS[0], DecisionState("q"))
    assert [s.text for s in decision.spans] == ["Zoltan", "Brkic", "1931."]
