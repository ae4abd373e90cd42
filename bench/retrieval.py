"""Retrieval benchmark: bm25s vs rank-bm25, faiss exact vs approximate, build time split.

One run on 50,000 distinct chunks of real text: windows of 1-3 consecutive sentences, then
overlapping 20-word windows, of every paragraph in data/2wikimultihopqa and data/musique
(replicated documents would give duplicate vectors and a meaningless approximate recall).
Queries are the two sets' real questions. Prints each measurement and the ratios side by side.
Embedding 50k chunks is the slow part (minutes on an idle 2-core machine, far more on a busy
one), so it runs in cached slices under a time budget: the dense figures use the chunks embedded
so far and say how many; a rerun continues where the last one stopped.

    .venv/bin/python bench/retrieval.py                  # <= ~10 min per run
    .venv/bin/python bench/retrieval.py --embed-budget 0 # embed everything, however long
    .venv/bin/python bench/retrieval.py --chunks 5000    # a quick look
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rigkit.corpus import Chunk  # noqa: E402
from rigkit.retrieval.bm25 import BM25Retriever  # noqa: E402
from rigkit.retrieval.dense import build_faiss_index, embed_texts  # noqa: E402
from rigkit.retrieval.ranking import top_indices  # noqa: E402
from rigkit.textproc import tokenize_many  # noqa: E402

SETS = ("2wikimultihopqa", "musique")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"(])")


def window_chunks(limit: int) -> list[Chunk]:
    """Distinct windows of all shared paragraphs, first `limit`: 1-3 consecutive sentences, then
    20-word windows with a 10-word stride (real text throughout, no two chunks alike)."""
    seen: set[str] = set()
    chunks: list[Chunk] = []
    paragraphs = [
        json.loads(line)
        for s in SETS
        for line in open(ROOT / "data" / s / "corpus.jsonl", encoding="utf-8")
    ]

    def add(p, kind, i, text):
        if text not in seen:
            seen.add(text)
            chunks.append(
                Chunk(f"{p['id']}#{kind}{i}", p["id"], p["title"], text, len(chunks), 0, len(text))
            )

    for width in (1, 2, 3):
        for p in paragraphs:
            sentences = [s for s in _SENTENCE_END.split(p["text"].strip()) if s]
            for i in range(len(sentences) - width + 1):
                add(p, f"s{width}.", i, " ".join(sentences[i : i + width]))
    for p in paragraphs:
        words = p["text"].split()
        for i in range(0, max(len(words) - 10, 1), 10):
            add(p, "w", i, " ".join(words[i : i + 20]))
    return chunks[:limit]


def questions() -> list[str]:
    return [
        json.loads(line)["question"]
        for s in SETS
        for line in open(ROOT / "data" / s / "qa.jsonl", encoding="utf-8")
    ]


def timed(fn, *args):
    started = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - started


def latency(fn, items) -> float:
    """Median seconds per call."""
    times = []
    for item in items:
        started = time.perf_counter()
        fn(item)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench_bm25(chunks, queries, n_slow: int) -> dict:
    tokens, t_tok = timed(tokenize_many, [c.index_text for c in chunks])
    fast, t_fast = timed(BM25Retriever.build, chunks, "bm25s", "lucene", 1.5, 0.75, tokens)
    ref, t_ref = timed(BM25Retriever.build, chunks, "rank_bm25", "lucene", 1.5, 0.75, tokens)
    sample = queries[:n_slow]
    agree = np.mean(
        [
            [i for i, _ in fast.scored(q, 10).ranked] == [i for i, _ in ref.scored(q, 10).ranked]
            for q in sample[:20]
        ]
    )
    lat_fast = latency(lambda q: fast.scored(q, 10), queries)
    lat_ref = latency(lambda q: ref.scored(q, 10), sample)
    return {
        "tokenize_s": t_tok,
        "bm25s_index_s": t_fast,
        "rank_bm25_index_s": t_ref,
        "bm25s_query_ms": lat_fast * 1e3,
        "rank_bm25_query_ms": lat_ref * 1e3,
        "top10_identical_share": float(agree),
        "rank_bm25_queries": len(sample),
    }


def cached_embeddings(
    chunks, embedder, batch_size: int, cache: Path, budget_s: float
) -> tuple[np.ndarray, float]:
    """Embed in slices of 2,000, saving each slice with its measured time, so a stopped run
    resumes where it was; new slices stop once `budget_s` of this run is spent (0: no limit).
    Returns the vectors embedded so far (n, dim) and their embedding seconds."""
    cache.mkdir(parents=True, exist_ok=True)
    parts, seconds, spent = [], 0.0, 0.0
    for start in range(0, len(chunks), 2000):
        if budget_s and spent >= budget_s:
            print(f"  embedding budget of {budget_s:.0f} s spent; rerun to continue from the cache")
            break
        texts = [c.index_text for c in chunks[start : start + 2000]]
        key = hashlib.sha1("\n".join(texts).encode()).hexdigest()[:16]
        vec_file, meta_file = cache / f"{key}.npy", cache / f"{key}.json"
        cached = vec_file.exists() and meta_file.exists()
        if cached:
            part, took = np.load(vec_file), json.loads(meta_file.read_text())["seconds"]
        else:
            part, took = timed(embed_texts, embedder, texts, batch_size)
            spent += took
            np.save(vec_file, part)
            meta_file.write_text(json.dumps({"seconds": took, "n": len(texts)}))
        parts.append(part)
        seconds += took
        state = "(cached slice; time from its first run)" if cached else ""
        print(
            f"  embedded {start + len(texts):,}/{len(chunks):,} ({seconds:.0f} s so far) {state}",
            flush=True,
        )
    return np.concatenate(parts), seconds


def bench_dense(chunks, queries, embedder, batch_size: int, cache: Path, budget_s: float) -> dict:
    vectors, t_embed = cached_embeddings(chunks, embedder, batch_size, cache, budget_s)
    qvecs = embed_texts(embedder, queries, batch_size)
    print(f"dense part on {len(vectors):,} of {len(chunks):,} chunks", flush=True)
    out = {
        "chunks": len(vectors),
        "embedding_s": t_embed,
        "chunks_per_s": len(vectors) / t_embed,
        "dimension": int(vectors.shape[1]),
    }
    exact_ids = None
    for kind in ("flat", "hnsw", "ivf"):
        index, t_build = timed(build_faiss_index, vectors, kind)
        _, ids = index.search(qvecs, 10)
        if kind == "flat":
            exact_ids = ids
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, exact_ids)])
        lat = latency(lambda v, index=index: index.search(v[None, :], 10), qvecs)
        out[kind] = {"build_s": t_build, "query_ms": lat * 1e3, "recall@10_vs_exact": float(recall)}
    # Sanity: flat search equals a plain matrix product top-10.
    assert list(top_indices(vectors @ qvecs[0], 10)) == list(exact_ids[0])
    return out


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=50_000)
    parser.add_argument(
        "--slow-queries", type=int, default=60, help="queries timed on rank-bm25 (slow)"
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch/faiss threads (2 thrash on a shared 2-core box)",
    )
    parser.add_argument(
        "--embed-budget",
        type=float,
        default=420,
        help="seconds of new embedding per run (0: no limit); slices are cached, so rerun to continue",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="embedding slices kept here so a stopped run resumes (default: user cache)",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import faiss
    import torch

    from rigkit.embeddings import load_embedder

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    chunks = window_chunks(args.chunks)
    queries = questions()
    print(
        f"corpus: {len(chunks):,} distinct chunks (sentence windows of real paragraphs); "
        f"{len(queries)} real questions as queries; {args.threads} threads",
        flush=True,
    )
    bm25 = bench_bm25(chunks, queries, args.slow_queries)
    print(
        f"bm25s     : index {bm25['bm25s_index_s']:.1f} s, query {bm25['bm25s_query_ms']:.2f} ms (median)"
    )
    print(
        f"rank-bm25 : index {bm25['rank_bm25_index_s']:.1f} s, query {bm25['rank_bm25_query_ms']:.1f} ms "
        f"(median of {bm25['rank_bm25_queries']}); identical top-10 on {bm25['top10_identical_share']:.0%}",
        flush=True,
    )
    if args.cache is None:
        from platformdirs import user_cache_dir

        args.cache = Path(user_cache_dir("rigkit")) / "bench-embeddings"
    dense = bench_dense(
        chunks,
        queries,
        load_embedder("all-MiniLM-L6-v2"),
        args.batch_size,
        args.cache,
        args.embed_budget,
    )
    ratios = report(len(chunks), bm25, dense)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"chunks": len(chunks), "bm25": bm25, "dense": dense, "ratios": ratios}, indent=1
            )
        )
    return 0


def report(n_chunks: int, bm25: dict, dense: dict) -> dict[str, float]:
    """Print the dense figures, the build-time split and the ratios; return the ratios."""
    for kind in ("flat", "hnsw", "ivf"):
        d = dense[kind]
        print(
            f"faiss {kind:<4}: build {d['build_s']:.2f} s, query {d['query_ms']:.3f} ms, recall@10 vs exact {d['recall@10_vs_exact']:.3f}"
        )
    indexing = bm25["tokenize_s"] + bm25["bm25s_index_s"] + dense["flat"]["build_s"]
    # A budget-limited run embedded only part of the corpus: project its time to all chunks.
    embedding = dense["embedding_s"] * n_chunks / dense["chunks"]
    projected = " (projected from the chunks embedded)" if dense["chunks"] < n_chunks else ""
    print(
        f"build     : embedding {embedding:.0f} s{projected} at {dense['chunks_per_s']:.0f} chunks/s "
        f"vs indexing {indexing:.1f} s (BM25 tokens + bm25s + faiss flat), {n_chunks:,} chunks"
    )
    ratios = {
        "rank_bm25 / bm25s query latency": bm25["rank_bm25_query_ms"] / bm25["bm25s_query_ms"],
        "faiss flat / hnsw query latency": dense["flat"]["query_ms"] / dense["hnsw"]["query_ms"],
        "faiss flat / ivf query latency": dense["flat"]["query_ms"] / dense["ivf"]["query_ms"],
        "embedding / indexing build time": embedding / indexing,
    }
    print("ratios:")
    for name, value in ratios.items():
        print(f"  {name:<34} {value:8.1f}x")
    print(f"  hnsw recall@10 vs exact            {dense['hnsw']['recall@10_vs_exact']:8.3f}")
    print(f"  ivf  recall@10 vs exact            {dense['ivf']['recall@10_vs_exact']:8.3f}")
    return ratios


if __name__ == "__main__":
    sys.exit(main())
