"""Aggregate per-question result lines into the table every RIG write-up ends with.

A metric's figure for a group (system, or system x question type) is computed per run, as the
mean over that run's questions where the metric is defined, and the table shows the mean of
those run means with their spread (sample standard deviation across runs; none for one run).
Latency percentiles pool every question of every run. Lines that recorded an error are counted
and left out of the figures, never scored as wrong answers.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["METRICS", "POOLED", "GroupStats", "aggregate", "percentile", "question_type", "row_field", "stage_names"]

# (key in a result line, column label, format). The order is the report's column order.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("em_short", "EM (short answer)", "{:.3f}"),
    ("f1_short", "F1 (short answer)", "{:.3f}"),
    ("em_open", "EM open (short)", "{:.3f}"),  # on open questions only (not yes/no, not two-option)
    ("f1_open", "F1 open (short)", "{:.3f}"),
    ("em", "EM", "{:.3f}"),
    ("f1", "F1", "{:.3f}"),
    ("em_extracted", "EM (extracted)", "{:.3f}"),
    ("f1_extracted", "F1 (extracted)", "{:.3f}"),
    ("cover_em", "Cover EM", "{:.3f}"),
    ("type_aware", "Type-aware", "{:.3f}"),
    ("support_recall", "Support recall", "{:.3f}"),
    ("support_recall_pid", "Support recall (pid)", "{:.3f}"),
    ("retrievals", "Retrievals/q", "{:.2f}"),
    ("trigger_rate", "Trigger rate", "{:.2f}"),
    ("passages_injected", "Passages", "{:.1f}"),
    ("tokens_injected", "Tokens injected", "{:.0f}"),
    ("tokens_prefilled", "Prefilled", "{:.0f}"),
    ("tokens_reused", "Reused", "{:.0f}"),
    ("forward_passes", "Forward passes", "{:.0f}"),
    ("extra_model_calls", "Extra calls", "{:.2f}"),
    ("model_calls", "Model calls", "{:.2f}"),
    ("citation_precision", "Citation precision", "{:.3f}"),
    ("all_sentences_supported", "All sentences supported", "{:.3f}"),
    ("sentence_support_share", "Sentence support share", "{:.3f}"),
    ("latency", "Latency s", "{:.2f}"),
    # what the loop's guards did per answer, and the final text's repeats and unfinished endings
    ("fallbacks", "Fallbacks/q", "{:.2f}"),
    ("repeats_cut", "Repeats cut/q", "{:.2f}"),
    ("query_guard_hits", "Query guards/q", "{:.2f}"),
    ("trimmed", "Trimmed", "{:.3f}"),
    ("unsupported_flagged", "Unsupported flagged/q", "{:.2f}"),
    ("grounded_rewrites", "Grounded rewrites/q", "{:.2f}"),
    ("grounded_kept", "Grounded kept/q", "{:.2f}"),
    ("repeated_sentences", "Repeated sentences/q", "{:.3f}"),
    ("ends_mid_sentence", "Ends mid-sentence", "{:.3f}"),
    ("cut_mid_sentence", "Cut mid-sentence", "{:.3f}"),
)

# Shares of a count, pooled over a run's questions (sum / sum) rather than averaged per question:
# a per-sentence figure must weigh a five-sentence answer five times a one-sentence answer.
POOLED: dict[str, tuple[str, str]] = {
    "sentence_support_share": ("supported_sentences", "answer_sentences"),
}

ALL_TYPES = "all"


@dataclass
class GroupStats:
    """Figures for one system over one question type (`type == "all"` for every question)."""

    system: str
    type: str
    questions: int
    runs: int
    errors: int = 0
    retrieval_error_rounds: int = 0  # rounds whose retrieval failed (recorded, not raised)
    retrieval_failed: int = 0  # answers whose every retrieval failed: left out of the means
    policies: list[str] = field(default_factory=list)  # continue / regenerate, as the runs used
    mean: dict[str, float | None] = field(default_factory=dict)
    spread: dict[str, float | None] = field(default_factory=dict)  # std of run means
    latency_p50: float | None = None
    latency_p95: float | None = None
    stages: dict[str, float] = field(default_factory=dict)  # mean seconds per question

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; None for no values."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


# Figures that result lines written before them lack, derived from the fields those lines have.
DERIVED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "model_calls": lambda row: (row["segments"] + row["extra_model_calls"]
                                if "segments" in row and "extra_model_calls" in row else None),
}


def _value(row: dict[str, Any], key: str) -> float | None:
    value = DERIVED[key](row) if key not in row and key in DERIVED else row.get(key)
    if value is None or isinstance(value, (dict, list, str)):
        return None
    return float(value)


def stage_names(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Every latency stage that occurs, in first-seen order."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.get("timings") or {}))
    return list(names)


def _run_value(rows: list[dict[str, Any]], key: str) -> float | None:
    """One run's figure for `key`: the mean over questions where defined, or a pooled share."""
    if key in POOLED:
        part, whole = POOLED[key]
        pairs = [(_value(r, part), _value(r, whole)) for r in rows]
        pairs = [(p, w) for p, w in pairs if p is not None and w]
        return sum(p for p, _ in pairs) / sum(w for _, w in pairs) if pairs else None
    values = [v for v in (_value(r, key) for r in rows) if v is not None]
    return statistics.fmean(values) if values else None


