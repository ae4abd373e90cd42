"""Index-build embedding throughput: rigkit's path beside a plain `SentenceTransformer.encode`.

For each shipped set, the same chunks (the set's corpus chunked as `rigkit index build` does) are
embedded three ways in one run, one after the other:

    plain          `SentenceTransformer.encode(chunks)` with its defaults (float32, batch 32)
    rigkit         `Index.build` with `retrieval.embedding_precision: auto` (the default)
    rigkit fp32    `Index.build` with `embedding_precision: float32` (the path before auto)

Per way: chunks/s, and the ratio to plain. The two indexes are then scored on the set's test
split (`evaluate_retrieval`, dense and hybrid, recall@5 / @10 by title), so a faster way shows
what it costs in recall; the vectors' cosine to the plain ones is reported too.

    python bench/embedding.py [--quick] [--sets 2wikimultihopqa,musique]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import ROOT, SETS, parser, ratio, save

from rigkit.datasets import load_qa, split_questions
from rigkit.embeddings import load_embedder
from rigkit.retrieval import Index
from rigkit.retrieval.dense import embed_texts
from rigkit.retrieval.evaluation import evaluate_retrieval

MODES = ("dense", "hybrid")
QUICK_DOCUMENTS = 60


def recall(index: Index, rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    result = evaluate_retrieval(index, rows, MODES, ks=(5, 10))
    return {mode: {k: v for k, v in scores.items() if k.startswith("recall")} for mode, scores in result.items()}


def one_set(name: str, folder: Path, quick: bool) -> dict[str, Any]:
    corpus = ROOT / "data" / name / "corpus.jsonl"
    if quick:  # a slice of the corpus: every code path in seconds
        lines = corpus.read_text(encoding="utf-8").splitlines()[:QUICK_DOCUMENTS]
        corpus = folder / f"{name}-slice.jsonl"
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    embedder = load_embedder()
    for precision in ("float32", "bfloat16"):  # first calls are slow (allocations, kernel choice)
        embed_texts(embedder, ["a short text to warm the model up"] * 16, precision=precision)
    built: dict[str, Index] = {}
    seconds: dict[str, float] = {}
    vectors: dict[str, np.ndarray] = {}
    for precision in ("auto", "float32"):
        index = Index.build(corpus, folder / f"{name}-{precision}", precision=precision, reuse=False)
        built[precision], seconds[precision] = index, index.manifest["timings"]["embedding_s"]
        vectors[precision] = index.dense().index.reconstruct_n(0, len(index.chunks))
        if precision == "auto":  # plain encode between the two builds: drift in load hits both
            texts = [c.index_text for c in index.chunks]
            started = time.perf_counter()
            plain = embedder.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                    show_progress_bar=False)
            seconds["plain"] = time.perf_counter() - started
    n = len(texts)
    qa = ROOT / "data" / name / "qa.jsonl"
    rows = split_questions(load_qa(qa), qa.parent, "test")
    scores = {p: recall(built[p], rows) for p in built}
    return {
        "chunks": n,
        "questions": len(rows),
        "precision": built["auto"].manifest["dense"]["precision"],
        "chunks_per_s": {way: round(n / s, 2) for way, s in seconds.items()},
        "vs_plain": {way: ratio(seconds["plain"], s) for way, s in seconds.items() if way != "plain"},
        "cosine_to_plain": {p: {"min": round(float((v * plain).sum(1).min()), 5),
                                "mean": round(float((v * plain).sum(1).mean()), 5)} for p, v in vectors.items()},
        "recall": scores,
        "recall_change": {mode: {k: round(scores["auto"][mode][k] - scores["float32"][mode][k], 4)
                                 for k in scores["auto"][mode]} for mode in MODES},
    }


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--sets", default=",".join(SETS), help="comma-separated shipped sets")
    args = p.parse_args(argv)
    # no setup(args): the index build runs with torch's own thread count, as `rigkit index build` does
    started = time.perf_counter()
    sets = args.sets.split(",")[:1] if args.quick else args.sets.split(",")
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rigkit-bench-embedding-") as tmp:
        for name in sets:
            report[name] = one_set(name, Path(tmp), args.quick)
    print(f"{'set':17s}{'chunks':>7s}{'plain/s':>9s}{'rigkit/s':>10s}{'vs plain':>9s}{'fp32/s':>8s}"
          f"{'vs plain':>9s}  precision  min cos   dense R@5/@10 change   hybrid R@5/@10 change")
    for name, s in report.items():
        c, v, d = s["chunks_per_s"], s["vs_plain"], s["recall_change"]
        print(f"{name:17s}{s['chunks']:7d}{c['plain']:9.1f}{c['auto']:10.1f}{v['auto']:8.2f}x{c['float32']:8.1f}"
              f"{v['float32']:8.2f}x  {s['precision']:9s}  {s['cosine_to_plain']['auto']['min']:.4f}"
              f"   {d['dense']['recall@5']:+.3f} / {d['dense']['recall@10']:+.3f}"
              f"          {d['hybrid']['recall@5']:+.3f} / {d['hybrid']['recall@10']:+.3f}")
    print("\n(recall change: the auto-precision index minus the float32 index, test split, by title)")
    save(args, "embedding", {"sets": report}, started)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
