"""Trigger methodology: bootstrap intervals of each signal's AUCs, and the cross-set evaluation."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from rigkit.errors import InputError
from rigkit.trigger.evaluate import (
    bootstrap_intervals,
    cross_set,
    cross_set_table,
    evaluate_trigger,
    ranking_aucs,
)
from rigkit.trigger.labelset import LabelSet, load_labels
from rigkit.trigger.model import save_trigger, train_trigger
from tests.conftest_trigger import synthetic_labels
from tests.test_trigger_evaluate import _cli


def test_ranking_aucs_equal_sklearn_with_ties():
    from sklearn.metrics import average_precision_score, roc_auc_score

    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(200):
        n = int(rng.integers(3, 50))
        y = rng.integers(0, 2, n)
        if y.min() == y.max():
            continue
        s = np.round(rng.random(n), 1)  # many ties
        roc, ap = ranking_aucs(y, s)
        assert roc == pytest.approx(roc_auc_score(y, s), abs=1e-12)
        assert ap == pytest.approx(average_precision_score(y, s), abs=1e-12)
        checked += 1
    assert checked > 150


def test_bootstrap_resamples_questions_and_skips_one_class_draws():
    # two questions, one all positive and one all negative: a draw of the same question twice has
    # one class and no AUC, so about half the resamples are skipped
    y = [1, 1, 0, 0]
    groups = ["a", "a", "b", "b"]
    intervals, valid = bootstrap_intervals(y, {"s": [0.9, 0.8, 0.2, 0.1]}, groups, resamples=400, seed=1)
    assert 120 < valid < 280
    assert intervals["s"]["roc_auc_ci"] == [1.0, 1.0]
    # a resampled question brings all its segments: resampling by segment would mix the classes
    # inside every draw and never skip one


def test_report_carries_intervals_for_every_signal():
    labels = synthetic_labels(60)
    model = train_trigger(labels, features=("probability",))
    report = evaluate_trigger(labels, model, deciders=("prob", "entropy", "keyword"), bootstrap=300, seed=3)
    assert report.bootstrap["valid"] >= 200 and report.bootstrap["unit"] == "question"
    for name, m in report.metrics.items():
        for key in ("roc_auc", "pr_auc"):
            lo, hi = m[f"{key}_ci"]
            assert lo <= m[key] + 1e-9 and m[key] <= hi + 1e-9, (name, key, lo, m[key], hi)
    again = evaluate_trigger(labels, model, deciders=("prob", "entropy", "keyword"), bootstrap=300, seed=3)
    assert again.metrics == report.metrics  # seeded: the same intervals
    assert "[" in report.table() and "bootstrap over questions" in report.table()
    none = evaluate_trigger(labels, model, deciders=("prob",), bootstrap=0)
    assert none.metrics["classifier"]["roc_auc_ci"] is None


def _other_set(labels: LabelSet, prefix: str, name: str, root) -> LabelSet:
    """The synthetic set under another data set's name (a folder without splits.json)."""
    rows = [dataclasses.replace(r, qid=prefix + r.qid) for r in labels.rows]
    qids = list(dict.fromkeys(r.qid for r in rows))
    folder = root / name
    folder.mkdir(exist_ok=True)
    splits = {"test": qids[0::5], "dev": qids[1::5], "train": [q for i, q in enumerate(qids) if i % 5 > 1]}
    (folder / "splits.json").write_text(json.dumps(splits), encoding="utf-8")
    return LabelSet(rows, {**labels.meta, "set_dir": str(folder)})


def test_cross_set_trains_on_each_and_scores_the_other_on_all_questions(tmp_path):
    first = _other_set(synthetic_labels(45, seed=1), "w", "2wikimultihopqa", tmp_path)
    second = _other_set(synthetic_labels(45, seed=2), "m", "musique", tmp_path)
    result = cross_set(first, second, features=("probability",), deciders=("prob",), bootstrap=50)
    runs = result["runs"]
    assert set(runs) == {"2wikimultihopqa -> 2wikimultihopqa", "2wikimultihopqa -> musique",
                         "musique -> musique", "musique -> 2wikimultihopqa"}
    assert runs["2wikimultihopqa -> musique"]["split"] == "all"
    assert runs["2wikimultihopqa -> musique"]["segments"] == len(second.rows)
    assert runs["musique -> musique"]["split"] == "test"
    assert runs["musique -> musique"]["segments"] < len(second.rows)
    assert runs["2wikimultihopqa -> musique"]["signals"]["classifier"]["roc_auc"] > 0.8
    table = cross_set_table(result)
    assert table.count("| classifier |") == 4 and table.count("| prob |") == 4


def test_cross_set_refuses_one_data_set_twice():
    labels = synthetic_labels(30)
    with pytest.raises(InputError):
        cross_set(labels, labels, features=("probability",), bootstrap=0)


def test_cli_eval_prints_intervals_and_cross_runs_in_one_command(tmp_path, capsys):
    first = _other_set(synthetic_labels(45, seed=1), "w", "2wikimultihopqa", tmp_path).save(tmp_path / "a.jsonl")
    second = _other_set(synthetic_labels(45, seed=2), "m", "musique", tmp_path).save(tmp_path / "b.jsonl")
    model = save_trigger(train_trigger(load_labels(first), features=("probability",)), tmp_path / "m.skops")
    assert _cli(["trigger", "eval", "--labels", str(first), "--trigger-model", str(model), "--json",
                 "--bootstrap", "100"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bootstrap"]["resamples"] == 100
    assert all(len(m["roc_auc_ci"]) == 2 for m in out["signals"].values())
    assert _cli(["trigger", "eval", "--labels", str(first), "--trigger-model", str(model), "--bootstrap", "100"]) == 0
    assert "ROC-AUC [95% CI]" in capsys.readouterr().out
    saved = tmp_path / "cross.json"
    assert _cli(["trigger", "cross", "--labels", str(first), str(second), "--features", "probability",
                 "--deciders", "prob", "--bootstrap", "50", "--out", str(saved)]) == 0
    printed = capsys.readouterr().out
    assert "| musique | 2wikimultihopqa | all | classifier |" in printed
    assert len(json.loads(saved.read_text())["runs"]) == 4
