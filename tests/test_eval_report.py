"""Report tests: the Markdown and the self-contained HTML carry the aggregated numbers."""

from __future__ import annotations

import json
import re

import pytest

from rigkit.cli import main
from rigkit.errors import InputError
from rigkit.eval.aggregate import aggregate
from rigkit.eval.report import markdown_report, report_figures, write_report
from rigkit.eval.runner import RESULTS_FILE


def _rows() -> list[dict]:
    rows = []
    for run in range(2):
        for i, qtype in enumerate(["comparison", "compositional", "comparison"]):
            for system, em, retrievals in (("closed_book", 0.0, 0), ("rig:prob", 1.0, 2)):
                rows.append({
                    "id": f"q{i}", "type": qtype, "system": system, "run": run, "seed": run,
                    "em": em if (i + run) % 2 == 0 else 0.0, "f1": 0.5, "cover_em": em,
                    "support_recall": None if system == "closed_book" else 0.5,
                    "retrievals": retrievals + i % 2, "trigger_rate": 0.25,
                    "tokens_prefilled": 100 + 10 * i, "tokens_reused": 50, "latency": 1.0 + i,
                    "timings": {"generate": 0.8 + i, "retrieve": 0.1 if retrievals else 0.0},
                    "error": None,
                })
    return rows


def _write(folder, rows, tail: str = "") -> None:
    folder.mkdir(exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows) + tail
    (folder / RESULTS_FILE).write_text(text)
    (folder / "meta.json").write_text(json.dumps({"qa": "data/toy/qa.jsonl", "split": "all",
                                                  "config": {}, "model": {"spec": "tiny"}}))


def test_markdown_has_the_aggregated_numbers():
    rows = _rows()
    text = markdown_report({"split": "all"}, rows)
    groups = {(g.system, g.type): g for g in aggregate(rows)}
    rig = groups["rig:prob", "all"]
    em = f"{rig.mean['em']:.3f} ± {rig.spread['em']:.3f}"
    line = next(x for x in text.splitlines() if x.startswith("| rig:prob | 3 | 2 |"))
    assert em in line
    # The closed-book row shows a dash where the metric is undefined, not a zero.
    closed = next(x for x in text.splitlines() if x.startswith("| closed_book | 3 | 2 |"))
    assert "–" in closed
    assert "| rig:prob | comparison | 2 | 2 |" in text
    assert f"{groups['closed_book', 'all'].latency_p95:.2f}" in text


def test_the_model_line_names_the_source_the_answers_recorded():
    """A served model's source is known once it has answered ("?" in the meta written before)."""
    rows = [{**r, "model": {"spec": "served", "source": "openai-compatible URL (token-id prompts)"}}
            for r in _rows()]
    text = markdown_report({"split": "all", "model": {"spec": "served", "source": "openai-compatible URL (?)"}}, rows)
    assert "(source: openai-compatible URL (token-id prompts))" in text
    assert "(source: in-process)" in markdown_report({"model": {"spec": "tiny", "source": "in-process"}}, _rows())


def test_report_figures_have_data_from_the_rows():
    figs = report_figures(_rows())
    assert len(figs) == 4
    hist = figs["Retrievals per question"]
    assert sorted(hist.data[1].x) == sorted(r["retrievals"] for r in _rows()
                                            if r["system"] == "rig:prob")
    latency = figs["Latency per question by stage"]
    assert [t.name for t in latency.data][:2] == ["generate", "retrieve"]


def test_write_report_is_self_contained_and_tolerates_a_torn_line(tmp_path):
    folder = tmp_path / "run"
    _write(folder, _rows(), tail='{"id": "q9", "system": "rag", "ru')
    path = write_report(folder)
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert len(html) > 1_000_000  # plotly.js is inline, not fetched
    assert not re.search(r"<script[^>]+src=[\"']https?://", html)
    assert html.count("Plotly.newPlot") == 4
    for title in ("Accuracy by system and question type", "Latency per question by stage",
                  "Retrievals per question", "Accuracy (F1) vs retrievals"):
        assert title in html
    assert "rag" not in {r for r in re.findall(r"<td>([^<]+)</td>", html)}  # torn line ignored
    md = (folder / "report.md").read_text()
    assert md == markdown_report(json.loads((folder / "meta.json").read_text()), _rows())
    assert not [p for p in folder.iterdir() if p.name.startswith(".report")]
    assert path.stat().st_mode & 0o044  # readable by others, unlike a bare mkstemp file


def test_cli_report_and_errors(tmp_path, capsys):
    folder = tmp_path / "run"
    _write(folder, _rows())
    assert main(["report", str(folder), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["html"].endswith("report.html")
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "holds no results.jsonl" in capsys.readouterr().err
    assert main(["eval", "--qa", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o"),
                 "--systems", "closed_book"]) == 2
    assert main(["eval", "--qa", "x", "--out", "o", "--systems", "rig:nosuch"]) == 2


def test_write_report_needs_results(tmp_path):
    with pytest.raises(InputError):
        write_report(tmp_path)


def test_compared_runs_join_as_labelled_systems_paired_against_the_first(tmp_path, capsys):
    base, other = tmp_path / "base", tmp_path / "rerank"
    rows = [{**r, "system": "rag" if r["system"] == "closed_book" else r["system"], "support_recall": 0.5}
            for r in _rows() if r["run"] == 0]
    _write(base, rows)
    _write(other, [{**r, "cover_em": 1.0} for r in rows])
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "config": {"retrieval": {"rerank": "upr"}}}))
    out = tmp_path / "both"
    assert main(["report", str(base), "--compare", f"{other}=rerank", "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert not (base / "report.md").exists()  # the run folders are read, not written
    assert "`[rerank]`: the systems of" in text and "`retrieval.rerank: upr`" in text
    paired = next(x for x in text.splitlines() if x.startswith("| rag [rerank] | Cover EM | 3 |"))
    assert "+1.000" in paired and "3 / 0" in paired  # every question won against the first run's rag
    assert "| rig:prob [rerank] | 3 | 1 |" in text
    elsewhere = tmp_path / "other-split"
    _write(elsewhere, rows)
    (elsewhere / "meta.json").write_text(json.dumps({**meta, "split": "test"}))
    with pytest.raises(InputError, match="not over the same questions.*split 'test' vs 'all'"):
        write_report(base, compare=[str(elsewhere)])


def test_a_corrupt_meta_json_is_one_line_naming_it(tmp_path, capsys):
    folder = tmp_path / "run"
    _write(folder, _rows())
    (folder / "meta.json").write_text('{"config": {"retrieval":\n  {"rerank": "upr"\n')  # cut off mid-write
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{folder / 'meta.json'}:3: not valid JSON" in lines[0], err
    assert "Traceback" not in err and "JSONDecodeError" not in err
