"""The margin decider (TARG's top-1 minus top-2 gate): registered, content words only, its
score on the one [0, 1] scale, and margins from the real model's logits."""

from __future__ import annotations

import pytest

from rigkit.config import DeciderConfig
from rigkit.deciders import DECIDERS, MarginDecider, decider_from_config
from rigkit.deciders.base import DecisionState
from rigkit.testing import make_segment
from rigkit.trace import Segment

STATE = DecisionState(question="What does Apache-2.0 require?")


def test_registered_and_built_from_config_with_its_threshold():
    assert DECIDERS["margin"] is MarginDecider
    decider = decider_from_config(DeciderConfig(name="margin", threshold=0.2))
    assert isinstance(decider, MarginDecider) and decider.threshold == 0.2


def test_fires_on_a_content_token_whose_rivals_are_close_and_ignores_stop_words():
    segment = make_segment("Apache needs the NOTICE file", margins=[0.8, 0.7, 0.01, 0.05, 0.9])
    d = MarginDecider(0.1).decide(segment, STATE)
    assert d.retrieve and [s.text for s in d.spans] == ["NOTICE"]  # "the" (0.01) is a stop word
    assert d.score == pytest.approx(0.95) and d.score > d.score_threshold and d.unit == "probability margin"
    clear = MarginDecider(0.04).decide(segment, STATE)
    assert not clear.retrieve and clear.score == pytest.approx(0.95) and clear.score <= clear.score_threshold


def test_a_backend_without_margins_is_an_error_not_a_silent_pass():
    segment = Segment(text="Apache needs it", tokens=["Apache", " needs", " it"], logprobs=[-0.1] * 3)
    with pytest.raises(ValueError, match="top-1 minus top-2"):
        MarginDecider().decide(segment, STATE)


def test_the_real_model_gives_each_token_its_margin(default_generator):
    import torch

    from rigkit.transcript import StopRule

    ids = default_generator.tokenizer.encode("The licence is Apache", add_special_tokens=False)
    logits = torch.zeros(len(ids), default_generator.model.config.vocab_size)
    logits[0, 5], logits[0, 6] = 3.0, 3.0  # a tie: margin 0
    logits[1, 7] = 20.0  # one clear winner: margin near 1
    segment = default_generator._to_segment(ids, logits, StopRule(), len(ids))
    assert len(segment.margins) == len(segment.tokens)
    assert segment.margins[0] == pytest.approx(0.0, abs=1e-6) and segment.margins[1] > 0.99
