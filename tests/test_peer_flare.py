"""The `prob` decider and the masked query against FLARE's own code (tests/peers/flare_query.py).

FLARE (Jiang et al., 2023) writes a look-ahead sentence, retrieves when any of its tokens has
probability at or below θ (`look_ahead_filter_prob`), and searches for the sentence with the
tokens at or below β (`look_ahead_mask_prob`) masked out. Both sides read the same tokens and
log-probabilities (FLARE takes `np.exp` of them, as its completion code does), drawn from a fixed
seed. The tests named `test_departure_*` show, each on one sentence, where rigkit differs on
purpose and why.
"""

from __future__ import annotations

import math
import random
import re

import numpy as np
import pytest

from rigkit.deciders import ProbabilityDecider
from rigkit.deciders.base import DecisionState
from rigkit.queries import MaskedQuery
from rigkit.text import is_stop
from rigkit.trace import Segment
from tests.peers.flare_query import ApiReturn

# Content words (none is a stop word), one token each, as a tokenizer with leading spaces has them.
WORDS = ("Eiffel Tower Paris iron lattice engineer Gustave completed March 1889 height metres "
         "visitors world fair Seine Champ Mars tallest structure radio antenna painted bronze "
         "Montmartre Louvre museum Napoleon river bridge granite").split()
THETA = 0.4


def _segment(tokens: list[str], logprobs: list[float]) -> Segment:
    return Segment(text="".join(tokens), tokens=tokens, token_ids=list(range(len(tokens))), logprobs=logprobs)


def _flare(tokens: list[str], logprobs: list[float]) -> ApiReturn:
    """FLARE's completion object for the look-ahead: probabilities as `np.exp` of the log-probs."""
    text = "".join(tokens)
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    return ApiReturn(prompt="", text=text, tokens=tokens, probs=[np.exp(lp) for lp in logprobs], offsets=offsets)


def flare_masked_tokens(tokens: list[str], logprobs: list[float], mask_prob: float) -> list[int]:
    """The tokens FLARE's `use_as_query` masks out: run it on index tags in place of the tokens."""
    tags = [f" <{i}>" for i in range(len(tokens))]
    kept = _flare(tags, logprobs).use_as_query(mask_prob=mask_prob, mask_method="simple")
    kept_ids = {int(i) for i in re.findall(r"<(\d+)>", kept)}
    return [i for i in range(len(tokens)) if i not in kept_ids]


def flare_retrieves(tokens: list[str], logprobs: list[float], theta: float) -> bool:
    return _flare(tokens, logprobs).use_as_query(low_prob=theta) != ""


def flare_query(tokens: list[str], logprobs: list[float], theta: float, beta: float) -> str:
    return _flare(tokens, logprobs).use_as_query(low_prob=theta, mask_prob=beta, mask_method="simple")


def rigkit_query(segment: Segment, decision, include_question: bool = False, question: str = "") -> str:
    decision.segment_text = segment.text  # the controller sets it
    return MaskedQuery(include_question).build(question, "", decision).text


def _spaces(text: str) -> str:
    return " ".join(text.split())


def sentences(count: int = 200, seed: int = 36) -> list[tuple[list[str], list[float]]]:
    """Sentences of distinct content words; half of them confident throughout (p >= 0.85), half
    with probabilities spread over (0.02, 1)."""
    rng = random.Random(seed)
    out = []
    for n in range(count):
        words = rng.sample(WORDS, rng.randint(4, 12))
        tokens = [words[0]] + [" " + w for w in words[1:]]
        low = 0.85 if n % 2 else 0.02
        logprobs = [math.log(rng.uniform(low, 1.0)) for _ in tokens]
        out.append((tokens, logprobs))
    return out


def test_the_vocabulary_is_content_words():
    assert not [w for w in WORDS if is_stop(w)]


@pytest.mark.parametrize("theta", [0.2, THETA, 0.8])
def test_prob_flags_the_tokens_flare_flags(theta):
    """Same retrieve / no-retrieve verdict, and the flagged tokens are the ones FLARE masks with
    β = θ, on 200 sentences from seed 36."""
    decider = ProbabilityDecider(theta)
    retrieved = 0
    for tokens, logprobs in sentences():
        decision = decider.decide(_segment(tokens, logprobs), DecisionState(question=""))
        assert decision.retrieve == flare_retrieves(tokens, logprobs, theta)
        assert decision.evidence["low_tokens"] == flare_masked_tokens(tokens, logprobs, theta)
        retrieved += decision.retrieve
    assert 20 < retrieved < 200  # both verdicts are exercised


