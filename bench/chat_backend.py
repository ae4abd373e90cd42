"""`--backend chat` beside `--backend openai` against the same vLLM: answers, Cover EM, latency.

One vLLM on this CPU (the tests' venv and flags: float32, prefix cache on), serving the default
model under its own name and as `qwen2.5:7b`, a name nothing here has a tokenizer for. The same
system (default `rig:prob`) on the stored test split of both multi-hop sets (`configs/cpu.yaml`,
greedy, one loop at a time), answered twice:
    openai   /v1/completions, the chat template rendered here with the model's tokenizer
    chat     /v1/chat/completions as `qwen2.5:7b`: no tokenizer, template or weights here
and prints per set: identical answers, Cover EM of each, p50 latency of each and the ratio
chat / openai (goal <= 1.15x), and the share of prompt tokens vLLM served from its prefix cache.
The same as

    rigkit eval --qa data/<set>/qa.jsonl --split test --systems rig:prob --config configs/cpu.yaml \\
        --set retrieval.corpus=data/<set>/corpus.jsonl --concurrency 1 \\
        --set generator.backend=openai --set generator.base_url=URL --out A
    rigkit eval ... --set generator.backend=chat --set generator.base_url=URL --model qwen2.5:7b --out B

    python bench/chat_backend.py              # both test splits (73 questions)
    python bench/chat_backend.py --limit 8    # the first 8 questions of each
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import SETS, eval_test_split, identical_answers, parser, save, setup, vllm_url

UNKNOWN = "qwen2.5:7b"


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--systems", default="rig:prob")
    p.add_argument("--vllm-url", help="a running vLLM's base URL (with /v1) serving both names")
    p.add_argument("--limit", type=int, default=None, help="questions per set (default: the whole test split)")
    args = p.parse_args(argv)
    setup(args)
    limit = args.limit or (3 if args.quick else None)
    started = time.perf_counter()
    from tests.vllm_setup import SERVED_NAME

    names = ("--served-model-name", SERVED_NAME, UNKNOWN)  # vLLM serves the model under both
    with tempfile.TemporaryDirectory(prefix="rigkit-bench-chat-") as tmp, vllm_url(args.vllm_url, Path(tmp), *names) as url:
        ways = {"openai": ["generator.backend=openai", f"generator.base_url={url}", f"generator.model={SERVED_NAME}"],
                "chat": ["generator.backend=chat", f"generator.base_url={url}", f"generator.model={UNKNOWN}"]}
        runs = _run_sets(Path(tmp), args.systems, limit, ways)
    rows = _compare(runs)
    for name, row in rows.items():
        o, c = row["openai"], row["chat"]
        print(f"{name:>16}: identical answers {row['identical']}/{row['answers']}; Cover EM openai {o['cover_em']:.3f}"
              f" chat {c['cover_em']:.3f}; p50 {o['p50_s']:.2f} / {c['p50_s']:.2f} s: chat **x{row['p50_ratio']:.2f}**;"
              f" cached share openai {o['cached_share']:.0%} chat {c['cached_share']:.0%}")
    save(args, "chat_backend", {"systems": args.systems, "questions_per_set": limit, "sets": rows}, started)
    return 0


def _run_sets(out: Path, systems: str, limit: int | None, ways: dict[str, list[str]]) -> dict:
    """{way: {set: rows}}; the two ways take turns set by set, so a change in the machine's load
    weighs on both alike."""
    done: dict[str, dict] = {way: {} for way in ways}
    for dataset in SETS:
        for way, settings in ways.items():
            rows = eval_test_split(out / way / dataset, dataset, systems, limit,
                                   ["generator.request_timeout=900", *settings])
            done[way][dataset] = rows
            print(f"{dataset}: {len(rows)} answers ({way})", flush=True)
    return done


def _compare(runs: dict) -> dict:
    table = {}
    for name in [*SETS, "both sets"]:
        names = SETS if name == "both sets" else (name,)
        row = {}
        for way, by_set in runs.items():
            rows = [r for n in names for r in by_set[n]]
            reused = sum(r["tokens_reused"] or 0 for r in rows)
            prompt = reused + sum(r["tokens_prefilled"] for r in rows)
            row[way] = {"answers": len(rows), "cover_em": statistics.fmean(r["cover_em"] for r in rows),
                        "p50_s": statistics.median(r["latency"] for r in rows),
                        "cached_share": reused / prompt if prompt else 0.0}
        chat = [r for n in names for r in runs["chat"][n]]
        row.update(p50_ratio=row["chat"]["p50_s"] / row["openai"]["p50_s"], answers=len(chat),
                   identical=identical_answers([r for n in names for r in runs["openai"][n]], chat))
        table[name] = row
    return table


if __name__ == "__main__":
    sys.exit(main())
