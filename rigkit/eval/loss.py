"""Where the loss lies: the report's tables that tell the decider, query, retriever and generator apart.

- **Ceilings**: each system's type-aware score paired against the baseline, beside how often every
  gold paragraph was in its context and how often it answered right when it was. `rag:gold` (every
  gold paragraph, nothing else) bounds what perfect retrieval gives this generator, `rig:oracle`
  (perfect decisions and queries) what the loop gives it; what they still miss is the generator's.
- **Decision quality** (`rigkit.eval.decisions`): over- and under-search against labels taken
  from closed-book and the baseline, and whether the decider fired at the missing fact.
- **Per-hop recall** (`rigkit.eval.hops`): which hop each search found, hop 2 above all.

Built from result lines alone; the gold chains come from the run's `qa` file (`meta.json`), looked
up where the run was started and in this checkout. Without it, only the ceilings table is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rigkit.eval.decisions import (
    LABEL_METRIC,
    decision_quality,
    decision_table,
    find_system,
    need_labels,
)
from rigkit.eval.gold import GoldChain, load_gold
from rigkit.eval.hops import hop_records, hop_table, hop_type_table
from rigkit.eval.paired import compare_systems, per_question, share_interval

__all__ = ["COVER_EM_CAUTION", "gold_of", "ceiling_table", "loss_tables"]

COVER_EM_CAUTION = (
    "Cover EM credits a reply that contains the gold anywhere: on a two-option question a reply "
    "naming both options, or repeating the question, scores 1, and a yes/no gold is matched by "
    "any 'yes' or 'no' in the text. The type-aware score reads yes/no answers as yes/no and a "
    "two-option answer by the option it names first; read comparison questions by it.")

Table = tuple[list[str], list[list[str]]]


def gold_of(meta: Mapping[str, Any]) -> dict[str, GoldChain] | None:
    """The gold chains of the run's questions, or None where its qa file is not found."""
    qa = meta.get("qa")
    if not qa:
        return None
    root = Path(__file__).resolve().parents[2]
    for path in (Path(qa), root / qa):
        if path.exists():
            return load_gold(path)
    return None


def _all_found(row: dict[str, Any]) -> float | None:
    value = row.get("support_recall_pid")
    return None if value is None else float(value >= 1.0)


def ceiling_table(rows: Sequence[dict[str, Any]], baseline: str) -> Table:
    """Per system: type-aware score, its paired difference from `baseline`, every gold paragraph
    in context, and the score on those questions (what the generator loses with the evidence)."""
    scores = per_question(rows, LABEL_METRIC)
    found = per_question([{**r, "all_found": _all_found(r)} for r in rows], "all_found")
    paired = {c.system: c for c in compare_systems(rows, baseline, (LABEL_METRIC,))}
    header = ["System", "Questions", "Type-aware [95%]", f"− {baseline} [95%]", "Wins / losses, p",
              "Every gold paragraph in context [95%]", "Type-aware when it was [95%]"]
    out = []
    for system in dict.fromkeys(r["system"] for r in rows):
        mine = scores.get(system, {})
        c = paired.get(system)
        complete = [q for q, v in found.get(system, {}).items() if v >= 1.0]
        out.append([system, str(len(mine)), _cell(list(mine.values())),
                    "" if c is None else f"{c.difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}]",
                    "" if c is None else f"{c.wins} / {c.losses}, p={c.p_value:.2g}",
                    _cell(list(found.get(system, {}).values())),
                    _cell([mine[q] for q in complete if q in mine])])
    return header, out


def _cell(values: list[float]) -> str:
    share = share_interval(values) if values else None
    return "–" if share is None else str(share)


def loss_tables(meta: Mapping[str, Any], rows: Sequence[dict[str, Any]], baseline: str) -> dict[str, Table]:
    """The where-the-loss-lies tables this run's systems allow (rows must carry `type_aware`)."""
    systems = list(dict.fromkeys(r["system"] for r in rows))
    tables: dict[str, Table] = {}
    if baseline in systems and len(systems) > 1:
        tables["Where the loss lies: ceilings (type-aware score, paired against " + baseline + ")"] = \
            ceiling_table(rows, baseline)
    gold = gold_of(meta)
    closed = find_system(systems, "closed_book")
    if closed and baseline in systems:
        labels = need_labels(rows, closed, baseline)
        qualities = decision_quality(rows, labels, gold, skip=(closed,))
        if qualities:
            tables[f"Decision quality (labels: {closed} and {baseline}, type-aware score)"] = \
                decision_table(qualities)
    if gold is not None:
        records = hop_records(rows, gold)
        searching = {r.system for r in records if r.retrievals}
        records = [r for r in records if r.system in searching]
        if records:
            tables["Per-hop retrieval recall (hop order: the data's chain)"] = hop_table(records, baseline)
            if len({r.type for r in records}) > 1:
                tables["Hop 2 found, by question type"] = hop_type_table(records)
    return tables
