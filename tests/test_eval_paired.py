"""Paired comparisons: the bootstrap interval and the exact test, checked against references."""

from __future__ import annotations

import json

import numpy as np
import pytest
from statsmodels.stats.contingency_tables import mcnemar

from rigkit.cli import main
from rigkit.errors import InputError
from rigkit.eval.paired import compare_systems, mcnemar_exact, paired_bootstrap
from rigkit.eval.report import markdown_report, report_figures, write_report
from rigkit.eval.runner import RESULTS_FILE

# 40 questions: per-question Cover EM of a system and of its baseline (fixed, not random at test time)
SYSTEM = [1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 1, 1,
          1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1]
BASELINE = [1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 0, 1, 1,
            0, 0, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0]


def _contingency(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return [[int(((a == 1) & (b == 1)).sum()), int(((a == 1) & (b == 0)).sum())],
            [int(((a == 0) & (b == 1)).sum()), int(((a == 0) & (b == 0)).sum())]]


@pytest.mark.parametrize("wins, losses", [(11, 1), (10, 16), (0, 0), (3, 3), (0, 7), (25, 40)])
def test_exact_test_equals_statsmodels_mcnemar(wins, losses):
    table = [[5, wins], [losses, 9]]
    assert mcnemar_exact(wins, losses) == pytest.approx(mcnemar(table, exact=True).pvalue, abs=1e-12)


def test_fixture_test_matches_statsmodels_on_the_contingency_table():
    table = _contingency(SYSTEM, BASELINE)
    assert table[0][1] == 11 and table[1][0] == 1  # the fixture's discordant pairs
    expected = mcnemar(table, exact=True).pvalue
    (row,) = compare_systems(_rows(), "rag", ["cover_em"])
    assert (row.wins, row.losses, row.pairs) == (11, 1, 40)
    assert row.p_value == pytest.approx(expected, abs=1e-12)
    assert row.p_value == pytest.approx(0.00634765625)  # 2 * P(X <= 1), X ~ Bin(12, 0.5)


def _numpy_bootstrap(a, b, resamples=20_000, seed=7):
    """An independent percentile bootstrap over questions: resample indices, mean difference."""
    diff = np.asarray(a, float) - np.asarray(b, float)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)
    return np.percentile(means, [2.5, 97.5])


def test_bootstrap_interval_agrees_with_an_independent_resampling():
    difference, low, high = paired_bootstrap(SYSTEM, BASELINE)
    assert difference == pytest.approx(10 / 40)
    ref_low, ref_high = _numpy_bootstrap(SYSTEM, BASELINE)
    # two Monte Carlo estimates of the same percentiles: within a question's weight (1/40)
    assert low == pytest.approx(ref_low, abs=0.026) and high == pytest.approx(ref_high, abs=0.026)
    assert low < difference < high and low > 0  # this fixture's gain is clear of 0


def test_bootstrap_is_reproducible_and_handles_constant_differences():
    assert paired_bootstrap(SYSTEM, BASELINE) == paired_bootstrap(SYSTEM, BASELINE)
    assert paired_bootstrap([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]) == (0.25, 0.25, 0.25)
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [0.0])


def _rows() -> list[dict]:
    rows = []
    for i, (mine, theirs) in enumerate(zip(SYSTEM, BASELINE)):
        for system, value in (("rag", theirs), ("rig:prob", mine)):
            rows.append({"id": f"q{i}", "system": system, "run": 0, "type": "bridge",
                         "cover_em": float(value), "f1": 0.5 * value, "error": None})
    return rows


def test_pairs_skip_errors_and_average_runs():
    rows = _rows()
    rows[1]["error"] = "boom"  # q0 of rig:prob failed: that question leaves the comparison
    rows.append({"id": "q2", "system": "rig:prob", "run": 1, "cover_em": 1.0, "f1": 0.5, "error": None})
    by_metric = {c.metric: c for c in compare_systems(rows, "rag", ["cover_em", "f1"])}
    assert by_metric["cover_em"].pairs == 39
    # q0 was a tie; q2 was a tie (0 vs 0) until run 1 scored 1: its mean 0.5 beats rag's 0
    assert by_metric["cover_em"].wins == 12
    assert by_metric["f1"].difference == pytest.approx(by_metric["cover_em"].difference / 2)


