"""The Milvus dense backend against a real Milvus: a `milvus-lite server` on a free loopback port.

Each index is built twice, vectors in faiss and in Milvus, from the same chunks (a hashed
bag-of-words embedder stands in for MiniLM, except in the command-line test), and the Milvus one
must rank as the faiss one does: every mode, every filter, the fusion.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time

import pytest

from rigkit.errors import IndexCorruptError, IndexMismatchError
from rigkit.retrieval import Index
from rigkit.retrieval.filters import FilterError
from rigkit.retrieval.milvus import MilvusError, MilvusTarget

try:
    from tests.conftest import free_port, hang_limit, stop_process
    from tests.conftest_retrieval import DATA, HashEmbedder, write_jsonl
except ImportError:
    from conftest import free_port, hang_limit, stop_process
    from conftest_retrieval import DATA, HashEmbedder, write_jsonl

pytestmark = pytest.mark.slow
pytest.importorskip("pymilvus", reason="the milvus extra is not installed (pip install -e '.[milvus]')")
pytest.importorskip("milvus_lite", reason="the milvus extra is not installed (pip install -e '.[milvus]')")

DEMO = DATA / "demo" / "corpus.jsonl"
QUERIES = ["What must I include when shipping Apache-2.0 code in a product?", "KL320 滤网",
           "Can I sell software that uses MIT-licensed code?", "patent grant licence"]



@pytest.fixture(scope="module")
def milvus(tmp_path_factory):
    """The URI of a Milvus Lite server with its data in a temporary folder, stopped by its PID."""
    from pymilvus import MilvusClient

    folder = tmp_path_factory.mktemp("milvus")
    port, log = free_port(), folder / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "milvus_lite.cmdline", "server", "--data-dir", str(folder / "data"),
             "--host", "127.0.0.1", "--port", str(port)], stdout=out, stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + hang_limit(10)
        while True:
            if process.poll() is not None:
                pytest.fail(f"milvus-lite server exited with {process.returncode}: {log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    pass
                MilvusClient(uri=uri, timeout=5).list_collections()
                break
            except Exception:
                if time.monotonic() > deadline:
                    pytest.fail(f"milvus-lite server did not answer: {log.read_text()[-2000:]}")
                time.sleep(0.3)
        yield uri
    finally:
        stop_process(process)
        assert process.poll() is not None  # no server outlives the module


def _client(uri):
    from pymilvus import MilvusClient

    return MilvusClient(uri=uri, timeout=5)


def _pair(corpus, folder, uri, name, embedder_type=HashEmbedder):
    faiss = Index.build(corpus, folder / f"{name}-faiss", embedder=embedder_type())
    vectors = Index.build(corpus, folder / f"{name}-milvus", embedder=embedder_type(),
                          dense_backend="milvus", milvus=MilvusTarget(uri, name))
    # searches go through a loaded index, as `rigkit ask --index` would
    return faiss, Index.load(vectors.path, embedder=embedder_type())


@pytest.fixture(scope="module")
def demo(milvus, tmp_path_factory):
    return _pair(DEMO, tmp_path_factory.mktemp("demo"), milvus, "demo")


def _hits(index, mode, query, k=5, filters=None):
    return [(h.chunk_id, round(h.score, 5)) for h in index.retriever(mode).search(query, k, filters=filters)]


def test_the_folder_records_the_collection_it_searches(demo, milvus):
    _, index = demo
    dense = index.manifest["dense"]
    assert dense["backend"] == "milvus" and dense["milvus"]["uri"] == milvus
    assert dense["milvus"]["alias"] == "demo" and dense["milvus"]["collection"].startswith("demo__")
    assert sorted(p.name for p in index.path.iterdir()) == ["bm25", "chunks.jsonl", "manifest.json"]
    client = _client(milvus)
    assert client.describe_alias("demo")["collection_name"] == dense["milvus"]["collection"]
    properties = client.describe_collection(dense["milvus"]["collection"])["properties"]
    assert properties["rigkit.embedding_model"] == index.embedding_model == "sentence-transformers/all-MiniLM-L6-v2"
    index.verify()  # every row holds its chunk, in order


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_every_mode_ranks_as_the_faiss_path(demo, mode):
    faiss, vectors = demo
    for query in QUERIES:
        assert _hits(vectors, mode, query) == _hits(faiss, mode, query), query


def test_fused_hits_carry_the_ranks_milvus_gave(demo):
    faiss, vectors = demo
    for query in QUERIES:
        for a, b in zip(faiss.retriever("hybrid").search(query, 5), vectors.retriever("hybrid").search(query, 5)):
            assert a.chunk_id == b.chunk_id and a.ranks["bm25"] == b.ranks["bm25"]
            # Milvus ranks what it lists (dense_top_k); faiss also ranks the chunks it did not list
            assert b.ranks.get("dense", a.ranks["dense"]) == a.ranks["dense"]
            assert "dense" in b.ranks or a.ranks["dense"] > 20


def test_search_many_embeds_once_and_matches(demo):
    faiss, vectors = demo
    many = vectors.retriever("hybrid").search_many(QUERIES, 3)
    assert [[h.chunk_id for h in hits] for hits in many] == [
        [h.chunk_id for h in faiss.retriever("hybrid").search(q, 3)] for q in QUERIES]


# -- filters --------------------------------------------------------------------------------------

WORDS = ("licence patent notice source binary attribution warranty trademark copyleft network "
         "library static dynamic linking commercial").split()


@pytest.fixture(scope="module")
def tagged(milvus, tmp_path_factory):
    """Chunks with every kind of metadata: text (some missing), numbers, dates, lists, booleans,
    numbers written as text."""
    folder = tmp_path_factory.mktemp("tagged")
    rows = []
    for i in range(40):
        row = {"id": f"doc{i}", "title": f"Doc {i % 7}", "text": f"entry{i} " + " ".join(WORDS[(i * j) % len(WORDS)] for j in range(1, 9)),
               "year": 1980 + i, "modified": f"2024-{1 + i % 12:02d}-01", "tags": [WORDS[i % 5], WORDS[i % 3]],
               "reviewed": i % 3 == 0, "code": str(1000 + i % 4), "score": i / 40}
        if i % 4:
            row["lang"] = "en" if i % 2 else "zh"
        rows.append(row)
    return _pair(write_jsonl(folder / "tagged.jsonl", rows), folder, milvus, "tagged")


FILTERS = [
    "lang=en", "lang=en,zh", "lang!=zh", "year>=2000", "year<1990", {"year": {"gt": 1985, "lte": 2001}},
    "year=2001", "score<0.3", "reviewed=true", {"reviewed": False}, "tags=licence", "tags=patent,notice",
    "tags!=licence", "doc_id=doc3,doc17", "title=Doc 3", "title!=Doc 3",
    # these stay for Python: dates, numbers written as text
    "modified>=2024-06-01", "code=1002", ["lang=en", "modified<2024-04-01", "year>=1990"],
]


@pytest.mark.parametrize("spec", FILTERS, ids=str)
@pytest.mark.parametrize("mode", ["dense", "hybrid"])
def test_filters_keep_what_they_keep_with_faiss(tagged, spec, mode):
    faiss, vectors = tagged
    for query in ("patent licence notice", "static linking commercial"):
        assert _hits(vectors, mode, query, 8, spec) == _hits(faiss, mode, query, 8, spec), (spec, query)


def test_a_filter_no_chunk_passes_says_so(tagged):
    _, vectors = tagged
    with pytest.raises(FilterError, match="no chunk has year>=3000"):
        vectors.retriever("dense").search("patent", 3, filters="year>=3000")


# -- rebuilds, checks and errors ------------------------------------------------------------------


def test_a_rebuild_moves_the_alias_and_drops_the_old_collection(milvus, tmp_path):
    class Counting(HashEmbedder):
        texts = 0

        def encode(self, texts, **kwargs):
            Counting.texts += len(texts)
            return super().encode(texts, **kwargs)

    target = MilvusTarget(milvus, "moving")
    faiss = Index.build(DEMO, tmp_path / "idx", embedder=Counting())
    embedded = Counting.texts
    # the same folder with the other backend: the faiss vectors move to Milvus, nothing embeds
    first = Index.build(DEMO, tmp_path / "idx", embedder=Counting(), dense_backend="milvus", milvus=target)
    assert Counting.texts == embedded and first.report.reused_chunks == len(faiss.chunks)
    assert not (tmp_path / "idx" / "dense.faiss").exists()
    second = Index.build(DEMO, tmp_path / "idx", embedder=Counting(), dense_backend="milvus", milvus=target)
    assert Counting.texts == embedded  # and from Milvus back into Milvus
    old, new = (i.manifest["dense"]["milvus"]["collection"] for i in (first, second))
    client = _client(milvus)
    assert old != new and not client.has_collection(old)
    assert client.describe_alias("moving")["collection_name"] == new
    query = QUERIES[0]
    assert _hits(Index.load(second.path, embedder=HashEmbedder()), "dense", query) == _hits(faiss, "dense", query)
    # back to faiss: the collection no index names any more goes
    Index.build(DEMO, tmp_path / "idx", embedder=Counting())
    assert not client.has_collection(new)


def test_a_collection_built_with_another_model_is_refused(demo, milvus, tmp_path):
    class Narrow(HashEmbedder):
        dim = 32

    other = Index.build(DEMO, tmp_path / "narrow", embedder=Narrow(), dense_backend="milvus",
                        milvus=MilvusTarget(milvus, "narrow"))
    _, index = demo
    copy = tmp_path / "copy"
    shutil.copytree(index.path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["dense"]["milvus"]["collection"] = other.manifest["dense"]["milvus"]["collection"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexMismatchError, match=r"built with another embedding model \(.*32 dimensions\)"):
        Index.load(copy).retriever("hybrid")
    manifest["dense"]["milvus"]["collection"] = "gone__000000000000"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexCorruptError, match="gone__000000000000 is not at .*--dense-backend milvus"):
        Index.load(copy).retriever("dense")
    Index.load(copy).retriever("bm25").search("patent", 2)  # BM25 alone needs no server


def test_an_unreachable_server_is_one_line_naming_it(demo, cli):
    _, index = demo
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(MilvusError, match=f"cannot reach Milvus at {closed}"):
        Index.load(index.path, milvus_uri=closed).retriever("hybrid")
    run = cli("search", str(index.path), "patent", "--set", f"retrieval.milvus_uri={closed}")
    assert run.returncode == 2
    assert run.stderr.startswith(f"rigkit: error: cannot reach Milvus at {closed}") and run.stderr.count("\n") == 1
    run = cli("index", "build", "--corpus", str(DEMO), "--out", str(index.path.parent / "never"),
              "--dense-backend", "milvus", "--milvus-uri", closed)
    assert run.returncode == 2 and f"cannot reach Milvus at {closed}" in run.stderr
    assert not (index.path.parent / "never").exists()
    assert cli("search", str(index.path), "patent", "--mode", "bm25", "--set",
               f"retrieval.milvus_uri={closed}").returncode == 0


def test_the_command_line_builds_and_evaluates_it_like_faiss(milvus, tmp_path, cli):
    """The real MiniLM: `rigkit index build --dense-backend milvus`, verify, eval-retrieval."""
    built = cli("index", "build", "--corpus", str(DEMO), "--out", str(tmp_path / "m"), "--dense-backend", "milvus",
                "--milvus-uri", milvus, "--milvus-collection", "cli_demo", "--no-progress")
    assert built.returncode == 0, built.stderr
    assert "vectors in Milvus at " + milvus in built.stdout
    assert cli("index", "build", "--corpus", str(DEMO), "--out", str(tmp_path / "f"), "--no-progress").returncode == 0
    verified = cli("index", "verify", str(tmp_path / "m"))
    assert verified.returncode == 0 and "20 vectors agree" in verified.stdout
    qa = str(DATA / "demo" / "questions.jsonl")
    figures = [json.loads(cli("eval-retrieval", "--index", str(tmp_path / name), "--qa", qa, "--json").stdout)
               for name in ("m", "f")]
    assert figures[0] == figures[1]
    searched = cli("search", str(tmp_path / "m"), "KL320 滤网", "--filter", "lang=zh", "--top-k", "2")
    assert searched.returncode == 0 and "demo-zh-kl" in searched.stdout


def test_filters_go_to_milvus_where_it_compares_alike(tagged, monkeypatch):
    _, vectors = tagged
    dense = vectors.dense()
    asked = []
    search = dense.collection.search
    monkeypatch.setattr(dense.collection, "search", lambda vector, limit, expression, params: (
        asked.append((limit, expression)) or search(vector, limit, expression, params)))
    dense.search("patent", 3, filters="year>=2000")
    dense.search("patent", 3, filters="modified>=2024-06-01")  # a date: Python, on more candidates
    assert asked[0] == (6 + 8, 'metadata["year"] >= 2000')
    assert asked[1][1] is None and asked[1][0] > 6 + 8


@pytest.mark.parametrize("kind, index_type", [("hnsw", "HNSW"), ("ivf", "IVF_FLAT")])
def test_approximate_indexes_take_the_faiss_paths_parameters(demo, milvus, tmp_path, kind, index_type):
    faiss, _ = demo
    built = Index.build(DEMO, tmp_path / kind, embedder=HashEmbedder(), dense_index=kind, dense_backend="milvus",
                        milvus=MilvusTarget(milvus, f"demo_{kind}"))
    record = built.manifest["dense"]["milvus"]
    assert record["index_type"] == index_type and built.manifest["dense"]["index"] == kind
    assert record["index_params"] == ({"M": 32, "efConstruction": 40} if kind == "hnsw" else {"nlist": 1})
    if kind == "ivf":  # Milvus Lite 3.2.2's IVF_FLAT drops rows from its lists (9 of 10 from a
        return  # single cell of 40 rows, pymilvus alone): only the parameters are checked here
    index = Index.load(built.path, embedder=HashEmbedder())
    for query in QUERIES:  # 20 chunks: the graph finds the exact neighbours
        assert _hits(index, "dense", query) == _hits(faiss, "dense", query)
