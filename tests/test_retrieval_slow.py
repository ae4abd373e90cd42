"""The real stack with all-MiniLM-L6-v2 (offline package): demo corpus, implicit cache, Chinese."""

from __future__ import annotations

import time

import pytest

from rigkit.config import RetrievalConfig
from rigkit.datasets import load_qa
from rigkit.retrieval import Index, open_retriever
from rigkit.retrieval.evaluation import evaluate_retrieval

try:
    from tests.conftest_retrieval import DATA
except ImportError:
    from conftest_retrieval import DATA

pytestmark = pytest.mark.slow
MAIN_QUESTION = (
    "Can I use code under the Apache-2.0 licence in a commercial product, and what must I include "
    "when I ship it?"
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return Index.build(DATA / "demo" / "corpus.jsonl", tmp_path_factory.mktemp("minilm") / "demo")


def test_main_demo_question(demo):
    hits = demo.retriever("hybrid").search(MAIN_QUESTION, top_k=5)
    assert "demo-apache-2.0" in [h.doc_id for h in hits[:3]]
    for hit in hits:
        assert set(hit.ranks) == set(hit.scores) == {"bm25", "dense", "hybrid"}
        assert hit.score == hit.scores["hybrid"] > 0
    dense = demo.retriever("dense").search(MAIN_QUESTION, top_k=1)[0]
    assert dense.doc_id == "demo-apache-2.0" and 0.3 < dense.score <= 1.0


@pytest.mark.parametrize("code, doc", [("KL320", "demo-zh-kl320"), ("KL302", "demo-zh-kl302")])
def test_chinese_questions_find_their_model(demo, code, doc):
    hits = demo.retriever("hybrid").search(f"{code} 的适用面积是多少？", top_k=3)
    assert hits[0].doc_id == doc


def test_demo_questions_recall(demo):
    result = evaluate_retrieval(demo, load_qa(DATA / "demo" / "questions.jsonl"))
    assert set(result) == {"bm25", "dense", "hybrid"}
    assert (
        result["hybrid"]["recall@5"] >= 0.8
    )  # each needs two documents; one hop mostly finds both
    assert result["hybrid"]["mrr"] >= 0.8


def test_open_retriever_default_is_the_cached_demo_index(tmp_path, monkeypatch):
    monkeypatch.setenv("RIGKIT_CACHE_DIR", str(tmp_path))
    retriever = open_retriever(RetrievalConfig())
    assert retriever.search(MAIN_QUESTION, top_k=3)[0].chunk_id
    started = time.perf_counter()
    open_retriever(RetrievalConfig())  # second time: loaded from the cache
    assert time.perf_counter() - started < 2.0
    assert len(list((tmp_path / "indexes").iterdir())) == 1


def test_bfloat16_embeddings_stay_next_to_float32(demo):
    import numpy as np

    from rigkit.retrieval.dense import embed_texts

    embedder = demo.dense().embedder
    texts = [c.index_text for c in demo.chunks]
    exact = embed_texts(embedder, texts, precision="float32")
    fast = embed_texts(embedder, texts, precision="bfloat16")
    assert fast.dtype == np.float32 and fast.shape == exact.shape
    assert (exact * fast).sum(1).min() > 0.999
    # the index embeds its queries the way its chunks were embedded
    assert demo.dense().precision == demo.manifest["dense"]["precision"]
