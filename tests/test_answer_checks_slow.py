"""The demo question with the real default model: retrieval makes the answer better, not worse (slow).

Before the answer checks, the regenerated NOTICE sentence wrote earlier sentences over again, the
NOTICE requirement was lost, two sentences were repeated and the answer stopped mid-sentence.
With `controller.rewrite_unsupported`, a sentence the in-loop support check flags is written
again under the strict grounding prompt.
"""

from __future__ import annotations

import pytest

from rigkit.build import build_controller
from rigkit.config import load_config
from rigkit.guards import repeated_sentence, whole_sentences
from rigkit.prompts import GROUNDING_INSTRUCTION
from rigkit.run_state import RunState
from rigkit.text import split_sentences, strip_citations
from rigkit.trace import Action, RIGResult, SearchRequest

pytestmark = pytest.mark.slow

DEMO = "Can I use code under the Apache-2.0 licence in a commercial product, and what must I include when I ship it?"


def test_the_demo_answer_keeps_the_notice_requirement_and_repeats_nothing(default_generator, demo_retriever):
    from rigkit.streaming import TokenStream
    from tests.test_serve_streaming import shown

    events = []
    controller = build_controller(load_config("configs/cpu.yaml", decider={"name": "prob"}),
                                  default_generator, demo_retriever, callbacks=[TokenStream(events.append)])
    result = controller.run(DEMO)
    # the streamed text (what `make demo` prints on its "writing" lines) shows each sentence once
    ever, screen = shown(events)
    streamed = [s.strip() for s in split_sentences(ever)]
    assert len(streamed) == len(set(streamed)), streamed
    assert screen == strip_citations(result.answer).replace("  ", " ").strip()
    assert "NOTICE" in result.answer
    sentences = split_sentences(result.answer)
    assert all(repeated_sentence(s, sentences[:i]) is None for i, s in enumerate(sentences))
    plain = strip_citations(result.answer)
    assert whole_sentences(plain) == plain
    # the second hop found the NOTICE passage; the rewrite did not earn its place
    assert any(r.action is Action.FALLBACK for r in result.rounds)
    notice = next(a for a in result.attributions if "NOTICE" in a.text)
    assert "demo-apache-notice#0" in notice.visible  # written after the NOTICE passage
    assert notice.cited == "demo-apache-notice#0"  # and it cites the passage it now rests on
    assert any(e.kind == "note" and e.text.startswith("kept the earlier sentence") for e in events)
    assert result.short_answer
    assert RIGResult.from_json(result.to_json()) == result


def test_with_rewrite_unsupported_a_flagged_sentence_is_written_again_under_the_strict_prompt(
        default_generator, demo_retriever, monkeypatch):
    prompts = []
    real = default_generator.next_segment

    def recording(prompt, *args, **kwargs):
        prompts.append(list(prompt))
        return real(prompt, *args, **kwargs)

    monkeypatch.setattr(default_generator, "next_segment", recording)
    config = load_config("configs/cpu.yaml", decider={"name": "prob"},
                         controller={"check_support": True, "rewrite_unsupported": True})
    controller = build_controller(config, default_generator, demo_retriever)
    run = controller.start(DEMO)
    while not run.rounds or run.rounds[-1].action is not Action.GROUND:  # up to the first grounded rewrite
        step = run.step()
        assert step is not None, "no sentence was flagged unsupported on the demo question"
        if isinstance(step, SearchRequest):
            run.search(demo_retriever)
    flagged, ground = run.rounds[-2], run.rounds[-1]
    assert flagged.unsupported and ground.decision.decider == "grounding"
    # the rewrite read the passages under the strict grounding instruction, without the flagged segment
    strict = prompts[-1][-1].text
    assert GROUNDING_INSTRUCTION["en"] in strict and "[[citation:demo-" in strict
    assert flagged.segment.text not in [p.text for p in prompts[-1] if p.role == "draft"]
    # kept only if supported: otherwise the flagged segment stays and the round says why
    draft = ground.draft
    if ground.fallback:
        assert ground.fallback.startswith("the grounded rewrite") and flagged.unsupported[0] in draft
    else:
        assert flagged.unsupported[0] not in draft
    saved = RunState.from_json(run.state().to_json())
    assert saved.rounds == run.rounds and saved.rounds[-1].action is Action.GROUND
