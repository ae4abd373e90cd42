"""The floor a system must clear: model-free baselines, open-question scores, intervals at few
discordant pairs, and a split whose linked questions never straddle train and test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigkit.cli import main
from rigkit.datasets import load_qa, load_splits, make_splits, split_info, split_leaks
from rigkit.errors import InputError
from rigkit.eval.answers import with_open_scores
from rigkit.eval.baselines import question_only_answer
from rigkit.eval.paired import FEW_DISCORDANT, compare_systems, newcombe_paired
from rigkit.eval.report import load_compared, report_tables, split_label
from rigkit.eval.runner import RESULTS_FILE, read_results
from rigkit.eval.systems import needs_model, parse_system, parse_systems

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("question, answer", [
    ("Which film came out first, Blind Shaft or The Mask Of Fu Manchu?", "Blind Shaft"),
    ("Who was born first out of Martin Hodge and Ivania Martinich?", "Martin Hodge"),
    ("Are North Marion High School and Seoul High School both located in the same country?", "yes"),
    ("Did the movies Jamaica Inn and Sandy Gets Her Man come from the same country?", "yes"),
    ("Who is the mother of the director of film Polish-Russian War?", ""),
])
def test_question_only_names_the_first_option_or_yes_and_nothing_for_an_open_question(question, answer):
    assert question_only_answer(question) == answer


def test_the_baselines_parse_and_need_no_model():
    specs = parse_systems("question_only,echo")
    assert [s.kind for s in specs] == ["question_only", "echo"] and not needs_model(specs)
    assert needs_model(parse_systems("question_only,rag"))
    with pytest.raises(InputError, match="no passages to lay out"):
        parse_system("echo@prefix")


def _qa(tmp_path: Path) -> Path:
    rows = [
        {"id": "c1", "question": "Which film came out first, Alpha or Beta?", "answer": "Alpha",
         "type": "comparison"},
        {"id": "c2", "question": "Which film came out first, Gamma or Delta?", "answer": "Delta",
         "type": "comparison"},
        {"id": "y1", "question": "Are Alpha and Beta from the same country?", "answer": "no",
         "type": "comparison"},
        {"id": "o1", "question": "Who directed Alpha?", "answer": "Ann Lee", "type": "compositional"},
    ]
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_rigkit_eval_runs_the_baselines_without_building_a_generator(tmp_path, monkeypatch, capsys):
    import rigkit.build

    def refuse(*args, **kwargs):
        raise AssertionError("a model-free system built a generator")

    monkeypatch.setattr(rigkit.build, "build_generator", refuse)
    monkeypatch.setattr(rigkit.build, "build_retriever", refuse)
    out = tmp_path / "run"
    assert main(["eval", "--qa", str(_qa(tmp_path)), "--systems", "question_only,echo", "--out", str(out),
                 "--no-progress"]) == 0
    rows = {(r["id"], r["system"]): r for r in read_results(out)}
    assert len(rows) == 8 and not any(r["error"] for r in rows.values())
    assert rows["c1", "question_only"]["answer"] == "Alpha" and rows["c1", "question_only"]["em_short"] == 1.0
    assert rows["c2", "question_only"]["em_short"] == 0.0
    assert rows["y1", "question_only"]["answer"] == "yes" and rows["o1", "question_only"]["answer"] == ""
    assert rows["c2", "echo"]["cover_em"] == 1.0  # the question holds its options: Cover EM's floor
    meta = json.loads((out / "meta.json").read_text())
    assert meta["model"]["source"] == "no model"
    (session,) = meta["sessions"]  # opened before the first answer, completed at the end
    assert session["finished"] and session["answers"] == 8
    assert session["commit"] and len(session["commit"].split("+")[0]) == 40  # the rules' commit
    report = (out / "report.md").read_text()
    assert "EM open (short)" in report and "| question_only |" in report and "| echo |" in report


def _row(qid, system, question, gold, em, f1=None):
    return {"id": qid, "system": system, "run": 0, "type": "t", "question": question, "gold": [gold],
            "answer": "x", "em_short": em, "f1_short": em if f1 is None else f1, "cover_em": em,
            "error": None}


def test_open_question_scores_leave_yes_no_and_two_option_questions_out():
    rows = []
    for system, ems in (("rag", (1.0, 1.0, 0.0, 0.0)), ("question_only", (1.0, 1.0, 0.0, 0.0)),
                        ("rig:prob", (0.0, 0.0, 1.0, 1.0))):
        rows += [_row("c", system, "Which came first, Alpha or Beta?", "Alpha", ems[0]),
                 _row("y", system, "Is A older than B?", "yes", ems[1]),
                 _row("o1", system, "Who directed A?", "Ann", ems[2], f1=0.5),
                 _row("o2", system, "Where was B born?", "Oslo", ems[3])]
    scored = {(r["id"], r["system"]): r for r in with_open_scores(rows)}
    assert scored["c", "rag"]["em_open"] is None and scored["y", "rag"]["f1_open"] is None
    assert scored["o1", "rig:prob"]["em_open"] == 1.0 and scored["o1", "rig:prob"]["f1_open"] == 0.5
    header, body = report_tables(rows)["Quality beside cost"]
    col = header.index("EM open (short)")
    by_system = {r[0]: r for r in body}
    # all questions: rag .5, rig .5; open questions only: rag 0, rig 1
    assert by_system["rag"][header.index("EM (short answer)")] == "0.500"
    assert by_system["rag"][col] == "0.000" and by_system["rig:prob"][col] == "1.000"
    assert by_system["rig:prob"][header.index("F1 open (short)")] == "0.750"
    typed = report_tables(rows)["By question type"]
    assert "EM open (short)" in typed[0]


def test_newcombe_paired_interval_matches_published_values():
    # Fagerland, Lydersen & Laake (2017), ch. 8, Cavo et al. (2012): [[59, 6], [16, 80]]
    d, low, high = newcombe_paired(59, 6, 16, 80)
    assert round(d, 4) == -0.0621 and round(low, 4) == -0.1186 and round(high, 4) == -0.0046
    # 0 wins, 4 losses in 40: the difference's interval holds 0 (exact McNemar p = .125)
    d, low, high = newcombe_paired(30, 0, 4, 6)
    assert d == pytest.approx(-0.1) and low < -0.1 < 0.0 < high
    # no discordant pair at all: still an interval around 0, not a point
    d, low, high = newcombe_paired(20, 0, 0, 20)
    assert d == 0.0 and low < 0.0 < high


def test_few_discordant_pairs_carry_newcombe_and_exact_p_many_do_not():
    def rows(losses: int, n: int = 40):
        out = []
        for i in range(n):
            out.append({**_row(f"q{i}", "rag", "Who?", "A", 1.0 if i < losses + 10 else 0.0), "f1": 0.5})
            out.append({**_row(f"q{i}", "rig", "Who?", "A", 1.0 if losses <= i < losses + 10 else 0.0),
                        "f1": 0.25 if i < 3 else 0.5})
        return out

    few = next(c for c in compare_systems(rows(4)) if c.metric == "cover_em")
    assert (few.wins, few.losses) == (0, 4) and few.p_value == pytest.approx(0.125)
    assert few.high < 0  # the percentile bootstrap excludes 0 at 0 / 4 ...
    assert few.newcombe is not None and few.newcombe[0] < 0 < few.newcombe[1]  # ... Newcombe does not
    assert "(Newcombe)" in few.interval_text()
    many = next(c for c in compare_systems(rows(FEW_DISCORDANT)) if c.metric == "cover_em")
    assert many.newcombe is None and "Newcombe" not in many.interval_text()
    f1 = next(c for c in compare_systems(rows(4)) if c.metric == "f1")
    assert f1.newcombe is None  # the rows have no 0/1 F1: a continuous metric keeps the bootstrap


def _steps(row):
    return {step["id"] for step in row.get("question_decomposition") or []}


def test_no_musique_test_question_shares_a_decomposition_step_with_a_train_question():
    rows = {r["id"]: r for r in load_qa(DATA / "musique" / "qa.jsonl")}
    splits = load_splits(DATA / "musique")
    train_steps = set().union(*(_steps(rows[q]) for q in splits["train"]))
    test_steps = set().union(*(_steps(rows[q]) for q in splits["test"]))
    assert splits["test"] and train_steps and not train_steps & test_steps
    for name in ("musique", "2wikimultihopqa"):
        assert split_info(DATA / name)["version"] == 2
        assert not split_leaks(load_qa(DATA / name / "qa.jsonl"), load_splits(DATA / name)), name


def test_linked_questions_land_in_one_split():
    rows = [{"id": f"q{i}", "type": "2hop", "answer": f"a{i}", "question": "?",
             "question_decomposition": [{"id": i // 2}, {"id": 1000 + i}]} for i in range(40)]
    rows.append({"id": "x", "type": "2hop", "answer": "a0", "question": "?"})  # shares q0's answer
    splits = make_splits(rows)
    where = {q: name for name, ids in splits.items() for q in ids}
    assert all(where[f"q{i}"] == where[f"q{i + 1}"] for i in range(0, 40, 2))
    assert where["x"] == where["q0"] and not split_leaks(rows, splits)
    assert abs(len(splits["train"]) - 0.6 * len(rows)) <= 2  # groups of two or three: near the target


def _run_folder(folder: Path, meta: dict) -> Path:
    folder.mkdir()
    (folder / RESULTS_FILE).write_text(json.dumps(_row("q", "rag", "Who?", "A", 1.0)) + "\n")
    (folder / "meta.json").write_text(json.dumps({"qa": "data/x/qa.jsonl", "split": "test", "config": {},
                                                  **meta}))
    return folder


def test_compare_refuses_runs_on_different_versions_of_a_split(tmp_path):
    old = _run_folder(tmp_path / "old", {})
    new = _run_folder(tmp_path / "new", {"split_version": 2, "split_fingerprint": "sha256:ab"})
    same = _run_folder(tmp_path / "same", {"split_version": 2, "split_fingerprint": "sha256:ab"})
    assert "version 1" in split_label(json.loads((old / "meta.json").read_text()))
    with pytest.raises(InputError, match="another version of the test split"):
        load_compared(new, [str(old)])
    meta, rows = load_compared(new, [str(same)])
    assert {r["system"] for r in rows} == {"rag", "rag [same]"}


@pytest.mark.parametrize("name", ["musique", "2wikimultihopqa"])
def test_the_stored_split_is_what_write_splits_makes_from_the_qa_file(tmp_path, name):
    import shutil

    from rigkit.datasets import write_splits

    shutil.copy(DATA / name / "qa.jsonl", tmp_path / "qa.jsonl")
    write_splits(tmp_path)
    assert load_splits(tmp_path) == load_splits(DATA / name)
    assert split_info(tmp_path) == split_info(DATA / name)


def test_report_split_cuts_a_run_over_every_question_to_the_stored_split(tmp_path):
    from rigkit.datasets import fingerprint
    from rigkit.eval.report import write_report

    data = tmp_path / "set"
    data.mkdir()
    splits = {"train": ["a"], "dev": ["b"], "test": ["c", "d"]}
    (data / "splits.json").write_text(json.dumps({"version": 2, **splits}))
    everything = tmp_path / "all"
    everything.mkdir()
    (everything / RESULTS_FILE).write_text("".join(
        json.dumps(_row(q, s, "Who?", "A", 1.0 if s == "rag" else 0.0)) + "\n"
        for q in "abcd" for s in ("rag", "rig:prob")))
    (everything / "meta.json").write_text(json.dumps({"qa": str(data / "qa.jsonl"), "split": "all", "config": {}}))
    tested = _run_folder(tmp_path / "tested", {"qa": str(data / "qa.jsonl"), "split_version": 2,
                                               "split_fingerprint": fingerprint(splits)})
    (tested / RESULTS_FILE).write_text("".join(json.dumps(_row(q, "question_only", "Who?", "A", 0.0)) + "\n"
                                               for q in "cd"))
    with pytest.raises(InputError, match="not over the same questions"):  # without --split
        load_compared(everything, [str(tested)])
    write_report(everything, compare=[f"{tested}=floor"], out=tmp_path / "out", split="test")
    first = (tmp_path / "out" / "report.md").read_text().splitlines()[2]
    assert "split: test, version 2" in first and "cut from runs over every question" in first
    assert ", 2 questions, 3 systems" in first
    meta, rows = load_compared(everything, [str(tested)], split="test")
    assert {r["id"] for r in rows} == {"c", "d"} and meta["split_version"] == 2
    with pytest.raises(InputError, match="ran on the test split"):
        load_compared(tested, [str(everything)], split="dev")


def test_every_report_shows_the_floor_answered_on_the_runs_own_questions(tmp_path):
    from rigkit.eval.report import write_report

    run = tmp_path / "run"
    run.mkdir()
    questions = (("c", "Which came first, Alpha or Beta?", "Alpha"), ("y", "Is A older than B?", "no"),
                 ("o", "Who directed A?", "Ann"))
    (run / RESULTS_FILE).write_text("".join(json.dumps(_row(q, "rag", text, gold, 0.0)) + "\n"
                                            for q, text, gold in questions))
    (run / "meta.json").write_text(json.dumps({"qa": "data/x/qa.jsonl", "split": "test", "config": {}}))
    write_report(run, baseline="question_only")
    report = (run / "report.md").read_text()
    lines = report.splitlines()
    # the run's own count stays 1 system, 3 answers; the floor is said to be the report's
    assert ", 3 questions, 1 systems, 1 run(s), 3 answers." in lines[2]
    assert "`question_only` and `echo` were answered by this report" in report
    headline = report.split("## Quality beside cost")[1].split("##")[0]
    floor = next(line for line in headline.splitlines() if line.startswith("| question_only"))
    # "Alpha" named first is right, "yes" for a "no" question is wrong: EM 1 of 3; nothing open right
    assert floor.split(" | ")[3:6] == ["0.333", "0.333", "0.000"]  # EM, F1; EM open
    assert "| echo" in headline
    # the floor is paired with the others like any system
    paired = report.split("## Paired against question_only")[1].split("##")[0]
    assert "| rag | EM (short answer) | 3 | -0.333 |" in paired and "| echo | EM (short answer) | 3 |" in paired
    # a run that holds part of the floor already is given only the part it lacks, once
    (run / RESULTS_FILE).write_text((run / RESULTS_FILE).read_text() + "".join(
        json.dumps(_row(q, "question_only", text, gold, 1.0 if q == "c" else 0.0)) + "\n"
        for q, text, gold in questions))
    write_report(run)
    again = (run / "report.md").read_text()
    assert "`echo` was answered by this report" in again and "`question_only` and" not in again
    headline = again.split("## Quality beside cost")[1].split("##")[0]
    assert sum(line.startswith("| question_only") for line in headline.splitlines()) == 1
    # and a run that holds all of it, nothing
    (run / RESULTS_FILE).write_text((run / RESULTS_FILE).read_text() + "".join(
        json.dumps(_row(q, "echo", text, gold, 0.0)) + "\n" for q, text, gold in questions))
    write_report(run)
    assert "answered by this report" not in (run / "report.md").read_text()


def test_a_run_from_before_the_short_answer_line_is_scored_open_on_its_extracted_answer():
    old = {"id": "o", "system": "rag", "run": 0, "question": "Who directed A?", "gold": ["Ann"], "error": None,
           "em": 0.0, "f1": 0.2, "em_extracted": 1.0, "f1_extracted": 1.0, "cover_em": 1.0}
    new = {**old, "id": "n", "em_short": 0.0, "f1_short": 0.5}
    closed = {**old, "id": "c", "question": "Is A older than B?", "gold": ["yes"]}
    scored = {r["id"]: r for r in with_open_scores([old, new, closed])}
    assert (scored["o"]["em_open"], scored["o"]["f1_open"], scored["o"]["open_from"]) == (1.0, 1.0, "extracted")
    assert (scored["n"]["em_open"], scored["n"]["f1_open"]) == (0.0, 0.5) and "open_from" not in scored["n"]
    assert scored["c"]["em_open"] is None
