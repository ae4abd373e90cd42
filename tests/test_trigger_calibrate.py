"""`rigkit trigger calibrate`: per-question replay of the deciders, the dev-only threshold choice,
the committed labels end to end, and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rigkit.cli import main
from rigkit.config import apply_settings, load_config
from rigkit.datasets import load_splits
from rigkit.errors import InputError
from rigkit.testing import ScriptedGenerator, make_segment
from rigkit.trigger.calibrate import OperatingPoint, calibrate, choose_threshold, use_flags
from rigkit.trigger.labels import build_labels
from rigkit.trigger.labelset import LabelledSegment, LabelSet, load_labels

ROOT = Path(__file__).resolve().parents[1]
TWOWIKI = ROOT / "data" / "trigger" / "2wikimultihopqa-labels.jsonl"
TEXT = "Paris hosts the museum"  # content words: Paris, hosts, museum


def _row(qid: str, split: str, probs: list[float], helped: bool = False, right: bool = False,
         index: int = 0, margins: list[float] | None = None) -> LabelledSegment:
    seg = make_segment(TEXT, probs, margins=margins)
    return LabelledSegment(
        qid=qid, question=f"Where is {qid}?", text=TEXT, label=int(helped), index=index,
        tokens=seg.tokens, logprobs=seg.logprobs, entropies=seg.entropies, margins=seg.margins,
        rules={"r1": int(helped)},
        info={"split": split, "gain": helped, "closed_cover": float(right)},
    )


SURE, UNSURE = [0.9, 0.9, 0.9, 0.9], [0.9, 0.9, 0.9, 0.1]  # "museum" at p=.1


def _tiny(helped_test: list[float] = SURE, right_test: list[float] = SURE) -> LabelSet:
    """Five dev and two test questions whose firing at the prob default (0.3) is known."""
    rows = [
        # d1: only its middle segment fires
        _row("d1", "dev", SURE, helped=True), _row("d1", "dev", UNSURE, helped=True, index=1),
        _row("d1", "dev", SURE, helped=True, index=2),
        _row("d2", "dev", SURE, helped=True),
        _row("d3", "dev", [0.9, 0.2, 0.9, 0.9], right=True),  # "hosts" at p=.2 fires
        _row("d4", "dev", SURE, right=True),
        _row("d5", "dev", [0.9, 0.9, 0.05, 0.9]),  # "the" is a stop word: never fires
        _row("t1", "test", helped_test, helped=True),
        _row("t2", "test", right_test, right=True),
    ]
    return LabelSet(rows, {"rule": "r1", "generator": "scripted", "set_dir": None})


def test_a_question_retrieves_when_any_of_its_segments_fires():
    result = calibrate(_tiny(), deciders=["prob"], grid=5, bootstrap=0)
    point = result.deciders[0].at_default["dev"]
    assert point.threshold == 0.3
    assert (point.questions, point.fired) == (5, 2)  # d1 (second segment) and d3
    assert (point.helped, point.helped_fired, point.right, point.right_fired) == (2, 1, 2, 1)
    assert (point.retrieval_rate, point.recall, point.over_search) == (0.4, 0.5, 0.5)
    assert result.meta["questions"] == {"dev": 5, "test": 2}


def test_choice_is_made_on_dev_only():
    # test alone would choose differently in the two sets: ~.55 (t1 fires, t2 not) in the first,
    # the least-firing threshold in the second (t2 fires first, t1 never)
    first = calibrate(_tiny([0.9, 0.9, 0.9, 0.5], SURE), deciders=["prob", "entropy"], grid=9, bootstrap=0)
    planted = calibrate(_tiny(SURE, [0.9, 0.9, 0.9, 0.05]), deciders=["prob", "entropy"], grid=9, bootstrap=0)
    for a, b in zip(first.deciders, planted.deciders):
        assert a.chosen is not None and a.chosen == b.chosen
        assert [p.threshold for p in a.grid["dev"]] == [p.threshold for p in b.grid["dev"]]
        assert a.at_chosen["dev"] == b.at_chosen["dev"]
    # ... while the planted change does reach the test figures
    assert first.deciders[0].at_default["test"].right_fired == 0
    assert planted.deciders[0].at_default["test"].right_fired == 1


def test_dev_choice_separates_helped_from_right():
    # on dev only d1 (helped) holds a token below .15: a threshold there has J = .5 - 0
    result = calibrate(_tiny(), deciders=["prob"], grid=9, bootstrap=0)
    prob = result.deciders[0]
    assert prob.at_chosen["dev"].youden == 0.5 and prob.at_chosen["dev"].right_fired == 0
    assert prob.chosen <= 0.2


def test_ties_go_to_fewer_retrievals_then_the_least_firing_threshold():
    def point(t, fired, helped_fired, right_fired):
        return OperatingPoint(t, 10, fired, 4, helped_fired, 4, right_fired)

    points = [point(0.1, 2, 1, 0), point(0.2, 6, 3, 2), point(0.3, 3, 1, 0), point(0.4, 3, 1, 0)]
    assert choose_threshold(points).threshold == 0.1  # J .25 three times: fewest retrievals wins
    assert choose_threshold(points[2:]).threshold == 0.3  # equal retrievals: the first (least firing)
    no_right = [OperatingPoint(0.1, 3, 1, 3, 1, 0, 0)]
    assert choose_threshold(no_right) is None  # over-search undefined: no choice


def test_margins_are_labelled_and_calibrated(tmp_path):
    record = {"id": "q1", "question": "Who directed Free Guy?", "answer": "Shawn Levy",
              "paragraphs": [{"title": "Free Guy", "text": "Free Guy is directed by Shawn Levy.",
                              "is_supporting": True}]}
    gen = ScriptedGenerator([
        make_segment("It was Martin Scorsese.", [0.9, 0.9, 0.4, 0.9], margins=[0.8, 0.8, 0.05, 0.8],
                     finish_reason="end_of_turn"),
        make_segment("Shawn Levy.", finish_reason="end_of_turn"),
    ])
    labels = build_labels([record], gen, rule="r1", progress=False)
    path = labels.save(tmp_path / "labels.jsonl")
    assert load_labels(path).rows[0].margins == [0.8, 0.8, 0.05, 0.8]
    tiny = _tiny()
    for row in tiny.rows:  # margin: "museum" is close-run on the unsure rows only
        row.margins = [0.8, 0.8, 0.8, 0.05 if row.logprobs[3] < -1 else 0.8]
    result = calibrate(tiny, deciders=["margin"], grid=5, bootstrap=0)
    assert not result.skipped and result.deciders[0].unit == "probability margin"
    assert result.deciders[0].at_default["dev"].fired == 1  # d1 alone: margin .05 < .1


def test_use_flags_set_the_chosen_threshold():
    for name, threshold in (("prob", 0.0602), ("entropy", 4.85)):
        settings = use_flags(name, threshold).replace("--set ", "").split()
        config = apply_settings(load_config(str(ROOT / "configs" / "cpu.yaml")), settings)
        assert (config.decider.name, config.decider.threshold) == (name, threshold)
    assert config.decider.params == {"use_attention": False}


def test_cli_on_the_committed_labels(tmp_path, capsys):
    out = tmp_path / "calibration.json"
    code = main(["trigger", "calibrate", "--labels", str(TWOWIKI), "--grid", "11", "--bootstrap", "50",
                 "--json", "--out", str(out)])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and json.loads(out.read_text()) == printed
    labelled = {r.qid for r in load_labels(TWOWIKI).rows}
    splits = load_splits(ROOT / "data" / "2wikimultihopqa")
    assert printed["questions"] == {s: len(labelled & set(splits[s])) for s in ("dev", "test")}
    assert printed["splits"]["version"] == 2 and printed["generator"] == "smollm2-135m-instruct"
    assert set(printed["deciders"]) == {"prob", "entropy"}
    assert "margin" in printed["not_calibratable"]
    for d in printed["deciders"].values():
        dev = d["grid"]["dev"]
        assert 2 <= len(dev) <= 12 and d["chosen_threshold"] in [p["threshold"] for p in dev]
        rates = [p["retrieval_rate"] for p in dev]
        assert rates == sorted(rates)  # least-firing threshold first
        for split in ("dev", "test"):
            auc = d["auroc"][split]
            assert 0.0 <= auc["value"] <= 1.0 and auc["ci"][0] <= auc["value"] <= auc["ci"][1]
            for p in (d["at_default"][split], d["at_chosen"][split]):
                assert all(0.0 <= p[k] <= 1.0 for k in ("retrieval_rate", "recall", "over_search"))
    capsys.readouterr()
    assert main(["trigger", "calibrate", "--labels", str(TWOWIKI), "--bootstrap", "0",
                 "--deciders", "prob"]) == 0
    table = capsys.readouterr().out
    summary = [line for line in table.splitlines() if line.startswith("| prob | ")]
    assert len(summary) == 4 and all(line.count("|") == 8 for line in summary)  # dev/test x default/chosen
    assert "use prob: --set decider.name=prob --set decider.threshold=" in table


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.jsonl", "file not found"),
    (lambda d: _write(d / "byo.csv", "text,label\nParis is big,1\n"), "no token log-probabilities"),
    (lambda d: _strip_info(d / "old.jsonl"), "no closed_cover / r1 verdict"),
])
def test_bad_labels_are_one_line_exit_2(tmp_path, capsys, make, message):
    code = main(["trigger", "calibrate", "--labels", str(make(tmp_path)), "--bootstrap", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1


def test_too_small_a_grid_is_refused():
    with pytest.raises(InputError, match="at least 2"):
        calibrate(_tiny(), grid=1)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _strip_info(path: Path) -> Path:
    rows = [LabelledSegment(**{**r.__dict__, "info": {"split": r.info["split"]}}) for r in _tiny().rows]
    return LabelSet(rows, {"rule": "r1"}).save(path)


def test_scores_are_the_deciders_own():
    # the question score is the highest Decision.score: 1 - the lowest content-token probability
    result = calibrate(_tiny(), deciders=["prob"], grid=3, bootstrap=0)
    grid = {p.threshold for p in result.deciders[0].grid["dev"]}
    assert grid >= {0.3} and min(grid) == pytest.approx(0.1) and max(grid) == pytest.approx(0.9)
    # helped d1 .9, d2 .1 against d3 .8, d4 .1, d5 .1: d1 wins 3 pairs, d2 ties 2 of its 3
    assert math.isclose(result.deciders[0].auroc["dev"]["value"], 4 / 6)


def test_margin_on_the_committed_margin_labels():
    labels = load_labels(ROOT / "data" / "trigger" / "2wikimultihopqa-devtest-margins.jsonl")
    assert all(len(r.margins) == len(r.tokens) for r in labels.rows)
    result = calibrate(labels, deciders=["margin"], grid=11, bootstrap=0)
    margin = result.deciders[0]
    assert not result.skipped and result.meta["questions"] == {"dev": 33, "test": 33}
    assert margin.at_default["dev"].threshold == 0.1 and margin.chosen is not None
    assert all(0.0 <= p.retrieval_rate <= 1.0 for p in margin.grid["dev"])


# -- running at a calibrated threshold: `decider.calibration` / `--calibration FILE` ----------

CALIBRATION = ROOT / "docs" / "results" / "calibration"
QWEN_2WIKI = CALIBRATION / "2wikimultihopqa-qwen2.5-coder-0.5b.json"
QWEN = "qwen2.5-coder-0.5b-instruct"


def _section(name: str, path: Path = QWEN_2WIKI, **extra):
    from rigkit.config import DeciderConfig

    return DeciderConfig(name=name, calibration=str(path), **extra)


def test_a_calibration_file_sets_each_deciders_chosen_threshold():
    from rigkit.deciders.calibration import calibrated_section

    chosen = {name: d["chosen_threshold"] for name, d in json.loads(QWEN_2WIKI.read_text())["deciders"].items()}
    prob = calibrated_section(_section("prob", threshold=0.9), QWEN)
    assert prob.threshold == chosen["prob"] != 0.9  # the file wins over the section's threshold
    entropy = calibrated_section(_section("entropy"), QWEN)
    assert entropy.threshold == chosen["entropy"] and entropy.params == {"use_attention": False}  # as replayed
    margin = calibrated_section(_section("margin"), QWEN)
    assert margin.threshold == chosen["margin"]
    classifier = _section("classifier", trigger_model="runs/x.skops")  # not in the file: untouched
    assert calibrated_section(classifier, QWEN) == classifier
    assert calibrated_section(_section("prob", path=""), QWEN).threshold is None  # no file, no change


def test_a_calibration_for_another_model_or_with_no_choice_is_refused(tmp_path):
    from rigkit.deciders.calibration import calibrated_section

    with pytest.raises(InputError, match="chosen on qwen2.5-coder-0.5b-instruct's scores; this run's model is smollm2"):
        calibrated_section(_section("prob"), "smollm2-135m-instruct")
    musique = CALIBRATION / "musique-qwen2.5-coder-0.5b.json"  # dev held no closed-book-right question
    with pytest.raises(InputError, match="chose no threshold for decider 'prob': dev has no"):
        calibrated_section(_section("prob", path=musique), QWEN)
    with pytest.raises(InputError, match="calibration file not found"):
        calibrated_section(_section("prob", path=tmp_path / "none.json"), QWEN)
    (tmp_path / "labels.json").write_text('{"rows": []}')
    with pytest.raises(InputError, match="is not a calibration file"):
        calibrated_section(_section("prob", path=tmp_path / "labels.json"), QWEN)
    (tmp_path / "cut.json").write_text('{"deciders": {')
    with pytest.raises(InputError, match="is not readable JSON"):
        calibrated_section(_section("prob", path=tmp_path / "cut.json"), QWEN)


def test_a_run_and_each_eval_system_read_the_calibration():
    from rigkit.build import build_controller
    from rigkit.testing import DictRetriever
    from tests.tiny_model import tiny_generator

    path = CALIBRATION / "2wikimultihopqa-smollm2-135m.json"  # made on the default model's scores
    chosen = {name: d["chosen_threshold"] for name, d in json.loads(path.read_text())["deciders"].items()}
    config = load_config(decider={"name": "prob", "calibration": str(path)})
    generator = tiny_generator(seed=1)
    controller = build_controller(config, generator, DictRetriever({}))
    assert controller.decider.threshold == chosen["prob"]
    entropy = config.with_decider("entropy")  # an eval's rig:entropy beside rig:prob: same file
    assert entropy.decider.calibration == str(path)
    built = build_controller(entropy, generator, DictRetriever({}))
    assert built.decider.threshold == chosen["entropy"] and built.decider.use_attention is False


def test_calibrate_names_the_file_to_run_with(tmp_path, capsys):
    out = tmp_path / "calibration.json"
    assert main(["trigger", "calibrate", "--labels", str(TWOWIKI), "--bootstrap", "0", "--out", str(out)]) == 0
    assert f"--calibration {out}" in capsys.readouterr().out
    assert json.loads(out.read_text())["generator"]
