"""The deciders on the real default model (SmolLM2-135M-Instruct): slow, run by `make test`."""

from __future__ import annotations

import math

import pytest

from rigkit.deciders import EntropyDecider, ProbabilityDecider
from rigkit.deciders.base import DecisionState
from rigkit.queries import AttentionQuery, MaskedQuery
from rigkit.text import mentions

# A film that does not exist: whatever director the model names, it invents.
QUESTION = "Who directed the 1931 Hungarian film Nightfall over Budapest?"


@pytest.fixture(scope="module")
def generated():
    from rigkit.generation.loading import load_generator
    from rigkit.transcript import Piece, StopRule

    gen = load_generator()
    gen.reset()
    prompt = [Piece(gen.render_chat([{"role": "user", "content": QUESTION}], True))]
    segment = gen.next_segment(prompt, StopRule(), 32)
    return gen, segment


@pytest.mark.slow
def test_prob_fires_on_invented_answer_and_masked_query_drops_it(generated):
    gen, segment = generated
    decision = ProbabilityDecider().decide(segment, DecisionState(QUESTION, generator=gen))
    decision.segment_text = segment.text
    assert decision.retrieve, (segment.text, decision.reason)
    assert decision.spans, decision.reason  # the loops below must have something to check
    probs = [math.exp(lp) for lp in segment.logprobs]
    for span in decision.spans:
        assert segment.text[span.char_start : span.char_end] == span.text
        assert min(probs[span.start : span.end]) < 0.3  # every span holds a low-p token
    query = MaskedQuery().build(QUESTION, "", decision)
    assert query.mode == "masked" and query.text
    for span in decision.spans:  # the invented words are gone (unless the question had them)
        if not mentions(QUESTION, span.text):
            assert not mentions(query.text, span.text), (span.text, query.text)
    kept = [w for w in segment.text.split() if mentions(query.text, w.strip(".,"))]
    assert kept, "the masked query keeps the confident part of the sentence"


@pytest.mark.slow
def test_entropy_uses_the_models_attention(generated):
    gen, segment = generated
    segment.attention = None
    decision = EntropyDecider().decide(segment, DecisionState(QUESTION, generator=gen))
    assert decision.extra_forward_passes == 1 and decision.evidence["attention"]
    n = len(segment.tokens)
    assert n >= 2  # a one-token segment has no attention pattern to speak of
    assert len(segment.attention) == n and all(len(row) == n for row in segment.attention)
    assert 0.0 <= decision.score <= 1.0
    words = decision.evidence["attended_words"]
    assert words  # otherwise the check below is vacuous
    assert all(mentions(segment.text, w) for w in words)
    decision.segment_text = segment.text
    query = AttentionQuery().build(QUESTION, "", decision)
    assert query.text and query.mode in ("attention", "masked")
