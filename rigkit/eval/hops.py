"""Per-hop retrieval recall: which gold paragraph each retrieval found, hop by hop.

Read from the result lines alone (no model): a line's `summary.rounds` hold each retrieval's
query and hit chunk ids (a round whose search did not run, `searched`, is not a retrieval), and `summary.upfront` the passages plain RAG put before the question
(searched with the question itself). Matched against the question's gold chain
(`rigkit.eval.gold`: MuSiQue's hop order, 2Wiki's supporting facts), each answer gets, per hop,
the retrieval (1-based, in the order they happened) that first found its paragraph, or None.
The second hop is the one a single search with the question most often misses: for it the
per-question view gives the query that found it, or the query that came closest (most words
shared with the gold sub-question) when none did.

Lines without retrieval records (older plain-RAG lines, which kept no `upfront` list) have no
per-hop figures: they are left out and the table says on how many questions each row rests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rigkit.eval.answers import token_f1
from rigkit.eval.gold import GoldChain, pid_of
from rigkit.eval.paired import Share, mcnemar_exact, paired_bootstrap, share_interval, wins_losses

__all__ = ["Retrieval", "HopRecord", "retrievals_of", "searched", "hop_record", "hop_records", "hop_table",
           "hop_rows", "hop_type_table", "hop2_found"]


@dataclass(frozen=True)
class Retrieval:
    """One search an answer made: its order, query (None: the question itself) and paragraphs."""

    index: int  # 1-based, in the order the searches happened
    query: str | None
    pids: tuple[str, ...]


@dataclass
class HopRecord:
    """One answer's per-hop view."""

    id: str
    system: str
    type: str
    hops: int
    found: list[int | None]  # per hop: the retrieval that first found its paragraph
    queries: list[str | None]  # per hop: the query that found it, else the closest that missed
    retrievals: int

    def hop_found(self, hop: int) -> bool | None:
        """Whether hop `hop` (1-based) was found; None when the chain is shorter."""
        return None if hop > self.hops else self.found[hop - 1] is not None


def retrievals_of(row: dict[str, Any]) -> list[Retrieval] | None:
    """The searches a result line records, or None when it kept no record of them."""
    summary = row.get("summary") or {}
    if "rounds" not in summary:
        return None
    out: list[Retrieval] = []
    if summary.get("upfront"):
        out.append(Retrieval(1, None, tuple(pid_of(c) for c in summary["upfront"])))
    elif row.get("retrievals") and not any(r.get("query") for r in summary["rounds"]):
        return None  # plain RAG from before `upfront` was kept: its passages are unknown
    for rnd in summary["rounds"]:
        if searched(rnd):
            out.append(Retrieval(len(out) + 1, rnd["query"], tuple(pid_of(c) for c in rnd.get("hits", []))))
    return out


def searched(rnd: dict[str, Any]) -> bool:
    """Whether a round of a result line ran a search. A round can hold a query that was never
    searched: the query failed to build or the search failed (`error`), or the loop's query guard
    dropped every search it named as a near-duplicate, empty or garbage (`rigkit.guards.QueryGuard`),
    which the loop records as a skipped round (action "skip") with its query kept for the trace."""
    return rnd.get("query") is not None and not rnd.get("error") and rnd.get("action") != "skip"


def hop_record(row: dict[str, Any], chain: GoldChain) -> HopRecord | None:
    """The per-hop view of one answer (None when the line kept no record of its searches)."""
    searches = retrievals_of(row)
    if searches is None:
        return None
    found: list[int | None] = []
    queries: list[str | None] = []
    for hop in chain.hops:
        hit = next((s for s in searches if hop.pid in s.pids), None)
        found.append(hit.index if hit else None)
        if hit is not None:
            queries.append(hit.query if hit.query is not None else row.get("question"))
        else:
            asked = [s.query if s.query is not None else str(row.get("question", "")) for s in searches]
            queries.append(max(asked, key=lambda q: token_f1(q, [hop.query]), default=None))
    return HopRecord(str(row["id"]), str(row["system"]), str(row.get("type") or ""), len(chain.hops),
                     found, queries, len(searches))


