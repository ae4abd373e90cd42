"""RIG vs RAG latency per question on the shipped multi-hop sets, side by side in one run.

Systems (as `rigkit eval` names them, CPU profile `configs/cpu.yaml`, one shared model and one
index per set): closed_book, rag, rig:prob, rig:always (continue policy: each flagged sentence
is kept, passages follow), rig:entropy. For every question of each set's stored test split, every
system answers once, in a rotating order (so load drift on a shared machine spreads evenly);
questions of the two sets alternate, so a time budget that ends the run early still leaves both
sets with the same share done, and says so.

Per system: p50 / p95 seconds per answer, model calls (segment calls plus helper calls, e.g. a
query rewrite), forward passes (counted with torch hooks), generated tokens, seconds per
answer token, and mean seconds per stage. The ratio RIG / RAG is given on p50 latency and on
seconds per token of the final answer (the same answer length; a regenerated sentence's first
draft counts as cost, not as answer), beside OpenRIG's published 1.4-1.7x
(5.1 s vs 3.2 s multi-hop, 2.9 s vs 1.8 s single-hop).

    python bench/latency.py                    # full: up to 50 test questions per set, 10-min budget
    python bench/latency.py --quick            # one question per set
    python bench/latency.py --budget-s 0       # no budget: every question
    python bench/latency.py --from-eval runs/2wikimultihopqa-test runs/musique-test

`--from-eval` summarises `rigkit eval` runs instead of answering: the eval harness answers every
question with every system in turn (one run, the same model and index), and its rows carry the
same figures (latency, stages, segments, model calls); forward passes there are counted as
generated tokens plus decider passes, not with hooks.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from common import (
    CPU_CONFIG,
    SETS,
    ForwardMeter,
    fmt_ratio,
    parser,
    percentile,
    ratio,
    save,
    set_retriever,
    setup,
    test_questions,
)

from rigkit.build import build_generator
from rigkit.config import load_config
from rigkit.controller import STAGES
from rigkit.eval.runner import TRACES_FILE, ResultsFile, read_results, result_key
from rigkit.eval.systems import build_system, parse_system

SYSTEMS = ("closed_book", "rag", "rig:prob", "rig:always", "rig:entropy")
OPENRIG = {"multi-hop": (5.1, 3.2), "single-hop": (2.9, 1.8)}  # RIG s, RAG s (published)


def systems_for(config, generator, retriever, names) -> dict[str, Any]:
    built = {}
    for name in names:
        cfg = config
        if name == "rig:always":  # keep the sentence and continue, so rounds spread over the answer
            cfg = dataclasses.replace(config, controller=dataclasses.replace(config.controller, policy="continue"))
        built[name] = build_system(parse_system(name), cfg, generator, retriever)
    return built


def answer(system, generator, question: str) -> dict[str, Any]:
    with ForwardMeter(generator.model) as meter:
        start = time.perf_counter()
        result = system.answer(question, 0)
        seconds = time.perf_counter() - start
        passes, forward_s, _ = meter.snapshot()
    calls = len(result.rounds) + sum(r.query.llm_calls for r in result.rounds if r.query)
    stages = {k: result.timings.get(k, 0.0) for k in STAGES}
    stages["other"] = max(0.0, seconds - sum(stages.values()))
    return {
        "seconds": seconds, "model_calls": calls, "forward_passes": passes, "forward_s": forward_s,
        # tokens of the final answer (regenerated segments excluded): the length to compare at
        "answer_tokens": result.rounds[-1].budget.draft if result.rounds else 0,
        "generated": result.tokens["generated"], "prefilled": result.tokens["prefilled"],
        "reused": result.tokens["reused"], "retrievals": result.used_retrieval_times, "stages": stages,
    }


def rows_from_eval(run_dirs: list[str], names) -> tuple[list[dict], dict[str, int]]:
    """Bench rows from the results (and traces, for the final answer's length) of eval runs."""
    rows = []
    for run_dir in map(Path, run_dirs):
        answer_tokens = {}
        for trace in ResultsFile(run_dir / TRACES_FILE).rows():
            rounds = trace["result"].get("rounds") or []
            budget = (rounds[-1].get("budget") or {}) if rounds else {}
            answer_tokens[result_key(trace)] = budget.get("draft", 0)
        for r in read_results(run_dir):
            if r["system"] not in names or r.get("error"):
                continue
            stages = {k: float(r["timings"].get(k, 0.0)) for k in STAGES}
            stages["other"] = max(0.0, r["latency"] - sum(stages.values()))
            rows.append({
                "dataset": r["dataset"], "question": r["id"], "system": r["system"], "seconds": r["latency"],
                "model_calls": r["segments"] + r["extra_model_calls"], "forward_passes": r["forward_passes"],
                "forward_s": None, "answer_tokens": answer_tokens.get(result_key(r), 0),
                "generated": r["tokens_generated"], "prefilled": r["tokens_prefilled"],
                "reused": r["tokens_reused"], "retrievals": r["retrievals"], "stages": stages,
            })
    datasets = dict.fromkeys(r["dataset"] for r in rows)
    asked = {d: len({r["question"] for r in rows if r["dataset"] == d}) for d in datasets}
    return rows, asked


def summarize(rows: list[dict], names) -> dict[str, Any]:
    out = {}
    for name in names:
        mine = [r for r in rows if r["system"] == name]
        if not mine:
            continue
        secs = [r["seconds"] for r in mine]
        gen = sum(r["answer_tokens"] for r in mine)
        out[name] = {
            "answers": len(mine),
            "p50_s": percentile(secs, 50), "p95_s": percentile(secs, 95), "mean_s": sum(secs) / len(secs),
            "model_calls": sum(r["model_calls"] for r in mine) / len(mine),
            "forward_passes": sum(r["forward_passes"] for r in mine) / len(mine),
            "answer_tokens": gen / len(mine),
            "generated": sum(r["generated"] for r in mine) / len(mine),
            "prefilled": sum(r["prefilled"] for r in mine) / len(mine),
            "retrievals": sum(r["retrievals"] for r in mine) / len(mine),
            "s_per_token": sum(secs) / max(1, gen),
            "forward_share": (sum(r["forward_s"] for r in mine) / max(1e-9, sum(secs))
                              if all(r["forward_s"] is not None for r in mine) else None),
            "stages_s": {k: sum(r["stages"][k] for r in mine) / len(mine) for k in [*STAGES, "other"]},
        }
    rag = out.get("rag")
    for name, s in out.items():
        if rag and name.startswith("rig"):
            s["vs_rag_p50"] = ratio(s["p50_s"], rag["p50_s"])
            s["vs_rag_mean"] = ratio(s["mean_s"], rag["mean_s"])
            s["vs_rag_per_token"] = ratio(s["s_per_token"], rag["s_per_token"])
    return out


def measure(args, names) -> tuple[list[dict], dict[str, int], bool, float, int, dict[str, Any]]:
    """Answer the test questions of both sets with every system, in a rotating order."""
    limit = args.questions or (1 if args.quick else 50)
    budget = args.budget_s if args.budget_s is not None else (0 if args.quick else 600)
    answer_tokens = args.answer_tokens or (32 if args.quick else None)
    config = load_config(CPU_CONFIG, generator={"max_answer_tokens": answer_tokens})
    generator = build_generator(config.generator)
    per_set, asked = {}, {}
    for dataset in SETS:
        items = test_questions(dataset, limit)
        asked[dataset] = len(items)
        retriever = set_retriever(dataset, config)
        per_set[dataset] = (items, systems_for(config, generator, retriever, names))
        # warm-up: the index, the embedder and the model load before anything is timed
        next(iter(per_set[dataset][1].values())).answer(items[0].question, 0)
        retriever.search(items[0].question, 3)
    print(f"{', '.join(f'{d}: {n} test questions' for d, n in asked.items())}; systems {', '.join(names)}; "
          f"budget {'none' if not budget else f'{budget:.0f} s'}", flush=True)
    rows: list[dict] = []
    order = [(d, i) for i in range(limit) for d in SETS if i < asked[d]]
    stopped = False
    timing_start = time.perf_counter()
    for turn, (dataset, i) in enumerate(order):
        if budget and time.perf_counter() - timing_start > budget:
            stopped = True
            break
        items, systems = per_set[dataset]
        rotation = names[turn % len(names):] + names[: turn % len(names)]
        for name in rotation:
            row = {"dataset": dataset, "question": items[i].id, "system": name,
                   **answer(systems[name], generator, items[i].question)}
            rows.append(row)
        line = "  ".join(f"{r['system']} {r['seconds']:.1f}s" for r in rows[-len(names):])
        print(f"{dataset[:8]:8s} q{i:02d}  {line}", flush=True)
    source = {"config": str(CPU_CONFIG.name), "model": {"spec": generator.spec, "source": generator.source}}
    return rows, asked, stopped, budget, config.generator.max_answer_tokens, source


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--questions", type=int, default=None, help="test questions per set (full: 50)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting new questions after this many seconds (full: 600, 0: none)")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--answer-tokens", type=int, default=None,
                   help="the answer's token limit (default: the CPU profile's 96; quick: 32)")
    p.add_argument("--from-eval", nargs="+", metavar="RUN_DIR",
                   help="summarise these `rigkit eval` output folders instead of answering")
    args = p.parse_args(argv)
    setup(args)
    started = time.perf_counter()
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.from_eval:
        rows, asked = rows_from_eval(args.from_eval, names)
        sets = list(asked)
        metas = [json.loads((Path(d) / "meta.json").read_text()) for d in args.from_eval]
        stopped, budget = False, 0
        max_answer_tokens = metas[0]["config"]["generator"]["max_answer_tokens"]
        source = {"from_eval": args.from_eval, "config": metas[0].get("config_file"),
                  "model": metas[0].get("model"), "eval_updated": [m.get("updated") for m in metas]}
        print(f"from {', '.join(args.from_eval)}: {', '.join(f'{d}: {n} questions' for d, n in asked.items())}")
    else:
        rows, asked, stopped, budget, max_answer_tokens, source = measure(args, names)
        sets = list(SETS)
    done = {d: len({r["question"] for r in rows if r["dataset"] == d}) for d in sets}
    note = ""
    if stopped:
        note = (f"stopped by the {budget:.0f} s budget after {done} of {asked} questions "
                f"({len(names)} systems each); rerun with --budget-s 0 for all")
        print(note)
    summary = {d: summarize([r for r in rows if r["dataset"] == d], names) for d in sets}
    summary["all"] = summarize(rows, names)
    for scope, table in summary.items():
        print(f"\n{scope}: {done.get(scope, sum(done.values()))} question(s)")
        print(f"  {'system':12s} {'p50 s':>7s} {'p95 s':>7s} {'calls':>6s} {'passes':>7s} {'tokens':>7s} "
              f"{'s/token':>8s} {'RIG/RAG p50':>12s} {'per token':>10s}")
        for name, s in table.items():
            print(f"  {name:12s} {s['p50_s']:7.2f} {s['p95_s']:7.2f} {s['model_calls']:6.1f} "
                  f"{s['forward_passes']:7.1f} {s['answer_tokens']:7.1f} {s['s_per_token']:8.3f} "
                  f"{fmt_ratio(s.get('vs_rag_p50', float('nan'))):>12s} "
                  f"{fmt_ratio(s.get('vs_rag_per_token', float('nan'))):>10s}")
        stage_line = "  ".join(f"{n}: " + "/".join(f"{s['stages_s'][k]:.2f}" for k in [*STAGES, "other"])
                               for n, s in table.items())
        print(f"  mean s per stage ({'/'.join([*STAGES, 'other'])}): {stage_line}")
    print("\nOpenRIG (published): RIG / RAG " + ", ".join(
        f"{k} {rig / rag:.2f}x ({rig} s vs {rag} s)" for k, (rig, rag) in OPENRIG.items()))
    goals = {}
    for name, s in summary["all"].items():
        if "vs_rag_per_token" in s:
            goals[name] = {"vs_rag_p50": s["vs_rag_p50"], "vs_rag_per_token": s["vs_rag_per_token"],
                           "met": s["vs_rag_per_token"] <= 1.2}
    save(args, "latency", {
        "systems": names, "asked": asked, "done": done, "stopped_by_budget": stopped, "note": note,
        "budget_s": budget, "summary": summary, "rows": rows, "goal_rig_vs_rag_le_1_2": goals,
        "openrig": {k: {"rig_s": a, "rag_s": b, "ratio": a / b} for k, (a, b) in OPENRIG.items()},
        "max_answer_tokens": max_answer_tokens, **source,
    }, started)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

