"""The published baselines with the real default model: `always` keeps each sentence (slow)."""

from __future__ import annotations

import pytest

from rigkit.build import build_controller
from rigkit.config import load_config

pytestmark = pytest.mark.slow

DEMO_QUESTION = ("Can I use code under the Apache-2.0 licence in a commercial product, "
                 "and what must I include when I ship it?")


def test_always_retrieves_after_three_different_sentences(default_generator, demo_retriever):
    config = load_config("configs/cpu.yaml", decider={"name": "always"}, controller={"max_rounds": 3},
                         generator={"max_answer_tokens": 160})
    result = build_controller(config, default_generator, demo_retriever).run(DEMO_QUESTION)
    fired = [r for r in result.rounds if r.query is not None]
    assert result.policy == "continue"
    assert len(fired) == 3 and result.used_retrieval_times == 3, [r.segment.text for r in result.rounds]
    texts = [r.segment.text.strip() for r in fired]
    assert len(set(texts)) == 3  # three different sentences, each kept
    assert all(r.action == "continue" for r in fired)
    assert not result.errors
