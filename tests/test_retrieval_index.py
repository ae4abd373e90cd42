"""Saved indexes: manifest, fast load, mismatch errors, atomic builds, the implicit cache, CLI.

A hashed bag-of-words embedder stands in for MiniLM so these run without model weights; the
chunker still uses the real MiniLM tokenizer (no weights needed).
"""

from __future__ import annotations

import argparse
import json
import time

import pytest

from rigkit.config import RetrievalConfig
from rigkit.errors import IndexMismatchError, RigkitError
from rigkit.retrieval import Index, open_retriever
from rigkit.retrieval.dense import DenseRetriever
from rigkit.retrieval.factory import open_index

try:
    from tests.conftest_retrieval import DATA, HashEmbedder, read_jsonl, write_jsonl
except ImportError:
    from conftest_retrieval import DATA, HashEmbedder, read_jsonl, write_jsonl

DEMO = DATA / "demo" / "corpus.jsonl"


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory):
    return Index.build(DEMO, tmp_path_factory.mktemp("idx") / "demo", embedder=HashEmbedder())


def test_manifest_records_canonical_settings(demo_index):
    manifest = json.loads((demo_index.path / "manifest.json").read_text())
    assert manifest["embedding_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert "site-packages" not in json.dumps(manifest)  # no install paths
    assert manifest["dimension"] == HashEmbedder.dim
    assert manifest["chunking"] == {"chunk_size": 256, "overlap": 64, "split": True}
    assert manifest["chunks"] == len(read_jsonl(demo_index.path / "chunks.jsonl")) == 20
    assert len(manifest["corpus"]["sha256"]) == 64 and manifest["corpus"]["documents"] == 20
    assert {"embedding_s", "faiss_s", "bm25_s", "chunking_s"} <= set(manifest["timings"])
    assert sorted(p.name for p in demo_index.path.iterdir()) == [
        "bm25",
        "chunks.jsonl",
        "dense.faiss",
        "manifest.json",
    ]


def test_load_is_fast_and_searches_like_the_built_index(demo_index):
    started = time.perf_counter()
    loaded = Index.load(demo_index.path, embedder=HashEmbedder())
    assert time.perf_counter() - started < 1.0
    query = "What must I include when shipping Apache-2.0 code in a product?"
    for mode in ("bm25", "dense", "hybrid"):
        a = demo_index.retriever(mode).search(query, 5)
        b = loaded.retriever(mode).search(query, 5)
        assert [(h.chunk_id, round(h.score, 5)) for h in a] == [
            (h.chunk_id, round(h.score, 5)) for h in b
        ]
    hit = loaded.retriever("hybrid").search(query, 3)[0]
    assert set(hit.ranks) == {"bm25", "dense", "hybrid"} and hit.doc_id and hit.title and hit.text


def test_mismatched_embedding_model_is_refused(demo_index):
    Index.load(demo_index.path, embedding_model="all-MiniLM-L6-v2")  # alias of the recorded name
    with pytest.raises(IndexMismatchError, match="all-MiniLM-L6-v2.*BAAI/bge-small-en-v1.5"):
        Index.load(demo_index.path, embedding_model="BAAI/bge-small-en-v1.5")
    config = RetrievalConfig(index=str(demo_index.path), embedding_model="BAAI/bge-small-en-v1.5")
    with pytest.raises(IndexMismatchError):
        open_retriever(config)
    with pytest.raises(IndexMismatchError, match="chunk_size"):
        open_retriever(RetrievalConfig(index=str(demo_index.path), chunk_size=128))
    with pytest.raises(IndexMismatchError, match="bm25_method"):
        open_retriever(RetrievalConfig(index=str(demo_index.path), bm25_method="robertson"))


def test_interrupted_build_leaves_no_half_index(tmp_path, monkeypatch):
    out = tmp_path / "index"

    def interrupted(self, path):
        path.write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(DenseRetriever, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Index.build(DEMO, out, embedder=HashEmbedder())
    assert list(tmp_path.iterdir()) == []  # neither the index nor its temp folder
    monkeypatch.undo()

    Index.build(DEMO, out, embedder=HashEmbedder())
    before = (out / "manifest.json").read_text()
    monkeypatch.setattr(DenseRetriever, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Index.build(DEMO, out, chunk_size=128, embedder=HashEmbedder())
    assert (out / "manifest.json").read_text() == before  # the old index survives intact
    assert [p.name for p in tmp_path.iterdir()] == ["index"]


def test_build_refuses_to_overwrite_a_folder_that_is_not_an_index(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(RigkitError, match="not a rigkit index"):
        Index.build(DEMO, tmp_path / "mine", embedder=HashEmbedder())
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_implicit_index_is_cached_and_rebuilt_when_inputs_change(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGKIT_CACHE_DIR", str(tmp_path / "cache"))
    embedder = HashEmbedder()
    monkeypatch.setattr("rigkit.embeddings.load_embedder", lambda name="", device=None: embedder)
    corpus = write_jsonl(tmp_path / "docs.jsonl", read_jsonl(DEMO)[:6])

    first = open_index(RetrievalConfig(corpus=str(corpus)))
    assert embedder.calls == 1
    again = open_index(RetrievalConfig(corpus=str(corpus)))
    assert again.path == first.path and embedder.calls == 1  # loaded, not rebuilt
    other = open_index(RetrievalConfig(corpus=str(corpus), overlap=32))
    assert other.path != first.path and embedder.calls == 2
    write_jsonl(corpus, read_jsonl(DEMO)[:7])
    edited = open_index(RetrievalConfig(corpus=str(corpus)))
    assert edited.path not in (first.path, other.path) and len(edited.chunks) == 7

    default = open_index(RetrievalConfig())  # no corpus, no index: the demo corpus
    assert default.manifest["corpus"]["documents"] == 20


def run_cli(argv, capsys):
    from rigkit.cli import index as index_cli

    parser = argparse.ArgumentParser(prog="rigkit")
    index_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except RigkitError as err:
        return 2, "", str(err)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_search_and_eval_retrieval(demo_index, capsys):
    code, out, _ = run_cli(
        ["search", str(demo_index.path), "patent licence termination", "--mode", "bm25"], capsys
    )
    assert code == 0 and out.startswith(" 1. [demo-apache-patent#0]")
    code, out, _ = run_cli(
        [
            "eval-retrieval",
            "--index",
            str(demo_index.path),
            "--qa",
            str(DATA / "demo" / "questions.jsonl"),
            "--modes",
            "bm25",
            "--json",
        ],
        capsys,
    )
    result = json.loads(out)
    assert code == 0 and set(result) == {"bm25"}
    assert set(result["bm25"]) == {"recall@1", "recall@5", "recall@10", "mrr"}
    assert 0.5 < result["bm25"]["recall@10"] <= 1.0


class ReversedReranker:
    """Reverses the candidates and records each query it reranked for."""

    def __init__(self):
        self.queries = []

    def rerank(self, query, hits):
        self.queries.append(query)
        return list(reversed(hits))


def test_multi_query_modes_rerank_each_search_before_the_merge(demo_index):
    from rigkit.retrieval import RerankedRetriever
    from rigkit.retrieval.evaluation import evaluate_retrieval
    from rigkit.retrieval.hybrid import fuse_hit_lists

    rows = [r for r in read_jsonl(DATA / "demo" / "questions.jsonl")][:3]
    searches = {r["question"]: ["licence terms of " + r["question"][:30], "patent grant"] for r in rows}
    reranker = ReversedReranker()
    reranked = RerankedRetriever(demo_index.retriever("hybrid"), reranker, candidates=12)
    modes = ["hybrid+rerank", "multi", "multi+q", "multi+rerank", "multi+q+rerank"]
    result = evaluate_retrieval(demo_index, rows, modes, rerank=reranked, subqueries=searches.__getitem__)
    assert set(result) == set(modes)
    # each question reranked once for itself, and each of its searches once
    assert sorted(reranker.queries) == sorted([r["question"] for r in rows] + [q for s in searches.values() for q in s])
    # the reranked merge is the loop's: every search through the reranked retriever, merged by RRF
    row = rows[0]
    lists = reranked.search_many(searches[row["question"]], 10)
    expected = fuse_hit_lists({"q0": reranked.search(row["question"], 10),
                               **{f"q{i}": h for i, h in enumerate(lists, start=1)}}, 10)
    one = evaluate_retrieval(demo_index, rows[:1], ["multi+q+rerank"], rerank=reranked,
                             subqueries=searches.__getitem__)["multi+q+rerank"]
    gold = set(row["supporting_titles"])
    keys = [h.title for h in expected]
    assert one["recall@10"] == round(len(gold & set(keys[:10])) / len(gold), 4)
    assert result["multi+q+rerank"]["queries_per_question"] == 2.0
    assert result["multi+q+rerank"]["added_ms_per_query"] >= result["multi+q"]["added_ms_per_query"] >= 0
    with pytest.raises(RigkitError, match="needs a reranker"):
        evaluate_retrieval(demo_index, rows, ["multi+rerank"], subqueries=searches.__getitem__)


def test_cli_rejects_chunk_size_over_the_model_limit(tmp_path, capsys):
    code, _, err = run_cli(
        [
            "index",
            "build",
            "--corpus",
            str(DEMO),
            "--out",
            str(tmp_path / "i"),
            "--chunk-size",
            "512",
        ],
        capsys,
    )
    assert code == 2 and "256" in err and not (tmp_path / "i").exists()


def test_cache_build_keeps_an_index_another_process_finished_first(tmp_path):
    out = tmp_path / "index"
    Index.build(DEMO, out, embedder=HashEmbedder())
    before = (out / "manifest.json").read_text()
    Index.build(DEMO, out, embedder=HashEmbedder(), overwrite=False)
    assert (out / "manifest.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["index"]


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_dense_indexes_build_load_and_fill_ranks(tmp_path, kind):
    built = Index.build(DEMO, tmp_path / kind, dense_index=kind, embedder=HashEmbedder())
    loaded = Index.load(tmp_path / kind, embedder=HashEmbedder())
    assert loaded.manifest["dense"]["index"] == kind
    query = "copyleft source code obligations"
    exact = Index.build(DEMO, tmp_path / "flat", embedder=HashEmbedder()).retriever("dense")
    assert loaded.retriever("dense").search(query, 3)[0].chunk_id == exact.search(query, 3)[0].chunk_id
    for hit in built.retriever("hybrid").search(query, 8):
        assert set(hit.ranks) == {"bm25", "dense", "hybrid"}


def test_embedding_precision_is_resolved_recorded_and_checked(demo_index, tmp_path):
    from rigkit.retrieval.dense import embedding_precision

    assert demo_index.manifest["dense"]["precision"] == "float32"  # not a torch model: float32
    assert demo_index.dense().precision == "float32"
    assert embedding_precision(HashEmbedder(), "auto") == "float32"
    assert embedding_precision(HashEmbedder(), "bfloat16") == "bfloat16"
    with pytest.raises(RigkitError, match="unknown embedding precision 'half'"):
        embedding_precision(HashEmbedder(), "half")
    # an index from before precision was recorded is read as float32
    manifest = json.loads((demo_index.path / "manifest.json").read_text())
    del manifest["dense"]["precision"]
    old = Index(demo_index.path, manifest, demo_index.chunks)
    assert old.dense().precision == "float32"
