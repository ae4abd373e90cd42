"""Report figures read the metric columns the result lines carry, by their names."""

from __future__ import annotations

import re

from rigkit.eval import figures
from rigkit.eval.aggregate import aggregate
from rigkit.eval.report import html_report, report_figures


def _rows() -> list[dict]:
    rows = []
    for run in range(2):
        for i in range(4):
            for system in ("closed_book", "rig:prob"):
                rig = system != "closed_book"
                failed = rig and i == 3  # every retrieval of this answer failed
                rows.append({
                    "id": f"q{i}", "type": "comparison", "system": system, "run": run, "seed": run,
                    "em": 0.0, "em_extracted": 1.0 if rig and i < 2 else 0.0, "f1": 0.4, "cover_em": 0.5,
                    "retrievals": 0 if failed or not rig else 1 + i % 2, "latency": 1.0,
                    "citation_precision": 0.5 if rig else None,
                    "all_sentences_supported": (i % 2 == 0) if rig else None,
                    "supported_sentences": 1 if rig else None, "answer_sentences": 2 if rig else None,
                    "sentence_support_share": 0.5 if rig else None,
                    "retrieval_errors": ["round 0: ConnectionError: down"] if rig and i >= 2 else [],
                    "retrieval_failed": failed, "timings": {"generate": 1.0}, "error": None,
                })
    return rows


def test_accuracy_figure_shows_extracted_em_beside_raw_em():
    fig = figures.accuracy_figure(aggregate(_rows()))
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:2] == ["EM", "EM (extracted)"]
    rig = [t for t in fig.data if t.name == "rig:prob"]
    assert rig[0].y[0] == 0.0 and rig[1].y[0] > 0.0  # raw EM 0, extracted EM not


def test_support_figure_uses_the_new_metric_names():
    groups = aggregate(_rows())
    fig = figures.support_figure(groups)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {label for _, label in figures.SUPPORT}
    share = by_name["Sentence support share (per sentence)"]
    assert list(share.x) == ["closed_book", "rig:prob"] and share.y[1] == 0.5 and share.y[0] is None
    # questions 0 and 2 of 0..2: the answer whose every retrieval failed is not a RIG answer
    assert by_name["All sentences supported (per question)"].y[1] == 2 / 3


def test_retrieval_errors_are_drawn_and_failed_answers_are_not_counted_as_retrievals():
    rows = _rows()
    figs = report_figures(rows)
    errors = figs["Retrieval errors"]
    assert errors.data[0].y[list(errors.data[0].x).index("rig:prob")] == 4  # 2 answers x 2 runs
    assert errors.data[1].y[list(errors.data[1].x).index("rig:prob")] == 2
    hist = next(t for t in figs["Retrievals per question"].data if t.name == "rig:prob")
    assert len(hist.x) == 6  # the two all-failed answers are left out


def test_report_without_the_new_columns_keeps_its_four_figures():
    rows = [{k: v for k, v in r.items() if k not in ("citation_precision", "all_sentences_supported",
             "sentence_support_share", "supported_sentences", "answer_sentences",
             "retrieval_errors", "retrieval_failed")} for r in _rows()]
    assert len(report_figures(rows)) == 4


def test_html_report_with_every_figure_is_self_contained():
    text = html_report({"split": "test"}, _rows())
    assert text.count("Plotly.newPlot") == 6
    assert not re.search(r"<script[^>]+src=[\"']https?://", text)
    assert text.count("plotly.js v") <= 2  # the library is inlined once
