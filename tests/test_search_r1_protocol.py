"""Search-R1's retrieval protocol, tested with Search-R1's own code (`tests/peers/`, vendored
verbatim): its client against rigkit's `/retrieve`, and rigkit's `RemoteRetriever` against its
FastAPI endpoint, both over real HTTP (uvicorn on a free loopback port); and its corpus format
(`{"id", "contents"}`, the title quoted on the first line) read by rigkit as it is.

Search-R1's endpoint needs a retriever (theirs are pyserini BM25 or faiss + an encoder on a GPU):
`OverlapRetriever` has the same interface (`BaseRetriever`, vendored) and answers what theirs
answer, corpus rows (`load_docs`, the dense retriever's) or `{title, text, contents}` dicts
without an id (the BM25 retriever's over an index that stores documents), ranked by shared words.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("requests")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from rigkit.config import RunConfig  # noqa: E402
from rigkit.readers import load_documents  # noqa: E402
from rigkit.retrieval.remote import RemoteRetriever, search_result  # noqa: E402
from rigkit.serve.app import create_app  # noqa: E402
from rigkit.serve.service import RigService  # noqa: E402
from rigkit.testing import DictRetriever, ScriptedGenerator  # noqa: E402
from rigkit.trace import Hit  # noqa: E402
from tests.conftest import hang_limit, wait_until_healthy  # noqa: E402
from tests.peers import search_r1_server  # noqa: E402
from tests.peers.search_r1_client import GenerationConfig, LLMGenerationManager  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# wiki-18 rows as Search-R1's corpus file and dense server have them
ROWS = [
    {"id": "0", "contents": '"Aaron"\nAaron is the brother of Moses and the first high priest of the Israelites.'},
    {"id": "1", "contents": '"Eiffel Tower"\nThe Eiffel Tower is a wrought-iron lattice tower in Paris.'},
    {"id": "2", "contents": '"Gustave Eiffel"\nGustave Eiffel was a French civil engineer.\nHis company built the tower.'},
]
# the same passages as rigkit's index holds them
TOWER = Hit("1#0", "1", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris.", 2.5,
            metadata={"position": 0, "start": 0, "end": 58})
GUSTAVE = Hit("2#0", "2", "Gustave Eiffel", "Gustave Eiffel was a French civil engineer.\nHis company built the tower.",
              1.25, metadata={"position": 0, "start": 0, "end": 72})
AARON = Hit("0#0", "0", "Aaron", "Aaron is the brother of Moses and the first high priest of the Israelites.", 3.0)
TABLE = {"Eiffel": [TOWER, GUSTAVE], "Aaron": [AARON]}


@contextlib.contextmanager
def serving(app) -> Iterator[str]:
    """`app` under uvicorn on a free 127.0.0.1 port, in a thread; yields the base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + hang_limit(10)
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(hang_limit(10))


def rigkit_app(retriever=None):
    service = RigService(RunConfig(), generator=ScriptedGenerator([]), retriever=retriever or DictRetriever(TABLE))
    return create_app(service, mcp=False)


@pytest.fixture(scope="module")
def rigkit_server() -> Iterator[str]:
    with serving(rigkit_app()) as base:
        yield base


class OverlapRetriever(search_r1_server.BaseRetriever):
    """Search-R1's retriever interface over `ROWS`: `shape` "dense" answers corpus rows as its
    DenseRetriever does, "bm25" the dicts its BM25Retriever builds when the index stores documents."""

    def __init__(self, config, shape: str):
        super().__init__(config)
        self.corpus, self.shape = ROWS, shape

    def _search(self, query, num=None, return_score=False):
        words = set(query.lower().split())
        overlap = [len(words & set(row["contents"].lower().split())) for row in self.corpus]
        idxs = sorted(range(len(self.corpus)), key=lambda i: -overlap[i])[: num or self.topk]
        scores = [float(overlap[i]) for i in idxs]
        if self.shape == "dense":
            results = search_r1_server.load_docs(self.corpus, idxs)
        else:  # as BM25Retriever._search builds them
            results = [{"title": content.split("\n")[0].strip('"'), "text": "\n".join(content.split("\n")[1:]),
                        "contents": content} for content in (self.corpus[i]["contents"] for i in idxs)]
        return (results, scores) if return_score else results

    def _batch_search(self, query_list, num=None, return_score=False):
        found = [self._search(query, num, True) for query in query_list]
        results, scores = [r for r, _ in found], [s for _, s in found]
        return (results, scores) if return_score else results


