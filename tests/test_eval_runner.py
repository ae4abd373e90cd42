"""Runner tests with rigkit.testing's scripted parts: streaming, resume, torn lines, seeds."""

from __future__ import annotations

import copy
import fcntl
import json
from pathlib import Path

import pytest

from rigkit.config import DeciderConfig, RunConfig
from rigkit.errors import InputError
from rigkit.eval.experiment import config_changes, evaluate, load_questions
from rigkit.eval.metrics import QAItem
from rigkit.eval.report import markdown_report
from rigkit.eval.runner import RESULTS_FILE, ResultsFile, read_results, result_key, run_eval
from rigkit.eval.systems import (
    System,
    build_systems,
    parse_system,
    parse_systems,
    system_config,
)
from rigkit.testing import DictRetriever, ScriptedGenerator, make_segment
from rigkit.trace import Hit

QUESTIONS = {
    "q1": ("Who directed Free Guy?", "Shawn Levy", "compositional", ["Free Guy"]),
    "q2": ("Which film came first, Heat or Alien?", "Alien", "comparison", ["Heat", "Alien"]),
    "q3": ("Where was Pál Gábor born?", "Budapest", "compositional", ["Pál Gábor"]),
}


class ReplyGenerator(ScriptedGenerator):
    """Answers every call with a fixed sentence per question (found in the prompt), end of turn."""

    def __init__(self, replies: dict[str, str]):
        super().__init__([])
        self.table = replies
        self.seeds: list[int | None] = []

    def next_segment(self, prompt, stop, max_new_tokens, on_token=None):
        self.prompts.append(list(prompt))
        text = " ".join(p.text for p in prompt)
        reply = next((a for q, a in self.table.items() if q in text), "I do not know.")
        return make_segment(reply, finish_reason="end_of_turn")

    def reset(self, seed=None):
        self.seeds.append(seed)


def _hit(title: str, text: str) -> Hit:
    return Hit(chunk_id=f"{title}#0", doc_id=title, title=title, text=text, score=1.0)


def _items() -> list[QAItem]:
    return [QAItem(id=k, question=q, answer=a, type=t, supporting_titles=tuple(s))
            for k, (q, a, t, s) in QUESTIONS.items()]


def _parts():
    generator = ReplyGenerator({q: f"The answer is {a}." for q, a, _, _ in QUESTIONS.values()})
    retriever = DictRetriever({}, default=[_hit("Free Guy", "Free Guy is directed by Shawn Levy."),
                                           _hit("Alien", "Alien is a 1979 film.")])
    return generator, retriever


def _systems(names="closed_book,rag,rig:always", config=None):
    generator, retriever = _parts()
    config = config or RunConfig()
    return build_systems(parse_systems(names), config, generator, retriever), generator


def test_parse_system_grammar():
    assert parse_system("closed_book").kind == "closed_book"
    assert parse_system("rag:5").top_k == 5
    spec = parse_system("rig:entropy:rewrite@prefix")
    assert (spec.kind, spec.decider, spec.query_mode, spec.layout) == ("rig", "entropy", "rewrite",
                                                                        "prefix")
    assert parse_system("rig").decider is None
    for bad in ("rag:0", "rig:nosuch", "rig:prob:nosuch", "flare", "rig:prob@middle", "closed_book:1"):
        with pytest.raises(InputError):
            parse_system(bad)
    with pytest.raises(InputError, match="twice"):
        parse_systems("rag,rag")
    with pytest.raises(InputError):
        parse_systems(" , ")


def test_system_config_replaces_only_what_the_name_says():
    base = RunConfig().override(decider={"name": "prob", "threshold": 0.3}, retrieval={"top_k": 3})
    other = system_config(parse_system("rig:entropy:keywords"), base)
    assert other.decider == DeciderConfig(name="entropy")  # no threshold meant for prob
    assert other.query.mode == "keywords"
    same = system_config(parse_system("rig:prob"), base)
    assert same.decider.threshold == 0.3  # the config's own decider section is kept whole
    assert system_config(parse_system("rag:7"), base).retrieval.top_k == 7
    assert system_config(parse_system("rag@prefix"), base, layout="append").context.layout == "prefix"
    assert system_config(parse_system("rag"), base, layout="prefix").context.layout == "prefix"


