"""`rigkit index build|attach|info|verify`, `rigkit search`, `rigkit eval-retrieval`: the retrieval commands."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from rigkit.errors import InputError
from rigkit.retrieval.tokenize import use_user_dict

__all__ = ["register"]

log = logging.getLogger("rigkit")


def register(subparsers) -> None:
    index = subparsers.add_parser("index", help="build or inspect a saved retrieval index")
    actions = index.add_subparsers(dest="index_command", required=True)
    _add_build(actions)
    _add_attach(actions)
    info = actions.add_parser("info", help="print an index's manifest")
    info.add_argument("dir")
    info.set_defaults(func=_info)
    verify = actions.add_parser("verify", help="hash every file of an index against its manifest")
    verify.add_argument("dir")
    verify.set_defaults(func=_verify)
    _add_search(subparsers)
    _add_eval(subparsers)


def _add_build(actions) -> None:
    from rigkit.cli import add_config_options
    from rigkit.cli.flags import add_flags, deprecated_alias

    build = actions.add_parser(
        "build", help="chunk a corpus and build BM25 + vector indexes",
        description="Chunk a corpus and build both indexes with the retrieval section of the run "
        "config: embedding_model, embedding_precision, chunk_size, overlap, bm25_method, k1, b, dense_index, "
        "dense_backend and the milvus_* keys (e.g. --set retrieval.dense_index=hnsw; docs/config.md). "
        "Rebuilding into the same --out re-embeds only new and changed files.")
    add_flags(build, "--corpus")
    build.add_argument("--out", required=True, help="index folder to write (replaced atomically)")
    add_config_options(build)
    add_flags(build, "--embedding-model", "--chunk-size")
    build.add_argument(
        "--no-split",
        action="store_true",
        help="one chunk per document (the model truncates long ones; a warning counts them)",
    )
    add_flags(build, "--dense-backend", "--milvus-uri", "--milvus-collection")
    deprecated_alias(build, "--backend", "--dense-backend")
    build.add_argument("--batch-size", type=int, default=64, help="embedding batch size")
    build.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    build.add_argument("--strict", action="store_true",
                       help="exit 1 when any file was skipped as unreadable (the rest is indexed)")
    build.set_defaults(func=_build)


def _add_attach(actions) -> None:
    from rigkit.cli.flags import deprecated_alias

    attach = actions.add_parser(
        "attach", help="use a prebuilt FlashRAG / Search-R1 faiss index and its corpus in place",
        description="Make an index folder that references a prebuilt faiss index and the JSONL corpus it "
        "was built from (row i = line i), without copying or re-embedding; queries are embedded as "
        "FlashRAG does for the encoder. Dense only (docs/retrieval.md).")
    attach.add_argument("--faiss", required=True, metavar="FILE", help="the faiss index, e.g. e5_Flat.index")
    attach.add_argument("--faiss-corpus", dest="faiss_corpus", metavar="FILE",
                        help='the corpus the faiss index was built from: JSONL, {"id", "contents": '
                        '"\"Title\"\ntext"} a line (required)')
    deprecated_alias(attach, "--corpus", "--faiss-corpus", " here (it named the faiss index's corpus)")
    attach.add_argument("--encoder", required=True, metavar="MODEL",
                        help="the model the index was built with: a transformers folder or hub id")
    attach.add_argument("--query-prefix", metavar="TEXT",
                        help="put before every query (default: FlashRAG's for the model's name: "
                        "'query: ' for e5, the bge instruction for bge, else none)")
    attach.add_argument("--passage-prefix", metavar="TEXT",
                        help="what the passages were embedded with (default 'passage: ' for e5, else "
                        "none); checked at attach, used where rigkit embeds passage text itself")
    attach.add_argument("--pooling", choices=("mean", "cls", "pooler"),
                        help="default: the model folder's 1_Pooling config, else FlashRAG's table "
                        "(e5 mean, bge cls, dpr pooler), else mean")
    attach.add_argument("--query-max-length", type=int, default=128, metavar="N",
                        help="query tokens kept (default 128, FlashRAG's; Search-R1's server uses 256)")
    attach.add_argument("--out", required=True, help="index folder to write (replaced atomically)")
    attach.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    attach.add_argument("--force", action="store_true",
                        help="attach even when the check finds rows that do not match their vectors")
    attach.set_defaults(func=_attach)


def _add_search(subparsers) -> None:
    from rigkit.cli import add_config_options
    from rigkit.cli.flags import add_flags, add_generator_flags

    search = subparsers.add_parser("search", help="ranked hits for a query from a saved index")
    search.add_argument("dir", help="index folder")
    search.add_argument("query")
    add_flags(search, "--mode", "--top-k", "--bm25-backend")
    add_flags(search, "--embedding-model", "--rerank", "--filter")
    add_config_options(search)
    add_generator_flags(search)  # the upr reranker scores with the generator
    search.add_argument("--json", action="store_true", help="print hits as JSON on stdout")
    search.set_defaults(func=_search)


def _add_eval(subparsers) -> None:
    from rigkit.cli import add_config_options
    from rigkit.cli.flags import add_flags, add_generator_flags

    ev = subparsers.add_parser(
        "eval-retrieval", help="recall@k and MRR of bm25/dense/hybrid on a QA set"
    )
    add_flags(ev, "--index")
    ev.add_argument("--qa", required=True, help="QA JSONL in the shared format")
    ev.add_argument(
        "--by",
        default="title",
        choices=("title", "pid"),
        help="a hit counts if its title (reference) or paragraph id is supporting",
    )
    ev.add_argument(
        "--split",
        default=None,
        choices=("train", "dev", "test"),
        help="only that split's questions (splits.json beside the QA file)",
    )
    ev.add_argument("--modes", default="bm25,dense,hybrid")
    add_flags(ev, "--bm25-backend", "--rerank")  # --rerank adds the mode hybrid+rerank
    ev.add_argument("--multi-query", type=int, metavar="N",
                    help="adds the modes multi and multi+q: the model writes up to N queries per "
                    "question (query mode multi), their hybrid lists merged by RRF (+q: with the "
                    "question's own list); with --rerank also multi+rerank and multi+q+rerank, "
                    "each search reranked before the merge")
    add_config_options(ev)
    add_generator_flags(ev)  # --multi-query and the upr reranker generate
    ev.add_argument("--json", action="store_true", help='print {mode: {"recall@1", ..., "mrr"}}')
    ev.set_defaults(func=_eval)


def _setup_logging() -> None:
    # rigkit's own progress lines on stderr; libraries stay at WARNING.
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def _build(args: argparse.Namespace) -> int:
    from rigkit.cli import check_out, run_config
    from rigkit.retrieval import Index
    from rigkit.retrieval.milvus import MilvusTarget

    check_out(args.out)
    r = run_config(args).retrieval
    use_user_dict(r.user_dict)
    if r.corpus is None:
        raise InputError("index build needs a corpus: --corpus FILE (or retrieval.corpus in --config)")
    if not Path(r.corpus).exists():
        raise InputError(f"corpus not found: {r.corpus}")
    _setup_logging()
    started = time.perf_counter()
    index = Index.build(
        r.corpus,
        args.out,
        embedding_model=r.embedding_model,
        chunk_size=r.chunk_size,
        overlap=r.overlap,
        split=not args.no_split,
        bm25_method=r.bm25_method,
        k1=r.k1,
        b=r.b,
        dense_index=r.dense_index,
        batch_size=args.batch_size,
        progress=not args.no_progress and sys.stderr.isatty(),
        precision=r.embedding_precision,
        dense_backend=r.dense_backend,
        milvus=MilvusTarget.from_config(r),
    )
    m = index.manifest
    print(
        f"built {args.out}: {m['corpus']['documents']} documents -> {m['chunks']} chunks "
        f"({m['embedding_model']}, chunk_size {m['chunking']['chunk_size']}, overlap "
        f"{m['chunking']['overlap']}{', unsplit' if args.no_split else ''}) in "
        f"{time.perf_counter() - started:.1f} s; timings {m['timings']}"
    )
    if "milvus" in m["dense"]:
        record = m["dense"]["milvus"]
        print(f"vectors in Milvus at {record['uri']}: collection {record['collection']} "
              f"(alias {record['alias']})")
    for line in index.report.lines():
        print(line)
    return 1 if args.strict and index.report.skipped else 0


def _attach(args: argparse.Namespace) -> int:
    from rigkit.cli import check_out
    from rigkit.retrieval.attach import AttachedIndex

    check_out(args.out)
    _setup_logging()
    if not args.faiss_corpus:
        raise InputError("rigkit index attach needs --faiss-corpus FILE: the corpus the faiss index was built from")
    index = AttachedIndex.attach(args.faiss, args.faiss_corpus, args.out, args.encoder, args.query_prefix,
                                 args.passage_prefix, args.pooling, args.query_max_length,
                                 progress=not args.no_progress and sys.stderr.isatty(), force=args.force)
    m, e = index.manifest, index.manifest["encoder"]
    check = m["check"]
    agreement = (f"passages 1-{check['rows']} re-embedded: cosine >= {check['min_cosine']:.4f} to their vectors"
                 if check.get("rows") else f"not re-embedded ({check.get('skipped')})")
    print(f"attached {args.out}: {m['chunks']} passages of {m['corpus']['path']} to {m['faiss']['path']} "
          f"({m['faiss']['type']}, {m['dimension']} dimensions) in {m['timings']['total_s']:.1f} s\n"
          f"  encoder {e['model']}: pooling {e['pooling']}, query prefix {e['query_prefix']!r}, passage prefix "
          f"{e['passage_prefix']!r}, {e['query_max_length']} query tokens; {agreement}")
    return 0


def _info(args: argparse.Namespace) -> int:
    path = Path(args.dir) / "manifest.json"
    if not path.exists():
        raise InputError(f"{args.dir} is not a rigkit index (no manifest.json)")
    print(path.read_text(encoding="utf-8").rstrip())
    return 0


def _verify(args: argparse.Namespace) -> int:
    from rigkit.retrieval import Index

    index = Index.load(args.dir)
    index.verify()
    n = len(index.manifest["files"])
    parts = "the corpus and" if index.manifest.get("kind") == "attached" else "BM25 and"
    print(f"{args.dir}: {n} files match the manifest; {len(index.chunks)} chunks, {parts} "
          f"{index.dense().n_vectors} vectors agree")
    return 0


def _search(args: argparse.Namespace) -> int:
    from rigkit import build
    from rigkit.citations import source_label
    from rigkit.cli import check_text, run_config, safe_terminal

    check_text(args.query, "the query")
    config = run_config(args).override(retrieval={"index": args.dir})
    r = config.retrieval
    generator = build.build_generator(config.generator) if r.rerank == "upr" else None  # upr scores with it
    hits = build.build_retriever(r, generator).search(args.query, r.top_k)
    if args.json:
        print(json.dumps([h.__dict__ for h in hits], ensure_ascii=False, indent=1))
        return 0
    for rank, hit in enumerate(hits, start=1):
        why = "  ".join(f"{name} #{r} ({hit.scores[name]:.3f})" for name, r in hit.ranks.items())
        text = " ".join(hit.text.split())
        print(
            f"{rank:>2}. [{safe_terminal(hit.chunk_id)}] {safe_terminal(source_label(hit))}\n    {why}\n    "
            f"{safe_terminal(text[:160])}{'...' if len(text) > 160 else ''}"
        )
    if not hits:
        print("no hits")
    return 0


def _reranked(retriever, config):
    """`retriever` behind `retrieval.rerank`; the generator is loaded only for upr."""
    from rigkit import build

    if config.retrieval.rerank == "none":
        return retriever
    generator = build.build_generator(config.generator) if config.retrieval.rerank == "upr" else None
    return build.with_reranker(retriever, config.retrieval, generator)


def _subqueries(config, n: int):
    """question -> the searches the multi-query builder writes for it (the question as the need)."""
    from rigkit import build
    from rigkit.trace import Decision

    if n < 1:
        raise InputError(f"--multi-query must be at least 1, got {n}")
    multi = config.override(query={"mode": "multi", "max_subqueries": n}).query
    builder = build.build_queries(multi, build.build_generator(config.generator))
    return lambda question: builder.build(question, "", Decision(True, 1.0, "the question")).searches


def _eval(args: argparse.Namespace) -> int:
    from rigkit.build import build_index
    from rigkit.cli import run_config
    from rigkit.datasets import load_qa, split_questions
    from rigkit.retrieval.evaluation import (
        MULTI_MODES,
        MULTI_RERANKED_MODES,
        RERANKED_MODE,
        evaluate_retrieval,
    )

    config = run_config(args)
    r = config.retrieval
    use_user_dict(r.user_dict)
    if r.index is None:
        raise InputError("eval-retrieval needs an index: --index DIR (or retrieval.index in --config)")
    _setup_logging()
    rows = load_qa(args.qa)
    if args.split:
        rows = split_questions(rows, Path(args.qa).parent, args.split)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    index = build_index(r)
    rerank = None
    if r.rerank != "none":  # the hybrid's candidates reranked: one more mode, beside the others
        rerank = _reranked(index.retriever("hybrid", bm25_backend=r.bm25_backend), config)
        modes += [] if RERANKED_MODE in modes else [RERANKED_MODE]
    subqueries = None
    if args.multi_query is not None:  # the question is the need; the model writes the searches
        subqueries = _subqueries(config, args.multi_query)
        modes += [m for m in MULTI_MODES if m not in modes]
        if rerank is not None:  # each search reranked before the merge, as in the loop
            modes += [m for m in MULTI_RERANKED_MODES if m not in modes]
    started = time.perf_counter()
    result = evaluate_retrieval(index, rows, modes, by=args.by, bm25_backend=r.bm25_backend,
                                rerank=rerank, subqueries=subqueries)
    log.info(
        "%d questions, %d chunks, %.1f s",
        len(rows),
        len(index.chunks),
        time.perf_counter() - started,
    )
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{'mode':<14} {'recall@1':>9} {'recall@5':>9} {'recall@10':>10} {'mrr':>7}   (by {args.by})"
    )
    for mode, v in result.items():
        added = f"   +{v['added_ms_per_query']:.0f} ms/query" if "added_ms_per_query" in v else ""
        print(
            f"{mode:<14} {v['recall@1']:>9.3f} {v['recall@5']:>9.3f} {v['recall@10']:>10.3f} "
            f"{v['mrr']:>7.3f}{added}"
        )
    return 0
