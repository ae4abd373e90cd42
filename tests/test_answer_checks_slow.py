"""The demo question with the real default model: retrieval makes the answer better, not worse (slow).

Before the answer checks, the regenerated NOTICE sentence wrote earlier sentences over again, the
NOTICE requirement was lost, two sentences were repeated and the answer stopped mid-sentence.
"""

from __future__ import annotations

import pytest

from rigkit.build import build_controller
from rigkit.config import load_config
from rigkit.guards import repeated_sentence, whole_sentences
from rigkit.text import split_sentences, strip_citations
from rigkit.trace import Action, RIGResult

pytestmark = pytest.mark.slow

DEMO = "Can I use code under the Apache-2.0 licence in a commercial product, and what must I include when I ship it?"


def test_the_demo_answer_keeps_the_notice_requirement_and_repeats_nothing(default_generator, demo_retriever):
    controller = build_controller(load_config("configs/cpu.yaml", decider={"name": "prob"}),
                                  default_generator, demo_retriever)
    result = controller.run(DEMO)
    assert "NOTICE" in result.answer
    sentences = split_sentences(result.answer)
    assert all(repeated_sentence(s, sentences[:i]) is None for i, s in enumerate(sentences))
    plain = strip_citations(result.answer)
    assert whole_sentences(plain) == plain
    # the second hop found the NOTICE passage; the rewrite did not earn its place
    assert any(r.action is Action.FALLBACK for r in result.rounds)
    notice = next(a for a in result.attributions if "NOTICE" in a.text)
    assert "demo-apache-notice#0" in notice.visible  # written after the NOTICE passage
    assert result.short_answer
    assert RIGResult.from_json(result.to_json()) == result