def test_run_streams_one_line_per_key_and_scores(tmp_path):
    systems, generator = _systems()
    summary = run_eval(_items(), systems, tmp_path, runs=2, base_seed=10, progress=False)
    rows = [json.loads(line) for line in (tmp_path / RESULTS_FILE).read_text().splitlines()]
    assert summary.written == len(rows) == 3 * 3 * 2 and summary.skipped == 0
    assert len({result_key(r) for r in rows}) == len(rows)
    assert {r["seed"] for r in rows if r["run"] == 1} == {11}
    assert {10, 11} <= set(generator.seeds)  # the controller reseeded with the run's seed
    by = {(r["id"], r["system"], r["run"]): r for r in rows}
    assert by["q1", "closed_book", 0]["cover_em"] == 1.0
    assert by["q1", "closed_book", 0]["retrievals"] == 0
    assert by["q1", "rag", 0]["retrievals"] == 1 and by["q1", "rag", 0]["support_recall"] == 1.0
    assert by["q1", "rig:always", 0]["retrievals"] >= 1
    assert by["q1", "rig:always", 0]["trigger_rate"] > 0
    assert by["q1", "rag", 0]["summary"]["tokens"]["generated"] > 0
    # what the report counts per answer sits at the row's top level, where the report reads it
    always = by["q1", "rig:always", 0]
    assert always["policy"] == "continue" and always["retrieval_errors"] == [] and always["retrieval_failed"] is False
    latency = markdown_report({"split": "all"}, rows).split("## Latency")[1]
    assert "| rig:always | continue |" in latency and "| rag | – |" in latency
    assert by["q2", "rag", 1]["gold"] == ["Alien"] and by["q2", "rag", 1]["type"] == "comparison"
    traces = ResultsFile(tmp_path / "traces.jsonl")
    assert sum(1 for _ in traces.rows()) == len(rows)


def _count_calls(systems: list[System]) -> list[str]:
    calls: list[str] = []
    for system in systems:
        inner = system.answer

        def counted(question, seed, inner=inner, name=system.name):
            calls.append(name)
            return inner(question, seed)

        system.answer = counted
    return calls


