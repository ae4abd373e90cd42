"""What compressing the passages saves in pre-filled passage tokens, and what it costs in time.

Plain RAG (top-k hybrid passages before the question, no retrieval during the answer) on the
first test-split questions of both shipped sets, each question answered once per mode with the
same generator, retriever and budget (CPU profile):

    none          today's context: each passage capped at max_passage_tokens
    extractive    each passage keeps its sentences nearest the question (MiniLM, compress_ratio 0.5)
    abstractive   the generator writes 3-5 key points per passage

Per mode: passage tokens the model pre-fills (`upfront.tokens_added`), all tokens pre-filled,
seconds spent compressing, seconds per answer; ratios against `none` in the same run.

    python bench/compression.py [--quick] [--limit N] [--sets 2wikimultihopqa,musique]
"""

from __future__ import annotations

import time
from typing import Any

from common import (
    CPU_CONFIG,
    SETS,
    median,
    parser,
    ratio,
    save,
    set_retriever,
    setup,
    test_questions,
)

from rigkit.build import build_generator, build_run
from rigkit.config import load_config

MODES = ("none", "extractive", "abstractive")


def answer(run, question: str, top_k: int) -> dict[str, Any]:
    """One plain-RAG answer and what its passages cost."""
    started = time.perf_counter()
    hits = run.retriever.search(question, top_k)
    result = run.controller.run(question, passages=hits)
    upfront = result.upfront
    compressed = upfront.compressed if upfront is not None else {}
    return {
        "passage_tokens": upfront.tokens_added if upfront is not None else 0,
        "prefilled": result.tokens["prefilled"],
        "compress_s": sum(c["seconds"] for c in compressed.values()),
        "seconds": time.perf_counter() - started,
        "compressed": len(compressed),
        "passages": len(upfront.added) if upfront is not None else 0,
        "answer": result.answer,
    }


def summarise(rows: list[dict[str, Any]], base: list[dict[str, Any]]) -> dict[str, Any]:
    total = lambda rs, k: sum(r[k] for r in rs)  # noqa: E731
    return {
        "questions": len(rows),
        "passage_tokens": total(rows, "passage_tokens"),
        "prefilled": total(rows, "prefilled"),
        "compress_s": round(total(rows, "compress_s"), 2),
        "seconds": round(total(rows, "seconds"), 2),
        "median_s": round(median([r["seconds"] for r in rows]), 2),
        "compressed_share": ratio(total(rows, "compressed"), total(rows, "passages")),
        "passage_tokens_vs_none": ratio(total(rows, "passage_tokens"), total(base, "passage_tokens")),
        "prefilled_vs_none": ratio(total(rows, "prefilled"), total(base, "prefilled")),
        "time_vs_none": ratio(total(rows, "seconds"), total(base, "seconds")),
        "same_answers": sum(r["answer"] == b["answer"] for r, b in zip(rows, base, strict=True)),
    }


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--limit", type=int, default=None, help="test questions per set (default 10; quick: 1)")
    p.add_argument("--sets", default=",".join(SETS), help="comma-separated shipped sets")
    args = p.parse_args(argv)
    setup(args)
    started = time.perf_counter()
    limit = args.limit or (1 if args.quick else 10)
    sets = args.sets.split(",")[:1] if args.quick else args.sets.split(",")
    generator = build_generator()
    base = load_config(CPU_CONFIG, generator={"max_answer_tokens": 24 if args.quick else None})
    base = base.with_decider("never")
    top_k = 1 if args.quick else 3
    report: dict[str, Any] = {}
    for name in sets:
        retriever = set_retriever(name, base)
        questions = [q.question for q in test_questions(name, limit)]
        rows: dict[str, list[dict[str, Any]]] = {}
        for mode in MODES:
            config = base.override(context={"compress": mode})
            run = build_run(config, generator, retriever)
            if args.quick and run.context.compressor is not None and hasattr(run.context.compressor, "max_new_tokens"):
                run.context.compressor.max_new_tokens = 48  # quick: every code path, short replies
            rows[mode] = [answer(run, q, top_k) for q in questions]
        report[name] = {mode: summarise(rows[mode], rows["none"]) for mode in MODES}
    print(f"plain RAG, top-{top_k} passages, first {limit} test question(s) per set\n")
    print(f"{'set':17s}{'mode':12s}{'passage tok':>12s}{'vs none':>9s}{'pre-filled':>11s}{'vs none':>9s}"
          f"{'compress s':>11s}{'answer s':>10s}{'vs none':>9s}{'same answers':>14s}")
    for name, modes in report.items():
        for mode, s in modes.items():
            print(f"{name:17s}{mode:12s}{s['passage_tokens']:12d}{s['passage_tokens_vs_none']:8.2f}x"
                  f"{s['prefilled']:11d}{s['prefilled_vs_none']:8.2f}x{s['compress_s']:11.2f}"
                  f"{s['seconds']:10.2f}{s['time_vs_none']:8.2f}x{s['same_answers']:>9d}/{s['questions']}")
    print("\n(passage tok: what the passages occupy in the prompt; answer s includes compressing)")
    save(args, "compression", {"sets": report, "top_k": top_k, "questions_per_set": limit,
                               "config": base.to_dict(),
                               "model": {"spec": generator.spec, "source": generator.source}}, started)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
