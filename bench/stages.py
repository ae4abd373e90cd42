"""Where one RIG answer's time goes, per decider, in the stages OpenRIG's write-up tabulated.

One question (the demo question of `make demo`, CPU profile), answered once per decider after a
warm-up, with the stage timings every `RoundTrace` records:

    generation     writing the segments up to and including the first one that retrieved
    decision       the decider (for entropy: its extra attention pass through the KV cache)
    query          building the search query
    retrieval      hybrid BM25 + dense search (query embedding included)
    injection      dedup, budget, eviction, rendering the passages
    continuation   writing every segment after the first retrieval (passages pre-filled here)
    other          the loop's bookkeeping: traces, token budget, citations, callbacks

    python bench/stages.py [--quick] [--question TEXT]
"""

from __future__ import annotations

import time
from typing import Any

from common import CPU_CONFIG, ForwardMeter, demo_questions, parser, save, setup

from rigkit.build import build_controller, build_generator, build_retriever
from rigkit.config import load_config

DECIDERS = ("prob", "entropy", "keyword", "every_n", "always")
COLUMNS = ("generation", "decision", "query", "retrieval", "injection", "continuation", "other")


def breakdown(result) -> dict[str, float]:
    """Seconds per stage of one result (see the module docstring)."""
    first = next((i for i, r in enumerate(result.rounds) if r.query is not None), len(result.rounds))
    out = dict.fromkeys(COLUMNS, 0.0)
    for i, r in enumerate(result.rounds):
        out["generation" if i <= first else "continuation"] += r.timings.get("generate", 0.0)
        out["decision"] += r.timings.get("decide", 0.0)
        out["query"] += r.timings.get("query", 0.0)
        out["retrieval"] += r.timings.get("retrieve", 0.0)
        out["injection"] += r.timings.get("inject", 0.0)
    out["other"] = max(0.0, result.timings["total"] - sum(out.values()))
    return out


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--question", default=None)
    p.add_argument("--deciders", default=None, help=f"comma-separated (default: {','.join(DECIDERS)})")
    args = p.parse_args(argv)
    setup(args)
    started = time.perf_counter()
    question = args.question or demo_questions(1)[0]
    deciders = (args.deciders or ("prob,always" if args.quick else ",".join(DECIDERS))).split(",")
    generator = build_generator()
    retriever = build_retriever(load_config(CPU_CONFIG).retrieval)
    answer_tokens = 32 if args.quick else None
    rows: dict[str, Any] = {}
    for n, name in enumerate(["prob", *deciders]):  # the first run is the warm-up
        config = load_config(
            CPU_CONFIG, generator={"max_answer_tokens": answer_tokens},
            controller={"policy": "continue"} if name == "always" else {},
        )
        config = config.with_decider(name)  # another decider starts from its own defaults
        with ForwardMeter(generator.model) as meter:
            result = build_controller(config, generator, retriever).run(question)
        if n == 0:
            continue
        stages = breakdown(result)
        total = result.timings["total"]
        rows[name] = {
            "seconds": total, "stages_s": stages,
            "stages_share": {k: v / total for k, v in stages.items()},
            "rounds": len(result.rounds), "retrievals": result.used_retrieval_times,
            "generated": result.tokens["generated"], "prefilled": result.tokens["prefilled"],
            "reused": result.tokens["reused"], "forward_passes": meter.calls,
            "extra_forward_passes": sum(r.decision.extra_forward_passes for r in result.rounds),
        }
    print(f"question: {question}\n")
    header = "".join(f"{c:>13s}" for c in COLUMNS)
    print(f"{'decider':9s}{'total s':>8s}{header}   retrievals  rounds  tokens  passes")
    for name, r in rows.items():
        cells = "".join(f"{r['stages_s'][c]:6.2f} ({100 * r['stages_share'][c]:3.0f}%)" for c in COLUMNS)
        print(f"{name:9s}{r['seconds']:8.2f}{cells}   {r['retrievals']:10d}  {r['rounds']:6d}  "
              f"{r['generated']:6d}  {r['forward_passes']:6d}")
    print("\n(seconds and share of the answer's wall time; generation + continuation include the "
          "model's pre-fill of injected passages)")
    save(args, "stages", {"question": question, "deciders": rows, "columns": list(COLUMNS),
                          "model": {"spec": generator.spec, "source": generator.source}}, started)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
