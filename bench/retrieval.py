"""Retrieval benchmark: bm25s vs rank-bm25, faiss exact vs approximate, hybrid latency, build split.

One run on 50,000 distinct chunks of real text: windows of 1-3 consecutive sentences, then
overlapping 20-word windows, of every paragraph in data/2wikimultihopqa and data/musique
(replicated documents would give duplicate vectors and a meaningless approximate recall).
Queries are the two sets' real questions. Prints each measurement and the ratios side by side:
BM25 backends, faiss flat / HNSW / IVF, a hybrid (BM25 + dense, RRF) query with and without the
query vector cached, and the build time split (embedding vs everything else).
Embedding 50k chunks is the slow part (minutes on an idle 2-core machine, far more on a busy
one), so it runs in cached slices under a time budget: the dense figures use the chunks embedded
so far and say how many; a rerun continues where the last one stopped. The embedding rate is
measured afresh in every run on a sample, so the build split does not depend on when the cached
slices were made. The full run also saves the 50k-chunk index that bench/startup.py loads.

    .venv/bin/python bench/retrieval.py                  # <= ~10 min per run
    .venv/bin/python bench/retrieval.py --embed-budget 0 # embed everything, however long
    .venv/bin/python bench/retrieval.py --quick          # 2,000 chunks
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
from common import ROOT, out_dir, parser, save  # (also puts the source tree on sys.path)

from rigkit.corpus import Chunk
from rigkit.retrieval.bm25 import BM25Retriever
from rigkit.retrieval.dense import build_faiss_index, embed_texts
from rigkit.retrieval.ranking import top_indices
from rigkit.retrieval.tokenize import tokenize_many

MODEL = "all-MiniLM-L6-v2"  # the embedder of every dense figure here

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


def bench_dense(chunks, queries, embedder, batch_size: int, cache: Path, budget_s: float,
                rate_sample: int) -> tuple[dict, np.ndarray]:
    vectors, t_embed = cached_embeddings(chunks, embedder, batch_size, cache, budget_s)
    qvecs = embed_texts(embedder, queries, batch_size)
    print(f"dense part on {len(vectors):,} of {len(chunks):,} chunks", flush=True)
    out = {
        "chunks": len(vectors),
        "embedding_s_cached_slices": t_embed,
        "dimension": int(vectors.shape[1]),
    }
    # The rate measured now, on a sample, so the build split does not depend on the load the
    # machine had when the cached slices were made.
    sample = [c.index_text for c in chunks[-rate_sample:]] if rate_sample else []
    if sample:
        _, took = timed(embed_texts, embedder, sample, batch_size)
        out["chunks_per_s"] = len(sample) / took
        out["rate_sample"] = len(sample)
    else:
        out["chunks_per_s"] = len(vectors) / t_embed
        out["rate_sample"] = 0
    out["embedding_s"] = len(chunks) / out["chunks_per_s"]
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
    return out, vectors


def bench_hybrid(chunks, vectors, embedder, queries, n_queries: int) -> dict:
    """A hybrid query (BM25 + dense, RRF, top 3) on the chunks embedded so far, through an index
    of them and `rigkit.build` as a run gets it: first with every query new (its vector is
    computed), then the same queries again (vectors served from the retriever's query cache),
    and the embedding of one query alone."""
    import tempfile

    from rigkit.build import build_retriever
    from rigkit.config import RetrievalConfig

    chunks = chunks[: len(vectors)]
    with tempfile.TemporaryDirectory() as tmp:
        path = save_index(chunks, vectors, Path(tmp) / "index")
        hybrid = build_retriever(RetrievalConfig(index=str(path), mode="hybrid", embedding_model=MODEL))
        bm25, dense = hybrid.retrievers["bm25"], hybrid.retrievers["dense"]
        sample = list(dict.fromkeys(queries))[:n_queries]
        hybrid.search(sample[0], 3)  # warm-up: the full score matrix for exact ranks, lazy imports
        fresh = [q + " ?" for q in sample]  # never seen by the warm-up or the query cache
        miss = latency(lambda q: hybrid.search(q, 3), fresh)
        hit = latency(lambda q: hybrid.search(q, 3), fresh)
        encode = latency(lambda q: embed_texts(embedder, [q]), sample)
        dense_only = latency(lambda q: dense.search(q, 3), [q + " !" for q in sample])
        bm25_only = latency(lambda q: bm25.search(q, 3), sample)
    return {
        "chunks": len(chunks), "queries": len(sample),
        "hybrid_query_ms": miss * 1e3, "hybrid_query_cached_vector_ms": hit * 1e3,
        "query_embedding_ms": encode * 1e3, "dense_query_ms": dense_only * 1e3,
        "bm25_query_ms": bm25_only * 1e3,
    }


def cached_chunk_count(chunks, cache: Path | None = None) -> int:
    """How many of `chunks`, from the start, have cached vectors (whole slices of 2,000)."""
    cache = cache or _default_cache()
    done = 0
    for start in range(0, len(chunks), 2000):
        texts = [c.index_text for c in chunks[start : start + 2000]]
        key = hashlib.sha1("\n".join(texts).encode()).hexdigest()[:16]
        if not ((cache / f"{key}.npy").exists() and (cache / f"{key}.json").exists()):
            break
        done += len(texts)
    return done


def bench_index_path(n_chunks: int) -> Path:
    """Where the benchmark index of `n_chunks` window chunks is kept (user cache folder)."""
    from rigkit.files import cache_root

    return cache_root() / f"bench-index-{n_chunks}"


class _KnownVectors:
    """An `encode` that returns vectors computed earlier, looked up by text (builds an index from
    the cached slices without embedding 50k chunks again)."""

    def __init__(self, texts: list[str], vectors: np.ndarray):
        self.rows = {t: i for i, t in enumerate(texts)}
        self.vectors = vectors

    def encode(self, texts, **kwargs):
        try:
            return self.vectors[[self.rows[t] for t in texts]]
        except KeyError as err:
            raise ValueError(f"no cached vector for chunk text {str(err)[:60]}...") from None


def ensure_bench_index(n_chunks: int, path: Path, cache: Path | None = None, batch_size: int = 128) -> Path:
    """The `n_chunks` window chunks saved as an ordinary rigkit index at `path` (built once, from
    the cached vectors; missing slices are embedded first)."""
    from rigkit.embeddings import load_embedder

    chunks = window_chunks(n_chunks)
    manifest = path / "manifest.json"
    if manifest.exists() and json.loads(manifest.read_text())["chunks"] == len(chunks):
        return path
    vectors, _ = cached_embeddings(chunks, load_embedder(MODEL), batch_size, cache or _default_cache(), 0)
    save_index(chunks, vectors, path)
    print(f"saved the {len(chunks):,}-chunk benchmark index in {path}", flush=True)
    return path


def save_index(chunks, vectors: np.ndarray, path: Path) -> Path:
    """`chunks` (one document each) saved as an ordinary rigkit index at `path`, with their
    already computed `vectors` (nothing is embedded again)."""
    import tempfile

    from rigkit.retrieval import Index

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "windows.jsonl"
        with open(corpus, "w", encoding="utf-8") as fh:
            for c in chunks:
                fh.write(json.dumps({"id": c.chunk_id, "title": c.title, "text": c.text}) + "\n")
        Index.build(corpus, path, embedding_model=MODEL, split=False,
                    embedder=_KnownVectors([c.index_text for c in chunks], vectors))
    return path


def _default_cache() -> Path:
    from rigkit.files import cache_root

    return cache_root() / "bench-embeddings"


def parse_args(argv) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--chunks", type=int, default=None, help="chunks (full: 50,000; quick: 2,000)")
    p.add_argument("--slow-queries", type=int, default=None,
                   help="queries timed on rank-bm25, which is slow (full: 60; quick: 20)")
    p.add_argument("--hybrid-queries", type=int, default=None, help="queries timed on the hybrid (full: 200; quick: 30)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--embed-budget", type=float, default=420,
                   help="seconds of new embedding per run (0: no limit); slices are cached, so rerun to continue")
    p.add_argument("--rate-sample", type=int, default=None,
                   help="chunks embedded afresh to measure the embedding rate (full: 1,000; quick: 200)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--cache", type=Path, default=None,
                   help="embedding slices kept here so a stopped run resumes (default: user cache)")
    args = p.parse_args(argv)
    quick = args.quick
    args.chunks = args.chunks or (2000 if quick else 50_000)
    args.slow_queries = args.slow_queries or (20 if quick else 60)
    args.hybrid_queries = args.hybrid_queries or (30 if quick else 200)
    args.threads = args.threads or 1  # torch and faiss; 2 thrash on a shared 2-core box
    args.rate_sample = args.rate_sample if args.rate_sample is not None else (200 if quick else 1000)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
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
    args.cache = args.cache or _default_cache()
    embedder = load_embedder(MODEL)
    dense, vectors = bench_dense(chunks, queries, embedder, args.batch_size, args.cache,
                                 args.embed_budget, args.rate_sample)
    hybrid = bench_hybrid(chunks, vectors, embedder, queries, args.hybrid_queries)
    ratios = report(len(chunks), bm25, dense, hybrid)
    figures = {"chunks": len(chunks), "threads": args.threads, "bm25": bm25, "dense": dense,
               "hybrid": hybrid, "ratios": ratios}
    if len(vectors) == len(chunks):  # everything embedded: save the index bench/startup.py loads
        figures["index_path"] = str(ensure_bench_index(len(chunks), bench_index_path(len(chunks)), args.cache))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    out_dir(args)
    save(args, "retrieval", figures, started)
    return 0


def report(n_chunks: int, bm25: dict, dense: dict, hybrid: dict) -> dict[str, float]:
    """Print the dense and hybrid figures, the build-time split and the ratios; return the ratios."""
    for kind in ("flat", "hnsw", "ivf"):
        d = dense[kind]
        print(
            f"faiss {kind:<4}: build {d['build_s']:.2f} s, query {d['query_ms']:.3f} ms, recall@10 vs exact {d['recall@10_vs_exact']:.3f}"
        )
    print(
        f"hybrid    : {hybrid['hybrid_query_ms']:.1f} ms per query (top 3 of BM25 + dense, RRF, {hybrid['chunks']:,} chunks; "
        f"query vector new), {hybrid['hybrid_query_cached_vector_ms']:.1f} ms with the query vector cached; "
        f"embedding one query {hybrid['query_embedding_ms']:.1f} ms, dense search {hybrid['dense_query_ms']:.1f} ms, "
        f"BM25 search {hybrid['bm25_query_ms']:.1f} ms"
    )
    indexing = bm25["tokenize_s"] + bm25["bm25s_index_s"] + dense["flat"]["build_s"]
    embedding = dense["embedding_s"]
    basis = (f"rate measured on {dense['rate_sample']:,} chunks now" if dense["rate_sample"]
             else "rate of the cached slices")
    print(
        f"build     : embedding {embedding:.0f} s at {dense['chunks_per_s']:.0f} chunks/s ({basis}) "
        f"vs indexing {indexing:.1f} s (BM25 tokens + bm25s + faiss flat), {n_chunks:,} chunks"
    )
    ratios = {
        "rank_bm25 / bm25s query latency": bm25["rank_bm25_query_ms"] / bm25["bm25s_query_ms"],
        "faiss flat / hnsw query latency": dense["flat"]["query_ms"] / dense["hnsw"]["query_ms"],
        "faiss flat / ivf query latency": dense["flat"]["query_ms"] / dense["ivf"]["query_ms"],
        "hybrid query: new / cached query vector": hybrid["hybrid_query_ms"] / hybrid["hybrid_query_cached_vector_ms"],
        "embedding / indexing build time": embedding / indexing,
    }
    print("ratios:")
    for name, value in ratios.items():
        print(f"  {name:<40} {value:8.1f}x")
    print(f"  hnsw recall@10 vs exact                  {dense['hnsw']['recall@10_vs_exact']:8.3f}")
    print(f"  ivf  recall@10 vs exact                  {dense['ivf']['recall@10_vs_exact']:8.3f}")
    return ratios


if __name__ == "__main__":
    sys.exit(main())
