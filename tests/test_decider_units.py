"""What `rigkit ask` shows: each decider declares its default threshold and unit, the round log
prints score and cut on one scale with the threshold in the decider's unit beside them, and text
written after a take-back starts its own line."""

from __future__ import annotations

import inspect

import pytest

from rigkit.cli.ask import decision_scale
from rigkit.deciders import DECIDERS, default_threshold
from rigkit.deciders.base import DecisionState
from rigkit.deciders.entropy import EntropyDecider
from rigkit.deciders.probability import ProbabilityDecider
from rigkit.testing import make_segment


@pytest.mark.parametrize("name", [n for n in DECIDERS if n not in ("classifier",)])
def test_each_decider_declares_the_default_its_constructor_uses(name):
    value, unit = default_threshold(name)
    params = inspect.signature(DECIDERS[name]).parameters
    default = params["n"].default if name == "every_n" else params["threshold"].default
    assert value == default and (value is None) == (unit == "")


def test_the_classifier_declares_its_default_cut():
    assert default_threshold("classifier") == (0.7, "probability")


def test_the_round_log_reads_true_on_one_scale():
    segment = make_segment("Apache needs the NOTICE file", [0.9, 0.45, 0.9, 0.9, 0.9])
    decision = ProbabilityDecider(0.3).decide(segment, DecisionState(question="q"))
    assert decision_scale(decision) == "score=0.55 cut=0.70 (threshold 0.3 probability)"
    assert not decision.retrieve and decision.score < decision.score_threshold
    fired = ProbabilityDecider(0.5).decide(segment, DecisionState(question="q"))
    assert fired.retrieve and decision_scale(fired) == "score=0.55 cut=0.50 (threshold 0.5 probability)"


def test_a_decider_in_nats_shows_its_cut_on_the_score_scale():
    decision = EntropyDecider(threshold=2.0, use_attention=False).decide(
        make_segment("Apache needs the NOTICE file", entropies=[0.1, 0.1, 0.1, 3.0, 0.1]),
        DecisionState(question="q"))
    assert decision_scale(decision).endswith("cut=0.86 (threshold 2 nats)")
    assert decision.retrieve == (decision.score > decision.score_threshold)


def test_text_written_after_a_take_back_starts_its_own_line():
    import io

    from rigkit.cli.ask import _TokenPrinter
    from rigkit.streaming import StreamEvent

    out = io.StringIO()
    printer = _TokenPrinter(out)
    for event in (StreamEvent("token", "It needs XYZ."), StreamEvent("retract", "It needs XYZ."),
                  StreamEvent("token", "When you ship it, include NOTICE.")):
        printer(event)
    printer.end_line()
    assert out.getvalue().splitlines() == ["writing   It needs XYZ.  [taken back: 13 characters]",
                                           "writing   When you ship it, include NOTICE."]


def test_the_round_log_names_the_passages_a_fallback_left_unused():
    from rigkit.cli.ask import format_round
    from rigkit.trace import Action, Decision, RoundTrace, TokenBudget

    trace = RoundTrace(index=5, segment=make_segment("It allows any use."), decision=Decision(False, 0.1, "fine", decider="prob"),
                       action=Action.FALLBACK, fallback="the rewrite repeats accepted text",
                       unused={"demo-apache-notice#0": "the rewrite repeats accepted text: the sentence written before it is kept"},
                       budget=TokenBudget())
    lines = format_round(trace).splitlines()
    assert "fallback  the rewrite repeats accepted text" in lines
    assert "unused    [demo-apache-notice#0] the rewrite repeats accepted text: the sentence written before it is kept" in lines
