"""The self-contained HTML page of a run and of a comparison, and the classroom replay switch
(no model: a saved run of the quickstart question, and runs built by hand)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rigkit.classroom import Classroom, replay_forced
from rigkit.testing import make_segment
from rigkit.trace import Decision, Hit, Query, RIGResult, RoundTrace
from rigkit.widgets import page

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "notebooks" / "runs" / "quickstart.json"


def saved_run() -> RIGResult:
    data = json.loads(SAVED.read_text(encoding="utf-8"))
    return RIGResult.from_dict(data["results"]["quickstart"])


def hand_run(answer: str, decider: str = "prob", threshold: float = 0.3, unit: str = "probability",
             rounds: int = 2) -> RIGResult:
    hit = Hit("apache#0", "apache", "Apache License 2.0", "The Apache licence allows commercial use.", 0.03,
              ranks={"bm25": 1, "dense": 2})
    traces = [RoundTrace(i, make_segment(f"Sentence {i} here.", probs=[0.9, 0.2, 0.8]),
                         Decision(i == 0, 0.8 if i == 0 else 0.1, "a token below the threshold",
                                  decider=decider, threshold=threshold, unit=unit,
                                  evidence={"min_prob": 0.123456789012}, intents=["commercial use"]),
                         query=Query("apache commercial", "masked", intent="commercial use") if i == 0 else None,
                         hits=[hit] if i == 0 else [])
              for i in range(rounds)]
    return RIGResult("May I use Apache code commercially?", answer, traces, passages=[hit])


def test_run_page_is_self_contained_and_shows_every_round():
    result = saved_run()
    text = page.run_page(result)
    assert text.startswith("<!DOCTYPE html>")
    assert page.external_references(text) == []
    assert not re.search(r"<script|<link|@import", text, re.IGNORECASE)
    n = len(result.rounds)
    for i in range(1, n + 1):
        assert f"Round {i} of {n}" in text
    assert "[[citation:" not in text  # citations are numbered superscripts linked to passages
    assert re.search(r'<sup class="rig-cite"><a href="#(rig\d+)-p1" title="[^"]+">\[1\]</a></sup>', text)
    anchor = re.search(r'href="#(rig\d+-p1)"', text).group(1)
    assert f'id="{anchor}"' in text
    assert "threshold 0.3 probability" in text


def _same_ids(text: str) -> str:
    """`text` with its element ids made alike: each view numbers them from a process-wide counter."""
    return re.sub(r"\brig\d+", "rigN", text)


def test_a_result_exports_itself_as_the_run_page(tmp_path):
    result = saved_run()
    for lecture in (False, True):
        assert _same_ids(result.to_html(lecture=lecture)) == _same_ids(page.run_page(result, lecture=lecture))
    assert 'class="rigkit-page lecture"' in result.to_html(lecture=True)
    target = tmp_path / "handout" / "run.html"
    assert result.save_html(target, lecture=True) == target
    assert _same_ids(target.read_text(encoding="utf-8")) == _same_ids(page.run_page(result, lecture=True))
    assert [p.name for p in target.parent.iterdir()] == ["run.html"]  # no temporary file left


def test_a_page_killed_while_saving_leaves_the_old_page_whole(tmp_path):
    """SIGKILL after the new page is written to its temporary file, before the rename."""
    target = tmp_path / "run.html"
    target.write_text("the old page", encoding="utf-8")
    code = ("import json, sys; from rigkit.trace import RIGResult; "
            "data = json.loads(open(sys.argv[1], encoding='utf-8').read()); "
            "RIGResult.from_dict(data['results']['quickstart']).save_html(sys.argv[2])")
    env = {**os.environ, "RIGKIT_FAULT_AT": "atomic:fsync", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code, str(SAVED), str(target)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert target.read_text(encoding="utf-8") == "the old page"
    left = [p for p in tmp_path.iterdir() if p != target]
    assert len(left) == 1 and left[0].read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_external_references_finds_a_cdn_script():
    assert page.external_references('<script src="https://cdn.plot.ly/p.js"></script>') == [
        "https://cdn.plot.ly/p.js"]
    assert page.external_references("<style>a{background:url(http://x/y.png)}</style>") == ["http://x/y.png"]


def test_lecture_page_folds_evidence_and_budget_and_rounds_numbers():
    text = page.run_html(hand_run("Yes."), lecture=True)
    assert 'class="rigkit-page lecture"' in text
    assert '<details class="rig-evidence">' in text and '<details class="rig-budget">' in text
    assert "0.123" in text and "0.123456789" not in text
    # the intent is shown once: the query pane's, not again under the decision
    first = text.split('rig-round rig-round-0">')[1].split("</section>")[0]
    assert "intent: commercial use" in first and "intents:" not in first


def test_heatmap_toggle_has_both_scales_and_one_marking_per_token():
    result = hand_run("Yes.")
    result.rounds[0].decision.spans = [__import__("rigkit.trace", fromlist=["Span"]).Span(1, 2, " 0")]
    text = page.run_html(result)
    assert "1 − probability" in text and "nats" in text
    assert 'rig-scale-p' in text and 'rig-scale-h' in text
    tokens = re.findall(r'<span class="rig-token([^"]*)"', text)
    assert tokens and all(len(t.split()) <= 1 for t in tokens)  # marker, span or nothing: never two
    assert any("rig-span" in t for t in tokens)
    assert re.search(r'title="p = 0\.20 · entropy = [^"]+ nats"', text)


def test_word_diff_marks_only_the_changed_words():
    left, right = page.word_diff_html("You must include the NOTICE file.", "You must include the LICENSE.")
    assert left == "You must include the <del>NOTICE file.</del>"
    assert right == "You must include the <ins>LICENSE.</ins>"


def test_comparison_aligns_rounds_and_shows_each_deciders_threshold_in_its_unit():
    runs = {"rig:prob": hand_run("Yes, with the NOTICE file.", rounds=3),
            "rig:entropy": hand_run("Yes, with the LICENSE.", decider="entropy", threshold=1.5, unit="nats")}
    text = page.page(page.comparison_html(runs, lecture=True))
    assert page.external_references(text) == []
    assert len(re.findall(r'class="rig-compare-round"', text)) == 3
    assert "threshold 0.3 probability" in text and "threshold 1.5 nats" in text
    assert "<del>NOTICE file.</del>" in text and "<ins>LICENSE.</ins>" in text
    assert text.count('<td class="rig-muted">–</td>') == 1  # entropy's run had no third round


def test_threshold_label():
    assert page.threshold_label(Decision(True, 1, "", threshold=24, unit="tokens")) == "24 tokens"
    assert page.threshold_label(Decision(True, 1, "")) == ""


def test_classroom_replays_saved_runs_and_the_environment_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("RIGKIT_REPLAY", "1")
    assert replay_forced() is True
    room = Classroom(replay=False, folder=SAVED.parent)
    assert room.replay
    assert room.live(lambda: pytest.fail("replay must not build a model")) is None
    result = room.run("quickstart", lambda: pytest.fail("replay must not run the model"))
    assert result.question.startswith("Can I use code under the Apache-2.0")
    with pytest.raises(FileNotFoundError, match="python -m rigkit.classroom record nothing"):
        Classroom(folder=tmp_path).run("nothing", lambda: None)
    monkeypatch.setenv("RIGKIT_REPLAY", "0")
    live = Classroom(replay=True)
    assert not live.replay and live.run("x", lambda: hand_run("Yes.")).answer == "Yes."


def test_every_saved_run_loads():
    from rigkit.classroom import FOLDERS, RECIPES
    from rigkit.eval import load_run

    for path in sorted(SAVED.parent.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["recipe"] in RECIPES, path.name
        for result in data["results"].values():
            assert RIGResult.from_dict(result).rounds, path.name
    for name, (_, keep) in FOLDERS.items():
        saved = SAVED.parent / name
        assert sorted(p.name for p in saved.iterdir()) == sorted(keep), name
        assert load_run(saved)[1], name


def test_classroom_results_and_folders_replay_a_copy_and_run_live(monkeypatch, tmp_path):
    monkeypatch.setenv("RIGKIT_REPLAY", "1")
    saved = tmp_path / "saved"
    (saved / "evaluation").mkdir(parents=True)
    (saved / "evaluation" / "results.jsonl").write_text("{}\n", encoding="utf-8")
    room = Classroom(folder=saved)
    out = room.folder("evaluation", tmp_path / "work", lambda _: pytest.fail("replay must not evaluate"))
    (out / "results.jsonl").write_text("changed\n", encoding="utf-8")
    assert (saved / "evaluation" / "results.jsonl").read_text(encoding="utf-8") == "{}\n"  # a copy
    with pytest.raises(FileNotFoundError, match="python -m rigkit.classroom record missing"):
        room.folder("missing", tmp_path / "other", lambda _: None)
    (saved / "two.json").write_text(json.dumps({"recipe": "two", "results": {
        "a": hand_run("A.").to_dict(), "b": hand_run("B.").to_dict()}}), encoding="utf-8")
    assert room.result("two", "b", lambda: pytest.fail("replay must not run")).answer == "B."
    monkeypatch.setenv("RIGKIT_REPLAY", "0")
    live = Classroom(folder=saved)
    made = live.folder("evaluation", tmp_path / "live", lambda into: into.mkdir())
    assert made.is_dir() and not list(made.iterdir())
    assert live.result("two", "a", lambda: hand_run("Live.")).answer == "Live."


def test_record_refuses_an_unknown_recipe_in_one_line(capsys):
    from rigkit.classroom import main

    assert main(["record", "nothing", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown recipe 'nothing'" in err and "evaluation" in err


def test_ask_and_compare_refuse_bad_input_in_one_line(cli, tmp_path):
    run = cli("compare", "What?", "--systems", "rag,nonsense")
    assert run.returncode == 2 and "unknown system 'nonsense'" in run.stderr and "Traceback" not in run.stderr
    run = cli("ask", "What?", "--html", str(tmp_path))
    assert run.returncode == 2 and "is a folder" in run.stderr


@pytest.mark.slow
def test_compare_writes_one_offline_page_with_both_systems(cli, tmp_path):
    out = tmp_path / "compare.html"
    run = cli("compare", "Can I use Apache-2.0 code in a commercial product?", "--config",
              "configs/cpu.yaml", "--systems", "rag,rig:entropy", "--set", "generator.max_answer_tokens=32",
              "--html", str(out), "--lecture")
    assert run.returncode == 0, run.stderr
    text = out.read_text(encoding="utf-8")
    assert page.external_references(text) == []
    assert '<th class="rig-system">rag' in text and '<th class="rig-system">rig:entropy' in text
    assert re.search(r"threshold [\d.]+ nats", text)  # entropy at its own default, in its unit
    assert re.search(r"rig:entropy \[entropy [\d.]+ nats\]: ", run.stdout)


def test_an_in_process_segment_records_what_the_model_nearly_wrote_and_the_views_show_it():
    pytest.importorskip("torch")
    from rigkit.transcript import Piece, StopRule
    from rigkit.widgets import render
    from tests.tiny_model import tiny_generator

    gen = tiny_generator()
    segment = gen.next_segment([Piece(gen.render_chat([{"role": "user", "content": "the code"}], True),
                                      role="question")], StopRule(sentence=False), 6)
    assert segment.tokens and len(segment.alternatives) == len(segment.tokens)
    for i, choices in enumerate(segment.alternatives):
        probs = list(choices.values())
        assert 1 <= len(choices) <= 3 and probs == sorted(probs, reverse=True)
        assert abs(probs[0] - probs[1] - segment.margins[i]) < 1e-3  # the margin is top-1 minus top-2
    first = next(iter(segment.alternatives[0]))
    assert render.esc("top choices: " + repr(first)) in page.run_html(_result_with(segment))
    assert "top choices: " in render.segment_html(segment)


def _result_with(segment):
    rounds = [RoundTrace(index=0, segment=segment, decision=Decision(retrieve=False, score=0.1, reason="ok"))]
    return RIGResult(question="the code", answer=segment.text, rounds=rounds)