@pytest.fixture(params=["dense", "bm25"])
def search_r1(request, monkeypatch) -> Iterator[tuple[str, str]]:
    """(shape, base URL) of Search-R1's own /retrieve endpoint, set up as its __main__ does."""
    config = search_r1_server.Config(retrieval_topk=3)
    monkeypatch.setattr(search_r1_server, "config", config)
    monkeypatch.setattr(search_r1_server, "retriever", OverlapRetriever(config, request.param))
    with serving(search_r1_server.app) as base:
        yield request.param, base


# -- Search-R1's client against rigkit's server ----------------------------------------------------
def test_search_r1s_own_client_reads_rigkits_server(rigkit_server):
    manager = LLMGenerationManager(GenerationConfig(search_url=f"{rigkit_server}/retrieve", topk=2))
    passages = manager.batch_search(["Who built the Eiffel Tower?", "Aaron"])
    assert passages == [
        'Doc 1(Title: "Eiffel Tower") The Eiffel Tower is a wrought-iron lattice tower in Paris.\n'
        'Doc 2(Title: "Gustave Eiffel") Gustave Eiffel was a French civil engineer.\nHis company built the tower.\n',
        'Doc 1(Title: "Aaron") Aaron is the brother of Moses and the first high priest of the Israelites.\n',
    ]


def test_rigkit_answers_search_r1s_shape_with_its_own_fields_beside(rigkit_server, monkeypatch):
    import requests

    ask = {"queries": ["Eiffel Tower", "Aaron"], "topk": 2}
    scored = requests.post(f"{rigkit_server}/retrieve", json={**ask, "return_scores": True}).json()
    config = search_r1_server.Config()
    monkeypatch.setattr(search_r1_server, "retriever", OverlapRetriever(config, "dense"))
    with serving(search_r1_server.app) as theirs:
        reference = requests.post(f"{theirs}/retrieve", json={**ask, "return_scores": True}).json()
    assert list(scored) == list(reference) == ["result"]
    for ours, their in zip(scored["result"][0], reference["result"][0], strict=True):
        assert set(ours) == set(their) == {"document", "score"}
        assert set(ours["document"]) >= set(their["document"]) == {"id", "contents"}
        assert ours["document"]["contents"] == their["document"]["contents"]  # wiki-18's "Title"\ntext
    tower = scored["result"][0][0]
    assert tower["score"] == 2.5 and tower["document"] == {
        "id": "1#0", "contents": ROWS[1]["contents"], "doc_id": "1", "title": "Eiffel Tower",
        "text": TOWER.text, "score": 2.5, "metadata": {"position": 0, "start": 0, "end": 58}}
    # without return_scores: the documents themselves (rigkit's fields still there for its older clients)
    plain = requests.post(f"{rigkit_server}/retrieve", json=ask).json()
    assert plain["result"] == [[item["document"] for item in hits] for hits in scored["result"]]


# -- rigkit's RemoteRetriever against Search-R1's server -------------------------------------------
def test_remote_retriever_reads_search_r1s_own_server(search_r1):
    shape, base = search_r1
    retriever = RemoteRetriever(f"{base}/retrieve", backoff=0.0)
    tower, aaron = retriever.search_many(["Eiffel Tower", "Aaron Moses"], 2)
    assert [(h.title, h.text, h.score) for h in tower] == [
        ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris.", 2.0),
        ("Gustave Eiffel", "Gustave Eiffel was a French civil engineer.\nHis company built the tower.", 1.0),
    ]
    assert aaron[0].title == "Aaron" and aaron[0].text.startswith("Aaron is the brother of Moses")
    ids = [h.chunk_id for h in tower]
    if shape == "dense":  # corpus rows: their ids kept
        assert ids == ["1", "2"] and [h.doc_id for h in tower] == ["1", "2"]
    else:  # no ids sent: a stand-in per passage, the same in every answer
        assert all(i.startswith("passage-") for i in ids) and len(set(ids)) == 2
        assert [h.chunk_id for h in retriever.search("Eiffel Tower", 2)] == ids
    retriever.close()


