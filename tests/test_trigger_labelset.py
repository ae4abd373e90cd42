"""Labelled sets: save/load round trip, bring-your-own CSV/JSONL, clear errors."""

from __future__ import annotations

import json

import pytest

from rigkit.errors import InputError
from rigkit.trigger.labelset import LabelSet, load_labels
from tests.conftest_trigger import synthetic_labels


def test_round_trip_keeps_rows_and_meta(tmp_path):
    labels = synthetic_labels(5, hidden_dim=4)
    path = labels.save(tmp_path / "labels.jsonl")
    first = json.loads(path.read_text().splitlines()[0])
    assert first["_meta"]["generator"] == "scripted" and first["_meta"]["format"] == 1
    back = load_labels(path)
    assert len(back) == len(labels) and back.rule == "any"
    assert [r.label for r in back.rows] == [r.label for r in labels.rows]
    assert back.rows[1].logprobs == pytest.approx(labels.rows[1].logprobs, rel=1e-5)
    assert back.rows[1].hidden == pytest.approx(labels.rows[1].hidden, rel=1e-5)
    assert [p.name for p in tmp_path.iterdir()] == ["labels.jsonl"]  # no temp file left behind


def test_relabel_uses_stored_verdicts():
    labels = synthetic_labels(3)
    labels.rows[0].rules["r2"] = 1 - labels.rows[0].rules["r2"]
    other = labels.relabel("r2")
    assert other.rule == "r2" and other.rows[0].label == labels.rows[0].rules["r2"]
    with pytest.raises(InputError, match="stored rules"):
        labels.relabel("nope")


def test_bring_your_own_csv(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("text,label,question\nThe statute of 1998 applies.,1,Which law?\n"
                    "Thank you.,no,\n\"Dose, 5 mg\",TRUE,What dose?\n", encoding="utf-8")
    labels = load_labels(path)
    assert [r.label for r in labels.rows] == [1, 0, 1]
    assert labels.rows[2].text == "Dose, 5 mg" and labels.rows[0].question == "Which law?"
    assert labels.rule == "user" and labels.meta["data_hash"].startswith("sha256:")
    assert len({r.qid for r in labels.rows}) == 3  # each row its own group without a qid column
    assert not labels.rows[0].has_token_evidence


def test_bring_your_own_jsonl_with_qid(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"text": "a", "label": 1, "qid": "x"}, {"text": "b", "label": 0, "qid": "x"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    labels = load_labels(path)
    assert {r.qid for r in labels.rows} == {"x"} and labels.positives == 1


@pytest.mark.parametrize(
    "body, message",
    [("text,label\nfine,maybe\n", r"mine.csv:2: label 'maybe'"),
     ("words,label\nx,1\n", "needs columns 'text' and 'label'")],
)
def test_bad_tables_name_the_line(tmp_path, body, message):
    path = tmp_path / "mine.csv"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(InputError, match=message):
        load_labels(path)


def test_missing_file_is_input_error(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_labels(tmp_path / "none.jsonl")


def test_empty_set_saves(tmp_path):
    path = LabelSet([], {"rule": "r1"}).save(tmp_path / "sub" / "e.jsonl")
    assert len(load_labels(path)) == 0


def test_saved_files_get_ordinary_permissions(tmp_path):
    import os
    import stat

    from rigkit.files import default_mode

    path = synthetic_labels(2).save(tmp_path / "l.jsonl")
    assert stat.S_IMODE(os.stat(path).st_mode) == default_mode()
