"""One question through the where-the-loss-lies views: each system's rounds, side by side.

For a question and its gold chain, `question_walk` lists every round of every system's answer
(first run): the segment it judged where the line kept it, whether the decider fired, the query,
and which gold hop each hit is (`hop 2` or `-`), then the answer with its type-aware score. The
notebook `09_where_the_loss_lies` shows it; it reads result lines only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rigkit.eval.decisions import fact_segment, fired_segments
from rigkit.eval.gold import GoldChain, pid_of

__all__ = ["question_walk", "hop_of", "answers_of"]


def hop_of(chunk_id: str, chain: GoldChain) -> str:
    """"hop N" when the chunk is the N-th hop's paragraph, else "-"."""
    pid = pid_of(chunk_id)
    return next((f"hop {i}" for i, h in enumerate(chain.hops, 1) if h.pid == pid), "-")


def question_walk(rows: Sequence[dict[str, Any]], chain: GoldChain) -> list[dict[str, Any]]:
    """One plain row per round of each system's answer to `chain`'s question (plus plain RAG's
    up-front search as round "upfront"): what was judged, fired, searched and found."""
    out = []
    for row in rows:
        if str(row["id"]) != chain.id or int(row.get("run", 0)) != 0 or row.get("error"):
            continue
        summary = row.get("summary") or {}
        if summary.get("upfront"):
            out.append({"system": row["system"], "round": "upfront", "segment": "", "fired": True,
                        "query": row.get("question"), "found": [hop_of(c, chain) for c in summary["upfront"]],
                        "action": "before the question"})
        for rnd in summary.get("rounds") or []:
            out.append({"system": row["system"], "round": rnd.get("i"), "segment": rnd.get("text", ""),
                        "fired": bool(rnd.get("fire")), "query": rnd.get("query"),
                        "found": [hop_of(c, chain) for c in rnd.get("hits", [])], "action": rnd.get("action")})
    return out


def answers_of(rows: Sequence[dict[str, Any]], chain: GoldChain) -> list[dict[str, Any]]:
    """Each system's answer to the question: text, type-aware score, retrievals, and whether it
    fired in the segment where the missing fact was written."""
    out = []
    for row in rows:
        if str(row["id"]) != chain.id or int(row.get("run", 0)) != 0 or row.get("error"):
            continue
        fired = fired_segments(row)
        out.append({"system": row["system"], "answer": row.get("answer"), "type_aware": row.get("type_aware"),
                    "retrievals": row.get("retrievals"),
                    "fired_at_fact": (fact_segment(row, chain) in fired) if fired else None})
    return out
