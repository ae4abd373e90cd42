"""Choosing the relevance cut (`context.cut_bm25_share`, `context.cut_dense_gap`) on gold searches.

Each hop of a question's gold chain is searched with its gold sub-question, as `rig:oracle` does;
the runner-up of each search (its second hit) is what the cut judges. A good cut keeps the
runners-up that are the hop's own gold paragraph and drops those that support nothing:

    python -m rigkit.eval.cut --qa data/musique/qa.jsonl --qa data/2wikimultihopqa/qa.jsonl --split dev
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rigkit.context.store import relevance_cut
from rigkit.eval.gold import GoldChain, pid_of
from rigkit.trace import Hit

__all__ = ["RunnerUp", "runner_ups", "cut_counts", "main"]

SHARES = (0.0, 0.5, 0.6, 0.65, 0.7)
GAPS = (None, 0.1, 0.15, 0.2, 0.25)


@dataclass
class RunnerUp:
    """One hop's search: its first two hits, and what the second is."""

    first: Hit
    second: Hit
    hop_gold: bool  # the second hit is this hop's own gold paragraph
    gold: bool  # the second hit supports the question (any hop)
    first_hop_gold: bool = False  # the first hit is this hop's own gold paragraph


def runner_ups(chains: Iterable[GoldChain], retriever: Any) -> list[RunnerUp]:
    """The runner-up of each hop's gold sub-question search (hops already found are not searched)."""
    out = []
    for chain in chains:
        supporting = {str(p["pid"]) for p in chain.paragraphs}
        seen: set[str] = set()
        for hop in chain.hops:
            if hop.pid is not None and hop.pid in seen:
                continue
            hits = list(retriever.search(hop.query, 2))
            seen |= {pid_of(h.chunk_id) for h in hits}
            if len(hits) == 2:
                second = pid_of(hits[1].chunk_id)
                out.append(RunnerUp(hits[0], hits[1], second == hop.pid, second in supporting,
                                    pid_of(hits[0].chunk_id) == hop.pid))
    return out


def cut_counts(rows: Sequence[RunnerUp], share: float, gap: float | None) -> dict[str, int]:
    """How many runners-up of each kind the cut keeps."""
    kept = [r for r in rows if not relevance_cut([r.first, r.second], share, gap)[1]]
    return {"hop_gold": sum(r.hop_gold for r in kept), "gold": sum(r.gold for r in kept),
            "other": sum(not r.gold for r in kept)}


def main(argv: Sequence[str] | None = None) -> int:
    from rigkit.build import build_retriever
    from rigkit.config import load_config
    from rigkit.datasets import load_qa, split_questions
    from rigkit.eval.gold import load_gold

    parser = argparse.ArgumentParser(prog="python -m rigkit.eval.cut", description=__doc__.split("\n\n")[0])
    parser.add_argument("--qa", action="append", required=True, help="a QA file with gold chains (repeatable)")
    parser.add_argument("--split", default="dev", choices=("train", "dev", "test"))
    parser.add_argument("--config", default="configs/cpu.yaml")
    args = parser.parse_args(argv)
    rows: list[RunnerUp] = []
    for qa in args.qa:
        folder = qa.rsplit("/", 1)[0]
        config = load_config(args.config, retrieval={"corpus": f"{folder}/corpus.jsonl"})
        gold = load_gold(qa)
        wanted = [gold[r["id"]] for r in split_questions(load_qa(qa), folder, args.split) if r["id"] in gold]
        found = runner_ups(wanted, build_retriever(config.retrieval))
        print(f"{qa}: {len(found)} hop searches; the first hit is the hop's gold paragraph in "
              f"{sum(r.first_hop_gold for r in found)}, the second in {sum(r.hop_gold for r in found)}")
        rows += found
    total = cut_counts(rows, 0.0, None)
    print(f"{len(rows)} runners-up ({args.split}): {total['hop_gold']} the hop's own gold paragraph, "
          f"{total['gold']} supporting, {total['other']} supporting nothing")
    print("| cut_bm25_share | cut_dense_gap | hop's gold kept | supporting kept | others kept |")
    print("| --- | --- | --- | --- | --- |")
    for share in SHARES:
        for gap in GAPS:
            c = cut_counts(rows, share, gap)
            print(f"| {share} | {gap if gap is not None else 'off'} | {c['hop_gold']} / {total['hop_gold']} | "
                  f"{c['gold']} / {total['gold']} | {c['other']} / {total['other']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