def test_report_shows_the_paired_table_and_figure(tmp_path):
    rows = _rows()
    text = markdown_report({}, rows)
    assert "## Paired against rag" in text
    line = next(x for x in text.splitlines() if x.startswith("| rig:prob | Cover EM | 40 |"))
    assert "+0.250" in line and "11 / 1" in line and "0.00635" in line
    assert any(title.startswith("Difference from rag") for title in report_figures(rows))
    # no baseline among the systems: no paired table, and naming a missing one is an error
    alone = [r for r in rows if r["system"] != "rag"]
    assert "Paired against" not in markdown_report({}, alone)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match="not a system of this run; its systems: rag, rig:prob"):
        write_report(folder, baseline="always")
    assert main(["report", str(folder), "--baseline", "rig:prob", "--json"]) == 0
    assert "Paired against rig:prob" in (folder / "report.md").read_text()


def test_quality_is_read_beside_cost():
    rows = _rows()
    for row in rows:
        row.update(retrievals=1 if row["system"] == "rag" else 2, latency=1.5, tokens_prefilled=300)
    table = markdown_report({}, rows).split("## Quality beside cost", 1)[1].split("##", 1)[0]
    lines = [x for x in table.splitlines() if x.startswith("|")]
    # columns nobody defined (support recall, extra calls here) are left out, latency comes last
    assert lines[0] == "| System | Questions | Runs | Cover EM | F1 | Retrievals/q | Prefilled | Latency p50 (s) |"
    assert lines[3] == "| rig:prob | 40 | 1 | 0.675 | 0.338 | 2.00 | 300 | 1.50 |"


def test_model_calls_are_read_from_new_lines_and_derived_for_older_ones():
    rows = _rows()
    for i, row in enumerate(rows):
        row.update(retrievals=1, segments=2, extra_model_calls=1 if row["system"] == "rig:prob" else 0)
        if i % 2:  # a line written since: its own figure wins
            row["model_calls"] = row["segments"] + row["extra_model_calls"]
    table = markdown_report({}, rows).split("## Quality beside cost", 1)[1].split("##", 1)[0]
    lines = [x for x in table.splitlines() if x.startswith("|")]
    assert "Model calls" in lines[0]
    column = lines[0].split("|").index(" Model calls ")
    calls = {line.split("|")[1].strip(): line.split("|")[column].strip() for line in lines[2:]}
    assert calls == {"rag": "2.00", "rig:prob": "3.00"}


def _section(text: str, title: str) -> list[str]:
    body = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return [x for x in body.splitlines() if x.startswith("|")]


def test_the_glance_table_puts_each_systems_paired_difference_beside_its_cost():
    lines = _section(markdown_report({}, _rows()), "Against rag at a glance")
    assert "Cover EM − rag [95%]" in lines[0] and "Wins / losses, p" in lines[0]
    rig = next(x for x in lines if x.startswith("| rig:prob |"))
    (cover,) = compare_systems(_rows(), "rag", ["cover_em"])
    assert f"+0.250 [{cover.low:+.3f}, {cover.high:+.3f}]" in rig and "11 / 1, p=0.0063" in rig
    assert next(x for x in lines if x.startswith("| rag |")).endswith("|  |  |  |  |")  # no self-pairing


def test_question_types_show_their_counts_and_each_systems_wins_and_losses():
    rows = _rows()
    for row in rows:
        row["type"] = "bridge" if int(row["id"][1:]) < 15 else "comparison"
    lines = _section(markdown_report({}, rows), "Cover EM by question type")
    assert lines[0] == "| Type | Questions | rag | rig:prob |"
    for qtype, ids in (("bridge", range(15)), ("comparison", range(15, 40))):
        mine, theirs = [SYSTEM[i] for i in ids], [BASELINE[i] for i in ids]
        wins = sum(a > b for a, b in zip(mine, theirs))
        losses = sum(a < b for a, b in zip(mine, theirs))
        assert (f"| {qtype} | {len(mine)} | {sum(theirs) / len(theirs):.3f} | "
                f"{sum(mine) / len(mine):.3f} ({wins} / {losses}) |") in lines
