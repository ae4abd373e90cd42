"""`rigkit eval` questions per minute: the in-process model beside the same weights on vLLM.

One run, the same systems (default `rig:prob`, the demo's decider) on the stored test split of
both multi-hop sets (`configs/cpu.yaml`, greedy), answered twice, one way after the other:
    in-process   the default model in this process, one loop (`rigkit eval`'s in-process default)
    vllm         vLLM on this CPU (the tests' venv and flags: float32, prefix cache on, started
                 here and stopped after), `--concurrency 4` loops sending it requests at once
and prints questions per minute, the ratio vllm / in-process, Cover EM of each, and how many
answers are identical (both run float32 greedy: all should be). The same as

    rigkit eval --qa data/<set>/qa.jsonl --split test --systems rig:prob --config configs/cpu.yaml \\
        --set retrieval.corpus=data/<set>/corpus.jsonl --out A
    rigkit eval ... --set generator.backend=openai --set generator.base_url=URL --concurrency 4 --out B

    python bench/eval_throughput.py            # both test splits (73 questions)
    python bench/eval_throughput.py --quick    # 3 questions a set
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import SETS, eval_test_split, identical_answers, parser, save, setup, vllm_url


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--systems", default="rig:prob")
    p.add_argument("--concurrency", type=int, default=4, help="loops at once against vLLM")
    p.add_argument("--vllm-url", help="a running vLLM's base URL (with /v1) instead of starting one")
    p.add_argument("--limit", type=int, default=None, help="questions per set (default: the whole test split)")
    args = p.parse_args(argv)
    setup(args)
    limit = args.limit or (3 if args.quick else None)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rigkit-bench-eval-") as tmp:
        runs = {"in-process": _run_sets(Path(tmp) / "local", args.systems, limit, [], 1)}
        with vllm_url(args.vllm_url, Path(tmp)) as url:
            served = ["generator.backend=openai", f"generator.base_url={url}"]
            runs["vllm"] = _run_sets(Path(tmp) / "vllm", args.systems, limit, served, args.concurrency)
    rows = _compare(runs)
    for name, row in rows.items():
        print(f"{name:>16}: in-process {row['in-process']['per_minute']:.1f} q/min, vLLM x{args.concurrency} "
              f"{row['vllm']['per_minute']:.1f} q/min: **x{row['ratio']:.2f}**; Cover EM "
              f"{row['in-process']['cover_em']:.3f} vs {row['vllm']['cover_em']:.3f}; identical answers "
              f"{row['identical']}/{row['answers']}; p50 {row['in-process']['p50_s']:.1f} vs {row['vllm']['p50_s']:.1f} s")
    save(args, "eval_throughput", {"systems": args.systems, "concurrency": args.concurrency,
                                   "questions_per_set": limit, "sets": rows}, started)
    return 0


def _run_sets(out: Path, systems: str, limit: int | None, settings: list[str], concurrency: int) -> dict:
    """{set: {"seconds", "rows"}}: one `rigkit eval` per set, timed from its first answer's start."""
    done = {}
    for dataset in SETS:
        start = time.perf_counter()
        rows = eval_test_split(out / dataset, dataset, systems, limit, settings, concurrency)
        seconds = time.perf_counter() - start
        done[dataset] = {"seconds": seconds, "rows": rows}
        print(f"{dataset}: {len(rows)} answers in {seconds:.0f} s ({out.name})", flush=True)
    return done


def _compare(runs: dict) -> dict:
    """Per set and over both: questions per minute, Cover EM, p50, identical answers."""
    table = {}
    for name in [*SETS, "both sets"]:
        names = SETS if name == "both sets" else (name,)
        row = {}
        for way, by_set in runs.items():
            rows = [r for n in names for r in by_set[n]["rows"]]
            seconds = sum(by_set[n]["seconds"] for n in names)
            row[way] = {"answers": len(rows), "seconds": seconds, "per_minute": 60 * len(rows) / seconds,
                        "cover_em": statistics.fmean(r["cover_em"] for r in rows),
                        "p50_s": statistics.median(r["latency"] for r in rows)}
        served = [r for n in names for r in runs["vllm"][n]["rows"]]
        local = [r for n in names for r in runs["in-process"][n]["rows"]]
        row.update(ratio=row["vllm"]["per_minute"] / row["in-process"]["per_minute"], answers=len(served),
                   identical=identical_answers(local, served))
        table[name] = row
    return table


if __name__ == "__main__":
    sys.exit(main())
