"""What the append-only transcript saves: KV-cache reuse vs no reuse vs the prefix layout.

Runs the same demo questions three ways in one process, with the `always` decider so every run
has the same three retrieval rounds, and prints pre-filled tokens and seconds as ratios.
    python bench/cache.py [--questions N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rigkit.build import build_controller
from rigkit.config import RetrievalConfig, load_config
from rigkit.generation import load_generator
from rigkit.retrieval import open_retriever

WAYS = {
    "append + cache": ({"layout": "append"}, True),
    "append, no cache": ({"layout": "append"}, False),
    "prefix + cache": ({"layout": "prefix"}, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    questions = [json.loads(line)["question"] for line in (root / "data/demo/questions.jsonl").open()]
    questions = [q for q in questions if q.isascii()][: args.questions]
    retriever = open_retriever(RetrievalConfig())
    # warm-up: load the model and the embedder before any timing
    warm = load_config(root / "configs/cpu.yaml", decider={"name": "always"}, controller={"max_rounds": 1})
    build_controller(warm, load_generator(), retriever).run(questions[0])
    totals = {}
    for name, (context, use_cache) in WAYS.items():
        config = load_config(root / "configs/cpu.yaml", decider={"name": "always"},
                             controller={"max_rounds": args.rounds}, context=context)
        generator = load_generator(use_cache=use_cache)
        start, prefilled, reused, answers = time.perf_counter(), 0, 0, []
        for question in questions:
            result = build_controller(config, generator, retriever).run(question)
            prefilled += result.tokens["prefilled"]
            reused += result.tokens["reused"]
            answers.append(result.answer)
        totals[name] = (prefilled, reused, time.perf_counter() - start, answers)
        print(f"{name:18s} pre-filled {prefilled:6d}  reused {reused:6d}  {totals[name][2]:6.1f}s", flush=True)
    base = totals["append + cache"]
    print("\nratios against append + cache (higher = more work):")
    for name, (prefilled, _, seconds, answers) in totals.items():
        same = sum(a == b for a, b in zip(answers, base[3]))
        print(f"{name:18s} pre-fill x{prefilled / max(1, base[0]):5.2f}   time x{seconds / base[2]:5.2f}"
              f"   same answer {same}/{len(answers)}")


if __name__ == "__main__":
    main()
