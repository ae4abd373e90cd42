"""The no-model floor beside every report: `question_only` and `echo` answered on a run's own
questions, so a table that lacks them (an old run, a rung) still shows what no model scores."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rigkit.config import RunConfig
from rigkit.eval.baselines import BASELINES
from rigkit.eval.metrics import QAItem
from rigkit.eval.runner import answer_row
from rigkit.eval.systems import build_system, parse_system

__all__ = ["floor_rows", "missing_floor", "with_floor"]


def floor_rows(rows: Sequence[dict[str, Any]], systems: Sequence[str] = BASELINES) -> list[dict[str, Any]]:
    """The no-model `systems` answered and scored (as `rigkit eval` would) on the questions of
    `rows` (result lines: id, question, gold, type), one line per question each."""
    questions = {}
    for row in rows:
        if row.get("question") and row.get("gold"):
            questions.setdefault(str(row["id"]), row)
    config = RunConfig()
    out = []
    for name in systems:
        system = build_system(parse_system(name), config, None, None)
        for qid, row in questions.items():
            gold = list(row["gold"])
            item = QAItem(qid, row["question"], gold[0], tuple(gold[1:]), type=row.get("type") or "",
                          dataset=row.get("dataset") or "")
            out.append(answer_row(system, item, 0, 0, None)[0])
    return out


def missing_floor(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The no-model systems `rows` lack (a compared `question_only [label]` counts as present)."""
    present = {str(r.get("system", "")).split(" [")[0] for r in rows}
    return [name for name in BASELINES if name not in present]


def with_floor(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with whichever of `question_only` and `echo` they lack answered on the same
    questions, after them."""
    missing = missing_floor(rows)
    if not missing:
        return list(rows)
    return [*rows, *({**row, "answered_by": "report"} for row in floor_rows(rows, missing))]
