"""BM25: bm25s vs rank_bm25 parity on real paragraphs, tokenisation, Chinese model codes."""

from __future__ import annotations

import numpy as np
import pytest

from rigkit.corpus import Chunk
from rigkit.datasets import load_qa
from rigkit.readers import load_documents
from rigkit.retrieval import BM25Retriever
from rigkit.retrieval.tokenize import tokenize

try:
    from tests.conftest_retrieval import DATA
except ImportError:
    from conftest_retrieval import DATA


def as_chunks(docs) -> list[Chunk]:
    return [Chunk(f"{d.id}#0", d.id, d.title, d.text, 0, 0, len(d.text)) for d in docs]


def ranking(scores: np.ndarray, chunks, k: int = 10) -> list[str]:
    """Top-k ids over non-zero scores, ties (to 1e-5) broken by chunk id."""
    rounded = np.round(scores, 5)
    order = sorted(
        (i for i in range(len(chunks)) if rounded[i] > 0),
        key=lambda i: (-rounded[i], chunks[i].chunk_id),
    )
    return [chunks[i].chunk_id for i in order[:k]]


@pytest.fixture(scope="module")
def wiki_chunks():
    return as_chunks(load_documents(DATA / "2wikimultihopqa" / "corpus.jsonl"))


@pytest.mark.parametrize("method", ["robertson", "lucene"])
def test_backends_agree_on_real_paragraphs(wiki_chunks, method):
    assert len(wiki_chunks) >= 200
    fast = BM25Retriever.build(wiki_chunks, "bm25s", method)
    ref = BM25Retriever.build(wiki_chunks, "rank_bm25", method)
    questions = [row["question"] for row in load_qa(DATA / "2wikimultihopqa" / "qa.jsonl")[:40]]
    compared = 0
    for question in questions:
        a, b = fast.scored(question, 10).full, ref.scored(question, 10).full
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        top_a, top_b = ranking(a, wiki_chunks), ranking(b, wiki_chunks)
        assert top_a == top_b and len(top_a) == 10
        compared += 1
    assert compared == 40


def test_backends_agree_on_the_demo_corpus():
    chunks = as_chunks(load_documents(DATA / "demo" / "corpus.jsonl"))
    fast = BM25Retriever.build(chunks, "bm25s", "robertson")
    ref = BM25Retriever.build(chunks, "rank_bm25", "robertson")
    queries = [row["question"] for row in load_qa(DATA / "demo" / "questions.jsonl")]
    for query in queries + ["patent licence termination", "KL320 滤网"]:
        a, b = fast.scored(query, 10), ref.scored(query, 10)
        assert ranking(a.full, chunks) == ranking(b.full, chunks)
        assert [i for i, _ in a.ranked] == [i for i, _ in b.ranked]  # rigkit's own tie rule too


def test_english_tokens_match_bm25s_default_tokenizer(wiki_chunks):
    import bm25s

    from rigkit.text import has_cjk as any_cjk

    def has_cjk(text):  # BM25's script choice: Han ideographs only
        return any_cjk(text, kana=False)

    texts = [c.index_text for c in wiki_chunks[:400]]
    ids, vocab = bm25s.tokenize(texts, stopwords="en", show_progress=False, return_ids=True)
    words = {v: k for k, v in vocab.items()}
    theirs = [[words[i] for i in doc] for doc in ids]
    mixed = [i for i, t in enumerate(texts) if has_cjk(t)]
    assert 0 < len(mixed) < 40  # a few English paragraphs quote Chinese names
    for i, text in enumerate(texts):
        ours = tokenize(text)
        if i in mixed:  # jieba splits the Chinese run; the Latin tokens stay bm25s's
            assert [t for t in ours if not has_cjk(t)] == [t for t in theirs[i] if not has_cjk(t)]
        else:
            assert ours == theirs[i]


def test_chinese_tokens_keep_model_codes_and_drop_function_words():
    tokens = tokenize("KL320 的滤网是 F32，KL302 用 F30")
    assert "kl320" in tokens and "kl302" in tokens and "f32" in tokens
    assert "的" not in tokens and "是" not in tokens
    assert tokenize("KL320 filter") == ["kl320", "filter"]  # same lowercasing on both paths


def chinese_corpus() -> list[Chunk]:
    """A few dozen product notes where codes differ by one swapped digit (KL320 vs KL302)."""
    rooms = ["卧室", "客厅", "书房", "办公室", "会议室", "儿童房"]
    texts = []
    for n in range(300, 336):
        code = f"KL{n}"
        texts.append(
            f"{code} 是一款适合{rooms[n % 6]}的空气净化器，滤网型号为 F{n % 40}，建议每 {3 + n % 5} 个月更换。"
        )
    texts.append("所有型号的保修期都是两年，滤网是耗材。")
    texts.append("使用说明：先插电，然后按下电源键，这是最重要的一步。")
    return [Chunk(f"zh{i}#0", f"zh{i}", "", t, 0, 0, len(t)) for i, t in enumerate(texts)]


@pytest.mark.parametrize("backend", ["bm25s", "rank_bm25"])
def test_chinese_model_code_matches_exactly(backend):
    chunks = chinese_corpus()
    retriever = BM25Retriever.build(chunks, backend)
    for code, wrong in [("KL320", "KL302"), ("KL302", "KL320")]:
        scored = retriever.scored(f"{code} 的滤网是什么型号？", depth=5)
        right_doc = next(i for i, c in enumerate(chunks) if c.text.startswith(code))
        wrong_doc = next(i for i, c in enumerate(chunks) if c.text.startswith(wrong))
        neutral = next(i for i, c in enumerate(chunks) if c.text.startswith("KL310"))
        assert scored.ranked[0][0] == right_doc
        # The look-alike code adds nothing: the wrong document scores like any other model's.
        assert scored.full[wrong_doc] == pytest.approx(scored.full[neutral], rel=0.05)
        assert scored.full[right_doc] > 2 * scored.full[wrong_doc]
        only_code = retriever.search(code, top_k=5)
        assert [h.text[:5] for h in only_code] == [code]