def test_remote_retriever_round_trips_rigkits_server(rigkit_server):
    retriever = RemoteRetriever(f"{rigkit_server}/retrieve", backoff=0.0)
    assert retriever.search_many(["Eiffel Tower", "Aaron"], 2) == [[TOWER, GUSTAVE], [AARON]]
    retriever.close()


@pytest.mark.parametrize("answer", [
    search_result([[TOWER]], return_scores=False),  # rigkit's documents themselves
    {"result": [[ROWS[1]]]},  # Search-R1's documents themselves: no score
    {"result": [[{"document": ROWS[1], "score": 2.5}]]},
])
def test_every_item_shape_of_the_protocol_reads_as_the_same_passage(answer):
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    hit = RemoteRetriever("http://index.test/retrieve", transport=transport).search("Eiffel")[0]
    assert (hit.doc_id.split("#")[0], hit.title, hit.text) == ("1", "Eiffel Tower", TOWER.text)


# -- the corpus format -----------------------------------------------------------------------------
def test_a_search_r1_corpus_file_is_read_as_it_is(tmp_path):
    corpus = tmp_path / "wiki-18.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    docs = load_documents(corpus)
    assert [(d.id, d.title) for d in docs] == [("0", "Aaron"), ("1", "Eiffel Tower"), ("2", "Gustave Eiffel")]
    assert docs[0].text == "Aaron is the brother of Moses and the first high priest of the Israelites."
    assert docs[2].text == "Gustave Eiffel was a French civil engineer.\nHis company built the tower."


# -- the documented example ------------------------------------------------------------------------
def test_the_documented_request_gets_the_documented_response():
    page = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    section = page.split("## `/retrieve`: Search-R1's retrieval protocol", 1)[1].split("\n## ", 1)[0]
    request, response = (json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.S))
    documents = [item["document"] for hits in response["result"] for item in hits]
    hits = [Hit(d["id"], d["doc_id"], d["title"], d["text"], d["score"], metadata=d["metadata"]) for d in documents]
    with serving(rigkit_app(DictRetriever({}, default=hits))) as base:
        assert httpx.post(f"{base}/retrieve", json=request).json() == response


# -- the real command ------------------------------------------------------------------------------
@pytest.mark.slow
def test_search_r1s_client_through_rigkit_serve_over_a_search_r1_corpus(tmp_path):
    """`rigkit serve --corpus wiki-18.jsonl` (the default model, BM25 over the real index build)
    answers Search-R1's client with the corpus's titles and texts."""
    corpus = tmp_path / "wiki-18.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rigkit.cli", "serve", "--corpus", str(corpus), "--no-mcp",
                                 "--set", "retrieval.mode=bm25", "--port", str(port)],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        # imports, model, index build
        wait_until_healthy(base, proc, hang_limit(60), lambda: log.read_text(errors="replace")[-2000:])
        manager = LLMGenerationManager(GenerationConfig(search_url=f"{base}/retrieve", topk=1))
        tower, aaron = manager.batch_search(["Who built the Eiffel Tower in Paris?", "Aaron brother of Moses"])
        assert tower.startswith('Doc 1(Title: "Eiffel Tower") The Eiffel Tower is a wrought-iron lattice tower')
        assert aaron.startswith('Doc 1(Title: "Aaron") Aaron is the brother of Moses')
        hits = RemoteRetriever(f"{base}/retrieve").search("Gustave Eiffel civil engineer", 1)
        assert (hits[0].doc_id, hits[0].title) == ("2", "Gustave Eiffel")
    finally:
        proc.terminate()
        proc.wait(hang_limit(30))