def hop_records(rows: Sequence[dict[str, Any]], gold: Mapping[str, GoldChain]) -> list[HopRecord]:
    """Per-hop views of every first-run line whose question has a chain and whose searches are known."""
    out = []
    for row in rows:
        chain = gold.get(str(row["id"]))
        if row.get("error") or int(row.get("run", 0)) != 0 or chain is None or not chain.hops:
            continue
        record = hop_record(row, chain)
        if record is not None:
            out.append(record)
    return out


def _share(values: list[float]) -> str:
    share = share_interval(values) if values else None
    return "–" if share is None else str(share)


def hop_table(records: Sequence[HopRecord], baseline: str = "rag") -> tuple[list[str], list[list[str]]]:
    """Per system: hop 1, hop 2 and every hop found (share of questions, 95% interval), the round
    hop 2 was first found in, and hop 2 against `baseline`, paired per question."""
    systems = list(dict.fromkeys(r.system for r in records))
    second = {s: {r.id: float(bool(r.hop_found(2))) for r in records if r.system == s and r.hops >= 2}
              for s in systems}
    header = ["System", "Questions", "Hop 1 found [95%]", "Hop 2 found [95%]", "Every hop found [95%]",
              "Hop 2 first found in search 1 / 2 / 3+", f"Hop 2 found − {baseline} [95%]", "Wins / losses, p"]
    rows = []
    for system in systems:
        mine = [r for r in records if r.system == system]
        rounds = [r.found[1] for r in mine if r.hops >= 2 and r.found[1] is not None]
        spread = " / ".join(str(n) for n in (rounds.count(1), rounds.count(2), sum(i >= 3 for i in rounds)))
        rows.append([system, str(len(mine)), _share([float(bool(r.hop_found(1))) for r in mine]),
                     _share(list(second[system].values())),
                     _share([float(all(f is not None for f in r.found)) for r in mine]), spread,
                     *_against(second.get(system, {}), second.get(baseline, {}), system == baseline)])
    return header, rows


def _against(mine: dict[str, float], reference: dict[str, float], same: bool) -> list[str]:
    shared = sorted(set(mine) & set(reference))
    if same or len(shared) < 2:
        return ["", ""]
    diff, low, high = paired_bootstrap([mine[q] for q in shared], [reference[q] for q in shared])
    wins, losses = wins_losses(mine, reference)
    return [f"{diff:+.3f} [{low:+.3f}, {high:+.3f}]", f"{wins} / {losses}, p={mcnemar_exact(wins, losses):.2g}"]


def hop_rows(records: Sequence[HopRecord], hop: int = 2) -> list[dict[str, Any]]:
    """One plain row per answer for hop `hop`: found in which search, by which query (or the
    closest query that missed it), for the notebook and `hops.jsonl`."""
    return [{"id": r.id, "system": r.system, "type": r.type, "hop": hop, "found_in": r.found[hop - 1],
             "query": r.queries[hop - 1], "searches": r.retrievals}
            for r in records if r.hops >= hop]


def hop2_found(records: Sequence[HopRecord]) -> dict[str, Share | None]:
    """system -> share of its questions whose second hop was found."""
    systems = dict.fromkeys(r.system for r in records)
    return {s: share_interval([float(bool(r.hop_found(2))) for r in records if r.system == s and r.hops >= 2])
            for s in systems}


def hop_type_table(records: Sequence[HopRecord]) -> tuple[list[str], list[list[str]]]:
    """Hop 2 found, per question type and system (share of that type's questions)."""
    systems = list(dict.fromkeys(r.system for r in records))
    types = sorted({r.type for r in records if r.hops >= 2})
    header = ["Type", "Questions", *systems]
    body = []
    for qtype in types:
        cells = []
        for system in systems:
            mine = [float(bool(r.hop_found(2))) for r in records if r.system == system and r.type == qtype and r.hops >= 2]
            cells.append(f"{sum(mine) / len(mine):.3f}" if mine else "–")
        questions = len({r.id for r in records if r.type == qtype and r.hops >= 2})
        body.append([qtype, str(questions), *cells])
    return header, body