def test_resume_after_kill_keeps_complete_lines_and_drops_torn_one(tmp_path):
    systems, _ = _systems()
    run_eval(_items(), systems, tmp_path, runs=1, progress=False)
    path = tmp_path / RESULTS_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 9
    # A kill after 6 complete lines, in the middle of writing the 7th.
    path.write_bytes(b"".join(lines[:6]) + lines[6][: len(lines[6]) // 2])
    systems, _ = _systems()
    calls = _count_calls(systems)
    summary = run_eval(_items(), systems, tmp_path, runs=1, progress=False)
    assert summary.skipped == 6 and len(calls) == 3
    new = path.read_bytes().splitlines(keepends=True)
    assert new[:6] == lines[:6]  # complete lines untouched
    keys = [result_key(json.loads(line)) for line in new]
    assert len(keys) == len(set(keys)) == 9
    # Nothing left to do: a third start answers nothing and writes nothing.
    systems, _ = _systems()
    calls = _count_calls(systems)
    assert run_eval(_items(), systems, tmp_path, runs=1, progress=False).written == 0
    assert calls == [] and path.read_bytes() == b"".join(new)


def test_repair_keeps_a_complete_record_missing_its_newline(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a", "system": "s", "run": 0}\n{"id": "b", "system": "s", "run": 0}')
    assert ResultsFile(path).repair() == 0
    assert path.read_text().endswith("}\n") and len(read_results(path)) == 2
    path.write_text('{"id": "a", "system": "s", "run": 0}\n{"id": "b", "sys')
    assert ResultsFile(path).repair() > 0
    assert path.read_text() == '{"id": "a", "system": "s", "run": 0}\n'


def test_adding_a_system_or_runs_answers_only_the_new_keys(tmp_path):
    systems, _ = _systems("closed_book")
    run_eval(_items(), systems, tmp_path, progress=False)
    systems, _ = _systems("closed_book,rag")
    calls = _count_calls(systems)
    summary = run_eval(_items(), systems, tmp_path, runs=2, progress=False)
    assert summary.skipped == 3 and summary.written == 9
    assert calls.count("closed_book") == 3 and calls.count("rag") == 6


def test_errors_are_recorded_then_retried(tmp_path):
    systems, _ = _systems("closed_book")
    good = systems[0].answer

    def flaky(question, seed):
        if "Heat" in question:
            raise RuntimeError("model fell over")
        return good(question, seed)

    systems[0].answer = flaky
    summary = run_eval(_items(), systems, tmp_path, progress=False)
    assert summary.errors == 1
    failed = [r for r in read_results(tmp_path) if r["error"]]
    assert [r["id"] for r in failed] == ["q2"] and "model fell over" in failed[0]["error"]
    systems, _ = _systems("closed_book")
    calls = _count_calls(systems)
    run_eval(_items(), systems, tmp_path, progress=False)
    assert calls == ["closed_book"]
    rows = read_results(tmp_path)
    assert len(rows) == 3 and not any(r["error"] for r in rows)


def test_a_second_process_on_the_same_folder_is_refused(tmp_path):
    systems, _ = _systems("closed_book")
    with open(tmp_path / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(InputError, match="in use"):
            run_eval(_items(), systems, tmp_path, progress=False)


def test_an_eval_refused_by_the_lock_leaves_meta_json_as_it_was(tmp_path):
    from rigkit.eval import evaluate

    qa, out = _qa_file(tmp_path / "toy"), tmp_path / "out"
    evaluate(qa, out, "question_only", progress=False, report=False)
    before = (out / "meta.json").read_text()
    with open(out / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(InputError, match="in use"):
            evaluate(qa, out, "question_only", progress=False, report=False)
    assert (out / "meta.json").read_text() == before


def _qa_file(folder: Path) -> Path:
    folder.mkdir()
    with open(folder / "qa.jsonl", "w") as fh:
        for key, (q, a, t, s) in QUESTIONS.items():
            fh.write(json.dumps({"dataset": "toy", "id": key, "question": q, "answer": a,
                                 "answer_aliases": [], "type": t, "supporting_titles": s,
                                 "paragraphs": []}) + "\n")
    (folder / "splits.json").write_text(json.dumps({"train": ["q1"], "dev": [], "test": ["q2", "q3"]}))
    return folder / "qa.jsonl"


def test_evaluate_writes_meta_results_report_and_refuses_other_config(tmp_path):
    qa = _qa_file(tmp_path / "toy")
    generator, retriever = _parts()
    out = tmp_path / "run"
    summary = evaluate(qa, out, "closed_book,rig:always@prefix", split="test", generator=generator,
                       retriever=retriever, faithfulness=False, progress=False)
    assert summary.written == 4
    meta = json.loads((out / "meta.json").read_text())
    assert meta["split"] == "test" and meta["question_ids"] == ["q2", "q3"]
    assert (out / "report.html").exists() and "rig:always@prefix" in (out / "report.md").read_text()
    assert {r["layout"] for r in read_results(out) if r["system"] == "rig:always@prefix"} == {"prefix"}
    with pytest.raises(InputError, match=r"different config \(context.layout: 'append' -> 'prefix'\)"):
        evaluate(qa, out, "closed_book", split="test", layout="prefix", generator=generator,
                 retriever=retriever, faithfulness=False, progress=False, report=False)
    assert [q.id for q in load_questions(qa, "all", limit=2)] == ["q1", "q2"]
    with pytest.raises(InputError):
        load_questions(qa, "train", limit=0)


def test_a_setting_an_older_run_did_not_record_is_compared_as_its_default():
    new = RunConfig().to_dict()
    old = copy.deepcopy(new)
    del old["controller"]["restore"]  # a run recorded before the setting existed
    assert config_changes(old, new) == []
    changed = copy.deepcopy(new)
    changed["controller"]["restore"] = not new["controller"]["restore"]
    assert config_changes(old, changed) == [f"controller.restore: {new['controller']['restore']!r} -> "
                                            f"{changed['controller']['restore']!r}"]
    old["query"]["mode"] = "masked" if new["query"]["mode"] != "masked" else "sentence"
    assert [line.split(":")[0] for line in config_changes(old, new)] == ["query.mode"]


def test_retrieving_systems_need_an_explicit_index(tmp_path):
    qa = _qa_file(tmp_path / "toy")
    generator, _ = _parts()
    with pytest.raises(InputError, match="need an index"):
        evaluate(qa, tmp_path / "run", "closed_book,rag", generator=generator, progress=False)


def test_each_call_records_its_wall_time_and_the_report_sums_them(tmp_path):
    qa = _qa_file(tmp_path / "toy")
    generator, retriever = _parts()
    out = tmp_path / "run"
    evaluate(qa, out, "closed_book", split="test", limit=1, generator=generator, retriever=retriever,
             faithfulness=False, progress=False)
    evaluate(qa, out, "closed_book", split="test", generator=generator, retriever=retriever,
             faithfulness=False, progress=False)  # a resume: the second question only
    sessions = json.loads((out / "meta.json").read_text())["sessions"]
    assert [s["answers"] for s in sessions] == [1, 1]
    assert all(s["seconds"] >= 0 and s["started"] <= s["finished"] and s["workers"] == 1 for s in sessions)
    minutes = sum(s["seconds"] for s in sessions) / 60
    assert f"Wall time answering: {minutes:.1f} min in 2 session(s)" in (out / "report.md").read_text()
