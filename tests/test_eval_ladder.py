"""The model-size ladder: specs, one folder per rung, one table and one figure, rebuilt by `rigkit report`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rigkit.cli import main
from rigkit.errors import InputError
from rigkit.eval.ladder import (
    LADDER_FILE,
    NO_MODEL,
    ladder_rows,
    ladder_table,
    parse_rung,
    run_ladder,
    size_from_name,
)
from rigkit.testing import DictRetriever, ScriptedGenerator, make_segment
from rigkit.trace import Hit


def test_specs_carry_a_model_its_backend_label_and_size():
    bare = parse_rung("smollm2-135m-instruct+markers")
    assert (bare.label, bare.size, bare.settings) == ("smollm2-135m-instruct+markers", 0.135,
                                                      {"model": "smollm2-135m-instruct+markers"})
    served = parse_rung("model=qwen3:0.6b,backend=chat,base_url=http://127.0.0.1:11434/v1,label=qwen")
    assert served.label == "qwen" and served.size == 0.6
    assert served.set_args() == ["generator.model=qwen3:0.6b", "generator.backend=chat",
                                 "generator.base_url=http://127.0.0.1:11434/v1"]
    assert parse_rung("model=org/Model-7B-Instruct,size=7.6").size == 7.6
    assert size_from_name("Qwen/Qwen2.5-14B-Instruct") == 14.0 and size_from_name("my-model") is None
    for bad, message in (("backend=openai", "name the model"), ("model=x,size=big", "size must be"),
                         ("model=x,oops", "key=value"), (" ", "empty")):
        with pytest.raises(InputError, match=message):
            parse_rung(bad)


class Replies(ScriptedGenerator):
    """Right after a passage was read, wrong closed-book: 'Levy' only when the prompt holds it."""

    def __init__(self):
        super().__init__([])

    def next_segment(self, prompt, stop, max_new_tokens, on_token=None):
        text = " ".join(p.text for p in prompt)
        return make_segment("It is Shawn Levy." if "Levy" in text else "I do not know.", finish_reason="end_of_turn")


def _qa(tmp_path):
    qa = tmp_path / "qa.jsonl"
    rows = [{"id": f"q{i}", "question": f"Who directed film {i}?", "answer": "Shawn Levy", "type": "compositional",
             "paragraphs": []} for i in range(3)]
    qa.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return qa


def test_ladder_runs_each_rung_into_its_folder_and_tables_them(tmp_path, capsys):
    retriever = DictRetriever({}, default=[Hit("f#0", "f", "Film", "Directed by Shawn Levy.", 1.0)])
    out = tmp_path / "ladder"
    path = run_ladder(_qa(tmp_path), out, ["tiny-135m", "model=tiny-1.5b,label=big"], "closed_book,rag",
                      generator=Replies(), retriever=retriever, faithfulness=False, progress=False)
    assert path.name == "ladder.html" and "plotly" in path.read_text()
    assert sorted(p.name for p in out.iterdir()) == sorted(["big", LADDER_FILE, "ladder.html", "ladder.md", "tiny-135m"])
    meta = json.loads((out / "big" / "meta.json").read_text())
    assert meta["config"]["generator"]["model"] == "tiny-1.5b"  # the rung's spec reached the config
    floor, rows = ladder_rows(out)[:2], ladder_rows(out)[2:]
    # the model-free floor leads, scored on the rungs' questions: open questions, so 0 EM; echo 0 Cover EM
    assert [(r.rung, r.size, r.system, r.questions) for r in floor] == [(NO_MODEL, None, "question_only", 3),
                                                                       (NO_MODEL, None, "echo", 3)]
    assert all(r.score.value == 0.0 and r.cover_em == 0.0 and r.em_open == 0.0 and r.open_questions == 3
               and r.difference is None for r in floor)
    assert [(r.rung, r.size, r.system) for r in rows] == [
        ("tiny-135m", 0.135, "closed_book"), ("tiny-135m", 0.135, "rag"), ("big", 1.5, "closed_book"), ("big", 1.5, "rag")]
    assert rows[1].em_open == 1.0 and rows[1].open_questions == 3 and rows[0].em_open == 0.0  # short answer "Shawn Levy"
    closed = rows[0]
    # closed-book: 0 of 3 right; rag: 3 of 3; so closed_book − rag = −1 on every question
    assert closed.score.value == 0.0 and rows[1].score.value == 1.0 and rows[1].retrievals == 1.0
    assert closed.difference.difference == -1.0 and (closed.difference.wins, closed.difference.losses) == (0, 3)
    header, body = ladder_table(rows)
    assert body[0][header.index("Type-aware − rag [95%]")] == "-1.000 [-1.000, -1.000]"
    assert ladder_table(floor)[1][0][:4] == [NO_MODEL, "–", "question_only", "3"]
    # a rung that ran part of the floor itself is given only the part it lacks
    run_ladder(_qa(tmp_path), out, ["tiny-135m"], "question_only", generator=Replies(), retriever=retriever,
               faithfulness=False, progress=False)
    assert [(r.rung, r.system) for r in ladder_rows(out) if r.system in ("question_only", "echo")] == [
        (NO_MODEL, "echo"), ("tiny-135m", "question_only")]
    # the report rebuilds from the folders alone
    (out / "ladder.md").unlink()
    assert main(["report", str(out)]) == 0
    assert "| big | 1.5 | rag | 3 |" in capsys.readouterr().out and (out / "ladder.md").exists()
    # --out: the ladder's report goes there, the ladder folder is left as it was
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    elsewhere = tmp_path / "elsewhere"
    assert main(["report", str(out), "--out", str(elsewhere), "--json"]) == 0
    paths = json.loads(capsys.readouterr().out)
    assert paths == {"html": str(elsewhere / "ladder.html"), "markdown": str(elsewhere / "ladder.md")}
    assert sorted(p.name for p in elsewhere.iterdir()) == ["ladder.html", "ladder.md"]
    assert "| big | 1.5 | rag | 3 |" in (elsewhere / "ladder.md").read_text() and f"under `{out}`" in (
        elsewhere / "ladder.md").read_text()
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert main(["report", str(out), "--compare", str(out / "big")]) != 0
    assert "is a ladder folder" in capsys.readouterr().err


def test_ladder_cli_checks_specs_before_loading_a_model(tmp_path, capsys):
    code = main(["ladder", "--qa", str(_qa(tmp_path)), "--rung", "a", "--rung", "model=b,label=a",
                 "--out", str(tmp_path / "x")])
    assert code != 0 and "share a label" in capsys.readouterr().err



def test_report_rebuilds_both_files_of_the_committed_ladder(tmp_path, capsys):
    """docs/evaluation.md: `rigkit report` on the committed ladder folder rebuilds ladder.md and
    ladder.html; the rows it prints are the documented table's (model, system, questions, Cover EM)."""
    root = Path(__file__).resolve().parents[1]
    folder = root / "docs" / "results" / "ladder" / "2wikimultihopqa"
    assert main(["report", str(folder), "--out", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ladder.html", "ladder.md"]
    assert "plotly" in (tmp_path / "ladder.html").read_text(encoding="utf-8")

    def rows(text: str) -> list[tuple[str, ...]]:
        found = re.findall(r"^\| (\S+) \| [\d.]+ \| (\S+) \| (\d+) \| [^|]+ \| 0?(\.\d+) \|", text, re.MULTILINE)
        return [tuple(r) for r in found]

    doc = (root / "docs" / "evaluation.md").read_text(encoding="utf-8")
    section = doc[doc.index("### The model-size ladder"):doc.index("## What changed in the numbers")]
    rebuilt = rows((tmp_path / "ladder.md").read_text(encoding="utf-8"))
    assert len(rebuilt) == 4 and rebuilt == rows(section)


def test_a_later_ladder_run_adding_systems_keeps_the_earlier_ones_in_its_record(tmp_path):
    retriever = DictRetriever({}, default=[Hit("f#0", "f", "Film", "Directed by Shawn Levy.", 1.0)])
    out = tmp_path / "ladder"
    for systems in ("rag", "closed_book,rag"):
        run_ladder(_qa(tmp_path), out, ["tiny-135m"], systems, generator=Replies(), retriever=retriever,
                   faithfulness=False, progress=False)
    assert json.loads((out / LADDER_FILE).read_text())["systems"] == "rag,closed_book"
    assert "systems `rag,closed_book`" in (out / "ladder.md").read_text()
