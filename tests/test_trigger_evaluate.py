"""Signal comparison on held-out labels, the CLI, and the classifier inside the controller."""

from __future__ import annotations

import argparse
import json

import pytest

from rigkit.trigger.evaluate import evaluate_trigger, signal_metrics, split_rows
from rigkit.trigger.model import save_trigger, train_trigger
from tests.conftest_trigger import HashEmbedder, synthetic_labels


def test_signal_metrics_guard_one_class():
    m = signal_metrics([0, 0, 0], [0.1, 0.5, 0.9], [0, 1, 1])
    assert m["roc_auc"] is None and m["pr_auc"] is None
    assert m["accuracy"] == pytest.approx(1 / 3) and m["f1"] == 0.0
    perfect = signal_metrics([0, 1, 1], [0.1, 0.8, 0.9], [0, 1, 1])
    assert perfect["roc_auc"] == 1.0 and perfect["pr_auc"] == 1.0 and perfect["f1"] == 1.0


def test_compares_classifier_with_deciders_on_test_split():
    labels = synthetic_labels(40)
    model = train_trigger(labels, features=("probability",))
    report = evaluate_trigger(labels, model, deciders=("prob", "entropy", "keyword"))
    assert list(report.metrics) == ["classifier", "prob", "entropy", "keyword"]
    test_qids = set(model.meta["split_qids"]["test"])
    assert len(report.labels) == sum(r.qid in test_qids for r in labels.rows)
    for name, m in report.metrics.items():
        assert 0.0 <= m["roc_auc"] <= 1.0 and 0.0 <= m["pr_auc"] <= 1.0, name
    # synthetic positives carry low-probability tokens: the prob decider must rank them well
    assert report.metrics["prob"]["roc_auc"] > 0.9 and report.metrics["classifier"]["roc_auc"] > 0.9
    table = report.table()
    assert table.count("\n| ") >= 4 and "PR-AUC of a random signal" in table
    fig = report.figure()
    assert len(fig.data) == 2 * 4 + 1  # ROC + PR per signal, plus the chance line


def test_one_class_test_split_is_reported_not_crashed():
    labels = synthetic_labels(40)
    model = train_trigger(labels, features=("probability",))
    test = set(model.meta["split_qids"]["test"])
    for r in labels.rows:
        if r.qid in test:
            r.label = 0
            r.rules = dict.fromkeys(r.rules, 0)
    report = evaluate_trigger(labels, model, deciders=("prob",))
    assert report.metrics["classifier"]["roc_auc"] is None
    assert any("one class" in n for n in report.notes)
    assert "n/a" in report.table()
    report.figure()  # no crash


