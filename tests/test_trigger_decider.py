"""The classifier decider on hand-written segments, with a small model trained in the test."""

from __future__ import annotations

import pytest

from rigkit.deciders.base import DecisionState
from rigkit.deciders.classifier import DEFAULT_THRESHOLD, ClassifierDecider
from rigkit.errors import InputError, RigkitError
from rigkit.testing import make_segment
from rigkit.trigger import trigger_decider
from rigkit.trigger.model import save_trigger, train_trigger
from tests.conftest_trigger import HashEmbedder, synthetic_labels

CONFIDENT = make_segment("The answer is clear.", [0.95, 0.9, 0.92, 0.97])
INVENTED = make_segment("It was directed by Zoltan Brkic in 1931.", [0.9, 0.8, 0.7, 0.6, 0.08, 0.05, 0.5, 0.04])


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    model = train_trigger(synthetic_labels(40), features=("probability", "embedding"), embedder=HashEmbedder())
    return save_trigger(model, tmp_path_factory.mktemp("trigger") / "trigger.skops"), model


def test_decides_on_hand_written_segments(model_file):
    path, model = model_file
    decider = trigger_decider(path, embedder=HashEmbedder())
    state = DecisionState(question="Who directed the film?")
    low, high = decider.decide(CONFIDENT, state), decider.decide(INVENTED, state)
    assert 0.0 <= low.score <= 1.0 and 0.0 <= high.score <= 1.0
    assert high.score > low.score and high.retrieve and not low.retrieve
    assert high.decider == "classifier" and high.threshold == pytest.approx(model.threshold)
    assert high.evidence["threshold_source"] == "model file (dev)"
    # the low-probability content tokens become spans, so the masked query can drop them
    assert {s.text for s in high.spans} >= {"Zoltan", "Brkic", "1931."}
    assert "threshold" in high.reason


def test_explicit_threshold_wins(model_file):
    """A given threshold flips the file's decisions both ways, not just restates the rule."""
    path, _ = model_file
    state = DecisionState(question="q")
    by_file = trigger_decider(path, embedder=HashEmbedder())
    low, high = by_file.decide(CONFIDENT, state), by_file.decide(INVENTED, state)
    assert high.retrieve and not low.retrieve and 0.0 < low.score < high.score < 1.0
    strict_at, lenient_at = (high.score + 1.0) / 2, low.score / 2
    strict = trigger_decider(path, threshold=strict_at, embedder=HashEmbedder())
    lenient = trigger_decider(path, threshold=lenient_at, embedder=HashEmbedder())
    assert not strict.decide(INVENTED, state).retrieve  # fired at the file's threshold
    assert lenient.decide(CONFIDENT, state).retrieve  # stayed quiet at the file's threshold
    decision = strict.decide(INVENTED, state)
    assert decision.threshold == pytest.approx(strict_at) and decision.score == pytest.approx(high.score)
    assert strict.threshold_source == lenient.threshold_source == "given"


def test_file_without_threshold_uses_default(model_file):
    _, model = model_file
    model.threshold, saved = None, model.threshold
    try:
        decider = trigger_decider(model, embedder=HashEmbedder())
    finally:
        model.threshold = saved
    assert decider.threshold == DEFAULT_THRESHOLD and decider.threshold_source == "default"


def test_empty_segment_does_not_retrieve(model_file):
    decision = trigger_decider(model_file[0], embedder=HashEmbedder()).decide(
        make_segment(""), DecisionState(question="q")
    )
    assert not decision.retrieve and decision.score == 0.0


def test_needs_a_model_file():
    with pytest.raises(InputError, match="--trigger-model"):
        ClassifierDecider()


def test_registry_builds_it_from_config(model_file):
    from rigkit.build import build_decider
    from rigkit.config import DeciderConfig

    decider = build_decider(
        DeciderConfig(name="classifier", trigger_model=str(model_file[0]), threshold=0.3,
                      params={"embedder": HashEmbedder()})
    )
    assert isinstance(decider, ClassifierDecider) and decider.threshold == 0.3


class _Gen:
    spec = "scripted"

    def __init__(self):
        self.calls = 0

    def segment_hidden_state(self, segment):
        self.calls += 1
        return [2.0, 2.0, 2.0, 2.0] if "invented" in segment.text else [-2.0] * 4


def test_hidden_probe_reads_the_state_generator(tmp_path):
    model = train_trigger(synthetic_labels(30, hidden_dim=4), features=("hidden",))
    path = save_trigger(model, tmp_path / "h.skops")
    decider = trigger_decider(path)
    gen = _Gen()
    state = DecisionState(question="q", generator=gen)
    yes = decider.decide(make_segment("an invented fact"), state)
    no = decider.decide(make_segment("plain words"), state)
    assert yes.score > no.score and gen.calls == 2
    with pytest.raises(RigkitError, match="cannot produce"):
        decider.decide(make_segment("x"), DecisionState(question="q", generator=None))
