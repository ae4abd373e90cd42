"""The report's retrievals broken down by knowledge base, for a run over several
(`retrieval.sources`): per system and source, how many of its passages the searches returned and
how many reached the context.

A hit of a source carries its chunk id as `name:id` (`rigkit.retrieval.sources`), so the result
lines' compact traces say where each passage came from; the source names are the run config's
(`meta.json`). A run of one knowledge base gets no such table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["source_names", "source_tables"]

Table = tuple[list[str], list[list[str]]]


def source_names(meta: Mapping[str, Any]) -> list[str]:
    """The run's knowledge bases, in config order (empty for a run of one)."""
    sources = ((meta.get("config") or {}).get("retrieval") or {}).get("sources") or []
    return [s["name"] for s in sources if isinstance(s, Mapping) and s.get("name")]


def _source(chunk_id: str, names: set[str]) -> str | None:
    name = chunk_id.split(":", 1)[0] if ":" in chunk_id else None
    return name if name in names else None


def source_tables(meta: Mapping[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, Table]:
    """{title: table} with one row per system and source, or {} for a run of one knowledge base."""
    names = source_names(meta)
    if not names:
        return {}
    known = set(names)
    counts: dict[tuple[str, str], dict[str, int]] = {}
    questions: dict[str, int] = {}
    for row in rows:
        summary = row.get("summary") or {}
        system = str(row["system"])
        questions[system] = questions.get(system, 0) + 1
        rounds = summary.get("rounds") or []
        # passages given before the question (plain RAG) were retrieved and added
        upfront = list(summary.get("upfront") or [])
        for kind, ids in [("hits", [h for r in rounds for h in r.get("hits") or []] + upfront),
                          ("added", [a for r in rounds for a in r.get("added") or []] + upfront)]:
            for chunk_id in ids:
                name = _source(str(chunk_id), known)
                if name is not None:
                    slot = counts.setdefault((system, name), {"hits": 0, "added": 0})
                    slot[kind] += 1
    header = ["System", "Source", "Hits / question", "Passages in context / question", "Share of the passages"]
    table: list[list[str]] = []
    for system, n in questions.items():
        added = sum(counts.get((system, name), {}).get("added", 0) for name in names)
        for name in names:
            c = counts.get((system, name), {"hits": 0, "added": 0})
            share = f"{c['added'] / added:.0%}" if added else "–"
            table.append([system, name, f"{c['hits'] / n:.2f}", f"{c['added'] / n:.2f}", share])
    return {"Retrievals by source (passages each knowledge base gave)": (header, table)}