def test_byo_rows_skip_token_deciders(tmp_path):
    path = tmp_path / "mine.csv"
    lines = ["text,label,qid"] + [
        f"{'The dose is 5 mg daily' if i % 3 == 0 else 'Thanks for asking'} {i},{int(i % 3 == 0)},g{i}"
        for i in range(60)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    from rigkit.trigger.labelset import load_labels

    labels = load_labels(path)
    emb = HashEmbedder()
    model = train_trigger(labels, features=("embedding",), embedder=emb)
    report = evaluate_trigger(labels, model, embedder=emb)
    assert list(report.metrics) == ["classifier"] and len(report.notes) == 3
    assert len(split_rows(labels, model)) == len(report.labels)


def _cli(argv: list[str]) -> int:
    from rigkit.cli.trigger import register
    from rigkit.errors import RigkitError

    parser = argparse.ArgumentParser(prog="rigkit")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except RigkitError as err:  # as rigkit.cli.main does
        print(f"rigkit: error: {err}")
        return 2


def test_cli_train_and_eval_json(tmp_path, capsys):
    labels_path = synthetic_labels(40).save(tmp_path / "labels.jsonl")
    model_path = tmp_path / "trigger.skops"
    assert _cli(["trigger", "train", "--labels", str(labels_path), "--out", str(model_path),
                 "--features", "probability", "--json"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["features"] == ["probability"] and model_path.exists()
    html = tmp_path / "fig.html"
    assert _cli(["trigger", "eval", "--labels", str(labels_path), "--trigger-model", str(model_path),
                 "--json", "--html", str(html)]) == 0
    out = json.loads(capsys.readouterr().out)
    for name in ("classifier", "prob", "entropy", "keyword"):
        assert set(out["signals"][name]) >= {"roc_auc", "pr_auc", "accuracy", "f1"}
    assert out["agreement"]["percent_agree"] == 100.0
    assert "plotly" in html.read_text()[:20000].lower()


def test_cli_bad_features_exit_2(tmp_path, capsys):
    labels_path = synthetic_labels(10).save(tmp_path / "labels.jsonl")
    code = _cli(["trigger", "train", "--labels", str(labels_path), "--out", str(tmp_path / "m.skops"),
                 "--features", "telepathy"])
    assert code == 2 and "unknown feature set" in capsys.readouterr().out


def test_classifier_decider_inside_the_controller(tmp_path):
    """A scripted run: the confident sentence is accepted, the invented one triggers retrieval."""
    from rigkit.build import build_controller
    from rigkit.config import RunConfig
    from rigkit.testing import DictRetriever, ScriptedGenerator, make_segment
    from rigkit.trace import Hit

    model = train_trigger(synthetic_labels(40), features=("probability",))
    path = save_trigger(model, tmp_path / "trigger.skops")
    gen = ScriptedGenerator([
        make_segment("The answer is clear.", [0.95, 0.9, 0.92, 0.97]),
        make_segment("It was made in 1931 by Zoltan.", [0.9, 0.9, 0.8, 0.7, 0.05, 0.9, 0.04]),
        make_segment("It was made in 2021 by Shawn Levy.", [0.9] * 8, finish_reason="end_of_turn"),
    ])
    hit = Hit("c1", "d1", "Free Guy", "Free Guy (2021) was directed by Shawn Levy.", 1.0)
    config = RunConfig().override(decider={"name": "classifier", "trigger_model": str(path)})
    result = build_controller(config, generator=gen, retriever=DictRetriever({}, default=[hit])).run(
        "Who directed Free Guy?"
    )
    decisions = [r.decision for r in result.rounds]
    assert [d.decider for d in decisions] == ["classifier"] * len(decisions)
    assert not decisions[0].retrieve and decisions[1].retrieve
    assert result.used_retrieval_times == 1


def test_end_effect_runs_both_deciders_on_the_same_questions(tmp_path):
    from rigkit.testing import DictRetriever, ScriptedGenerator, make_segment
    from rigkit.trace import Hit
    from rigkit.trigger.endeffect import end_effect

    model = train_trigger(synthetic_labels(40), features=("probability",))
    path = save_trigger(model, tmp_path / "trigger.skops")
    invented = make_segment("It was made by Zoltan.", [0.9, 0.9, 0.8, 0.05, 0.04])
    gen = ScriptedGenerator([
        invented, make_segment("Shawn Levy.", finish_reason="end_of_turn"),  # classifier run
        make_segment("Zoltan.", [0.9], finish_reason="end_of_turn"),  # prob run: confident
    ])
    hit = Hit("c1", "d1", "Free Guy", "Free Guy was directed by Shawn Levy.", 1.0)
    record = {"id": "q1", "question": "Who directed Free Guy?", "answer": "Shawn Levy"}
    effect = end_effect([record], str(path), gen, DictRetriever({}, default=[hit]), progress=False)
    assert set(effect.systems) == {"classifier", "prob"}
    assert effect.systems["classifier"]["retrievals"] == 1 and effect.systems["prob"]["retrievals"] == 0
    assert effect.systems["classifier"]["cover"] == 1.0 and effect.systems["prob"]["cover"] == 0.0
    assert "| classifier |" in effect.table() and effect.to_dict()["questions"] == 1