def row_field(row: dict[str, Any], key: str) -> Any:
    """A per-answer field; rows written before it was lifted keep it in their summary."""
    return row[key] if key in row else (row.get("summary") or {}).get(key)


def _group(system: str, qtype: str, rows: list[dict[str, Any]], stages: list[str]) -> GroupStats:
    answered = [r for r in rows if not r.get("error")]
    good = [r for r in answered if not row_field(r, "retrieval_failed")]
    by_run: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in good:
        by_run[int(row.get("run", 0))].append(row)
    stats = GroupStats(system, qtype, questions=len({r["id"] for r in rows}), runs=len(by_run),
                       errors=len(rows) - len(answered),
                       retrieval_error_rounds=sum(len(row_field(r, "retrieval_errors") or []) for r in answered),
                       retrieval_failed=len(answered) - len(good),
                       # closed-book and RAG answers never retrieve mid-answer: no policy to show
                       policies=sorted({row_field(r, "policy") for r in answered
                                        if system.startswith("rig") and row_field(r, "policy")}))
    for key, _, _ in METRICS:
        run_means = []
        for run_rows in by_run.values():
            value = _run_value(run_rows, key)
            if value is not None:
                run_means.append(value)
        stats.mean[key] = statistics.fmean(run_means) if run_means else None
        stats.spread[key] = statistics.stdev(run_means) if len(run_means) > 1 else None
    latencies = [float(r["latency"]) for r in good if r.get("latency") is not None]
    stats.latency_p50, stats.latency_p95 = percentile(latencies, 50), percentile(latencies, 95)
    for stage in stages:
        values = [float((r.get("timings") or {}).get(stage, 0.0)) for r in good]
        stats.stages[stage] = statistics.fmean(values) if values else 0.0
    return stats


def aggregate(rows: Iterable[dict[str, Any]], by_type: bool = True) -> list[GroupStats]:
    """One `GroupStats` per system (type "all"), then per system x question type if `by_type`.

    Systems keep their first-seen order; types are sorted.
    """
    rows = list(rows)
    stages = stage_names(rows)
    systems = list(dict.fromkeys(r["system"] for r in rows))
    out = [_group(s, ALL_TYPES, [r for r in rows if r["system"] == s], stages) for s in systems]
    if by_type:
        types = sorted({question_type(r) for r in rows})
        for system in systems:
            for qtype in types:
                group = [r for r in rows if r["system"] == system and question_type(r) == qtype]
                if group:
                    out.append(_group(system, qtype, group, stages))
    return out


def question_type(row: dict[str, Any]) -> str:
    """The row's question type, "(none)" where the data set gives none."""
    return str(row.get("type") or "") or "(none)"
