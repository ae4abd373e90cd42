"""`build-labels --split`: label the questions of chosen splits.json splits only."""

from __future__ import annotations

import json

import pytest

from rigkit.errors import InputError
from rigkit.testing import ScriptedGenerator, make_segment
from rigkit.trigger.labels import build_labels


def _qa(tmp_path, n: int = 5):
    records = [{"id": f"q{i}", "question": f"Who directed film number {i}?", "answer": "Shawn Levy",
                "paragraphs": [{"pid": f"p{i}", "title": "Film", "is_supporting": True,
                                "text": f"Film number {i} was directed by Shawn Levy."}]}
               for i in range(n)]
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (tmp_path / "splits.json").write_text(json.dumps({"train": ["q0", "q1"], "dev": ["q2"], "test": ["q3", "q4"]}))
    return qa


def _generator(questions: int) -> ScriptedGenerator:
    gen = ScriptedGenerator([make_segment("It was Martin Scorsese.", finish_reason="end_of_turn")] * (2 * questions))
    gen.spec = "scripted"
    return gen


def test_labels_only_the_chosen_splits(tmp_path):
    qa = _qa(tmp_path)
    labels = build_labels(qa, _generator(3), progress=False, splits=("train", "dev"))
    assert sorted({r.qid for r in labels.rows}) == ["q0", "q1", "q2"]
    assert labels.meta["splits"] == ["train", "dev"] and labels.meta["questions"] == 3


def test_every_question_without_splits(tmp_path):
    labels = build_labels(_qa(tmp_path), _generator(5), progress=False)
    assert len({r.qid for r in labels.rows}) == 5


def test_unknown_split_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="unknown split"):
        build_labels(_qa(tmp_path), _generator(1), progress=False, splits=("validation",))


def test_a_limit_is_shared_among_the_chosen_splits_only(tmp_path):
    labels = build_labels(_qa(tmp_path), _generator(3), progress=False, splits=("train", "dev"), limit=3)
    assert sorted({r.qid for r in labels.rows}) == ["q0", "q1", "q2"]  # no quota lost to test
