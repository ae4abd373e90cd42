"""Labelling rules, agreement, and the label builder on a scripted generator."""

from __future__ import annotations

import pytest

from rigkit.errors import InputError
from rigkit.testing import ScriptedGenerator, make_segment
from rigkit.trace import Hit, RIGResult, RoundTrace
from rigkit.trigger.labels import (
    agreement,
    answer_gain,
    build_labels,
    label_question,
    unsupported_facts,
)
from rigkit.trigger.labelset import LabelledSegment, LabelSet

RECORD = {
    "id": "q1",
    "question": "Who directed Free Guy?",
    "answer": "Shawn Levy",
    "type": "compositional",
    "paragraphs": [
        {"pid": "p1", "title": "Free Guy", "text": "Free Guy is a 2021 film directed by Shawn Levy.",
         "is_supporting": True},
        {"pid": "p2", "title": "Other", "text": "Martin Scorsese was born in 1942.", "is_supporting": False},
    ],
}


def _result(*texts: str) -> RIGResult:
    from rigkit.trace import Decision

    rounds = [RoundTrace(i, make_segment(t), Decision(False, 0.0, "")) for i, t in enumerate(texts)]
    return RIGResult(question=RECORD["question"], answer=" ".join(texts), rounds=rounds)


def test_unsupported_facts_ignore_question_and_gold_mentions():
    gold = [Hit("p1", "p1", "Free Guy", RECORD["paragraphs"][0]["text"], 1.0)]
    assert unsupported_facts("It was directed by Shawn Levy in 2021.", RECORD["question"], gold) == []
    found = unsupported_facts("It was directed by Martin Scorsese in 1942.", RECORD["question"], gold)
    assert "Martin Scorsese" in found and "1942" in found  # only a distractor mentions them


def test_answer_gain():
    assert answer_gain("It was Martin Scorsese.", "Shawn Levy directed it.", ["Shawn Levy"])["gain"]
    assert not answer_gain("Shawn Levy.", "Shawn Levy directed it.", ["Shawn Levy"])["gain"]
    assert not answer_gain("No idea.", "No idea either.", ["Shawn Levy"])["gain"]


def test_label_question_applies_both_rules():
    closed = _result("Free Guy is a film.", "It was directed by Martin Scorsese in 1942.")
    rows = label_question(RECORD, closed, _result("Shawn Levy directed it."), rule="r2")
    assert [r.rules["r1"] for r in rows] == [1, 1]  # the closed answer is wrong, the gold one right
    assert [r.rules["r2"] for r in rows] == [0, 1]
    assert [r.label for r in rows] == [0, 1] and rows[1].info["unsupported"]
    assert rows[0].logprobs and rows[0].tokens and rows[0].qid == "q1"
    assert [r.rules["any"] for r in rows] == [1, 1] and [r.rules["all"] for r in rows] == [0, 1]


def test_agreement_kappa_and_undefined_case():
    def rows(pairs):
        return LabelSet([LabelledSegment("q", "", "t", a, rules={"r1": a, "r2": b}) for a, b in pairs])

    report = agreement(rows([(1, 1), (0, 0), (1, 0), (0, 0)]))
    assert report["percent_agree"] == 75.0 and report["cohen_kappa"] == pytest.approx(0.5)
    assert agreement(rows([(0, 0), (0, 0)]))["cohen_kappa"] is None  # both constant: undefined


def test_build_labels_with_scripted_generator(tmp_path):
    records = [RECORD, {**RECORD, "id": "q2", "question": "Which year was Free Guy released?",
                        "answer": "2021"}]
    gen = ScriptedGenerator([
        make_segment("It was directed by Martin Scorsese.", finish_reason="end_of_turn"),  # q1 closed
        make_segment("Shawn Levy.", finish_reason="end_of_turn"),  # q1 with gold paragraphs
        make_segment("It came out in 2021.", finish_reason="end_of_turn"),  # q2 closed
        make_segment("2021.", finish_reason="end_of_turn"),  # q2 with gold paragraphs
    ])
    labels = build_labels(records, gen, rule="any", progress=False)
    assert [r.qid for r in labels.rows] == ["q1", "q2"]
    assert [r.label for r in labels.rows] == [1, 0]
    assert labels.meta["rule"] == "any" and labels.meta["data_hash"].startswith("ids-sha256:")
    assert labels.meta["generator"] == "ScriptedGenerator" and labels.rows[0].hidden is None
    # the gold run saw the supporting paragraph in its prompt, the closed-book run did not
    prompts = ["".join(p.text for p in prompt) for prompt in gen.prompts]
    assert "Shawn Levy" not in prompts[0] and "Shawn Levy" in prompts[1]


def test_build_labels_rejects_unknown_rule():
    with pytest.raises(InputError, match="unknown labelling rule"):
        build_labels([RECORD], ScriptedGenerator([]), rule="r9", progress=False)


class _Crashing(ScriptedGenerator):
    def next_segment(self, prompt, stop, max_new_tokens, on_token=None):
        if not self.segments:
            raise RuntimeError("killed")
        return super().next_segment(prompt, stop, max_new_tokens, on_token)


def test_checkpoint_then_resume_skips_done_questions(tmp_path):
    from rigkit.trigger.labels import resumable
    from rigkit.trigger.labelset import load_labels

    qa = tmp_path / "qa.jsonl"
    second = {**RECORD, "id": "q2", "question": "Which year was Free Guy released?", "answer": "2021"}
    import json

    qa.write_text("\n".join(json.dumps(r) for r in (RECORD, second)) + "\n", encoding="utf-8")
    out = tmp_path / "labels.jsonl"
    gen = _Crashing([make_segment("It was Martin Scorsese.", finish_reason="end_of_turn"),
                     make_segment("Shawn Levy.", finish_reason="end_of_turn")])
    gen.spec = "scripted"
    with pytest.raises(RuntimeError, match="killed"):  # a crash during the second question
        build_labels(qa, gen, progress=False, checkpoint=out)
    partial = load_labels(out)
    assert partial.meta["complete"] is False and partial.meta["done_qids"] == ["q1"]
    resume = resumable(out, qa, gen)
    assert resume is not None and len(resume) == 1
    gen2 = ScriptedGenerator([make_segment("It came out in 2021.", finish_reason="end_of_turn"),
                              make_segment("2021.", finish_reason="end_of_turn")])
    gen2.spec = "scripted"
    full = build_labels(qa, gen2, progress=False, checkpoint=out, resume=resume)
    assert [r.qid for r in full.rows] == ["q1", "q2"] and full.meta["complete"]
    assert len(gen2.prompts) == 2  # only q2 was generated again
    gen2.spec = "another-model"
    assert resumable(out, qa, gen2) is None
