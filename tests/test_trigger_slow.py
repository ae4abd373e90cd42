"""The trigger pipeline with the real default model on one question (slow: loads SmolLM2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest_trigger import synthetic_labels

pytestmark = pytest.mark.slow
QA = Path(__file__).resolve().parents[1] / "data" / "2wikimultihopqa" / "qa.jsonl"


@pytest.fixture(scope="module")
def generator():
    from rigkit.generation.loading import load_generator

    return load_generator("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def config():
    from rigkit.config import load_config

    root = Path(__file__).resolve().parents[1]
    return load_config(root / "configs" / "cpu.yaml").override(generator={"max_answer_tokens": 32})


def test_real_labels_then_classifier_in_the_controller(generator, config, tmp_path):
    from rigkit.build import build_controller
    from rigkit.testing import DictRetriever
    from rigkit.trigger import (
        build_labels,
        load_labels,
        save_trigger,
        train_trigger,
        trigger_decider,
    )

    labels = build_labels(QA, generator, config, limit=1, progress=False)
    assert labels.meta["generator"] == generator.spec and labels.meta["data_hash"].startswith("sha256:")
    assert {r.qid for r in labels.rows} and all(r.tokens and r.logprobs for r in labels.rows)
    width = generator.model.config.hidden_size
    assert all(len(r.hidden) == width for r in labels.rows)
    assert all(set(r.rules) == {"r1", "r2", "any", "all"} for r in labels.rows)
    back = load_labels(labels.save(tmp_path / "labels.jsonl"))
    assert len(back) == len(labels)

    # One question cannot hold both classes: pad with synthetic rows of the same width.
    train_set = synthetic_labels(30, hidden_dim=width)
    train_set.rows += back.rows
    train_set.meta["generator"] = generator.spec
    model = train_trigger(train_set, features=("probability", "hidden"))
    path = save_trigger(model, tmp_path / "trigger.skops")

    decider = trigger_decider(path, generator=generator)
    controller = build_controller(config, generator=generator, retriever=DictRetriever({}))
    controller.decider = decider
    result = controller.run(labels.rows[0].question)
    scores = [r.decision.score for r in result.rounds]
    assert scores and all(0.0 <= s <= 1.0 for s in scores)
    assert {r.decision.decider for r in result.rounds} == {"classifier"}
