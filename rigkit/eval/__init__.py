"""Evaluation harness: closed-book vs RAG vs RIG on multi-hop QA, resumable, with a report.

`evaluate(qa, out, systems, ...)` runs it from Python; `rigkit eval` / `rigkit report` from the
shell. Metrics live in `metrics`, aggregation in `aggregate`, the system grammar in `systems`,
the streaming JSONL runner in `runner`, and the Markdown + HTML report in `report`.
"""

from __future__ import annotations

from rigkit.eval.aggregate import METRICS, GroupStats, aggregate
from rigkit.eval.experiment import evaluate, load_questions
from rigkit.eval.metrics import FaithfulnessScorer, QAItem, score_result
from rigkit.eval.report import load_run, markdown_report, report_figures, write_report
from rigkit.eval.runner import read_results, run_eval
from rigkit.eval.systems import System, SystemSpec, build_systems, parse_systems

__all__ = [
    "METRICS",
    "GroupStats",
    "aggregate",
    "evaluate",
    "load_questions",
    "FaithfulnessScorer",
    "QAItem",
    "score_result",
    "load_run",
    "markdown_report",
    "report_figures",
    "write_report",
    "read_results",
    "run_eval",
    "System",
    "SystemSpec",
    "build_systems",
    "parse_systems",
]