def test_masked_query_is_flares_masked_query():
    """With β = θ the masked query is FLARE's, up to runs of spaces (FLARE leaves one space per
    masked token; a search engine reads both alike)."""
    decider = ProbabilityDecider(THETA)
    compared = 0
    for tokens, logprobs in sentences():
        decision = decider.decide(_segment(tokens, logprobs), DecisionState(question=""))
        if not decision.retrieve or len(decision.evidence["low_tokens"]) == len(tokens):
            continue  # no query; all masked: see test_departure_all_masked_searches_the_question
        ours = rigkit_query(_segment(tokens, logprobs), decision)
        assert ours == _spaces(flare_query(tokens, logprobs, THETA, THETA))
        compared += 1
    assert compared > 50


def test_departure_stop_words_and_punctuation_never_trigger():
    """FLARE counts every token; rigkit skips stop words and punctuation: a 135M model is often
    unsure between "the" and "a", which says nothing about a missing fact."""
    tokens = ["Gustave", " designed", " the", " tower", "."]
    logprobs = [math.log(p) for p in (0.9, 0.9, 0.1, 0.9, 0.2)]
    assert flare_retrieves(tokens, logprobs, THETA)
    decision = ProbabilityDecider(THETA).decide(_segment(tokens, logprobs), DecisionState(question=""))
    assert not decision.retrieve and decision.evidence["low_tokens"] == []


def test_departure_a_flagged_piece_masks_its_whole_word():
    """FLARE masks the uncertain token only, which can leave half a word ("Mont" of
    "Montmartre"); rigkit widens the mask to the whole word."""
    tokens = ["Louvre", " faces", " Mont", "martre"]
    logprobs = [math.log(p) for p in (0.9, 0.9, 0.9, 0.1)]
    assert _spaces(flare_query(tokens, logprobs, THETA, THETA)) == "Louvre faces Mont"
    decision = ProbabilityDecider(THETA).decide(_segment(tokens, logprobs), DecisionState(question=""))
    assert rigkit_query(_segment(tokens, logprobs), decision) == "Louvre faces"


def test_departure_one_threshold_triggers_and_masks():
    """FLARE's configs trigger at θ and mask at a lower β (2WikiMultihopQA: θ 0.8, β 0.4);
    rigkit masks exactly what triggered (β = θ), so the query drops every word it doubts."""
    tokens = ["Gustave", " completed", " Eiffel", " Tower", " March", " 1889"]
    logprobs = [math.log(p) for p in (0.95, 0.6, 0.95, 0.95, 0.3, 0.5)]
    decision = ProbabilityDecider(0.8).decide(_segment(tokens, logprobs), DecisionState(question=""))
    ours = rigkit_query(_segment(tokens, logprobs), decision)
    assert _spaces(flare_query(tokens, logprobs, 0.8, 0.4)) == "Gustave completed Eiffel Tower 1889"
    assert ours == _spaces(flare_query(tokens, logprobs, 0.8, 0.8)) == "Gustave Eiffel Tower"


def test_departure_a_token_exactly_at_the_threshold():
    """FLARE flags p <= θ; rigkit flags p < θ, so `score > 1 - θ` is exactly `retrieve`."""
    tokens = ["Seine", " bridge"]
    logprobs = [math.log(0.9), math.log(0.25)]
    assert flare_retrieves(tokens, logprobs, 0.25)
    assert not ProbabilityDecider(0.25).decide(_segment(tokens, logprobs), DecisionState(question="")).retrieve


def test_departure_all_masked_searches_the_question():
    """When every token is masked FLARE's query is empty; rigkit searches the question instead."""
    tokens = ["Napoleon", " granite"]
    logprobs = [math.log(0.1), math.log(0.1)]
    assert flare_query(tokens, logprobs, THETA, THETA) == ""
    decision = ProbabilityDecider(THETA).decide(_segment(tokens, logprobs), DecisionState(question=""))
    decision.segment_text = "".join(tokens)
    query = MaskedQuery(False).build("Who built the tomb?", "", decision)
    assert (query.text, query.mode, query.fallback_from) == ("Who built the tomb?", "question", "masked")


def test_departure_the_question_key_terms_lead_the_query():
    """FLARE searches the look-ahead alone (`only_use_look_ahead`) or after the whole question;
    rigkit's default (`query.include_question`) puts the question's key terms the masked sentence
    does not already name in front of it."""
    tokens = ["Gustave", " completed", " Eiffel", " Tower", " March"]
    logprobs = [math.log(p) for p in (0.95, 0.95, 0.95, 0.95, 0.1)]
    decision = ProbabilityDecider(THETA).decide(_segment(tokens, logprobs), DecisionState(question=""))
    alone = rigkit_query(_segment(tokens, logprobs), decision)
    assert alone == _spaces(flare_query(tokens, logprobs, THETA, THETA)) == "Gustave completed Eiffel Tower"
    led = rigkit_query(_segment(tokens, logprobs), decision, include_question=True,
                       question="When was the Eiffel Tower opened to visitors?")
    assert led.endswith(alone) and "visitors" in led.split()[: -len(alone.split())]
