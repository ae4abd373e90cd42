"""Reranking: the wrapper's logic with a scripted scorer, UPR scoring on a tiny random model,
the `--rerank` flags, and one slow test where the real default model reranks demo hits."""

from __future__ import annotations

import math

import pytest

from rigkit.config import RetrievalConfig, RunConfig
from rigkit.errors import InputError
from rigkit.retrieval.rerank import (
    CrossEncoderReranker,
    QueryLikelihoodReranker,
    RerankedRetriever,
    Reranker,
    drop_near_duplicates,
    ranked_by,
    reranker_from_config,
)
from rigkit.testing import DictRetriever, ScriptedGenerator
from rigkit.trace import Hit


def hit(cid: str, text: str | None = None, rank: int = 1) -> Hit:
    return Hit(chunk_id=cid, doc_id=cid, title=cid.upper(), text=text or f"passage about {cid} number {rank}",
               score=1.0 / rank, ranks={"hybrid": rank}, scores={"hybrid": 1.0 / rank})


def candidates(n: int) -> list[Hit]:
    return [hit(f"c{i}", f"distinct words {i} " + " ".join(f"w{i}x{j}" for j in range(8)), i)
            for i in range(1, n + 1)]


class ScriptedScorer:
    """A reranker scoring each hit from a table by chunk id (unlisted: 0); records what it saw."""

    def __init__(self, table: dict[str, float]):
        self.table, self.seen = table, []

    def rerank(self, query, hits):
        self.seen.append([h.chunk_id for h in hits])
        return ranked_by(hits, [self.table.get(h.chunk_id, 0.0) for h in hits])


class BatchRetriever(DictRetriever):
    def __init__(self, hits):
        super().__init__({}, default=hits)
        self.batches = []

    def search_many(self, queries, top_k=5):
        self.batches.append((list(queries), top_k))
        return [self.default[:top_k] for _ in queries]


# -- the wrapper --------------------------------------------------------------------------------
def test_reranked_retriever_asks_for_candidates_and_keeps_top_k_best_first():
    inner = DictRetriever({}, default=candidates(25))
    scorer = ScriptedScorer({"c7": 3.0, "c20": 2.0, "c1": 1.0})
    hits = RerankedRetriever(inner, scorer, candidates=20).search("q", top_k=3)
    assert [h.chunk_id for h in hits] == ["c7", "c20", "c1"]
    assert len(scorer.seen[0]) == 20  # rerank_candidates hits asked of the inner retriever
    assert isinstance(scorer, Reranker)


def test_ranks_before_and_after_and_the_rerank_score_are_recorded():
    hits = RerankedRetriever(DictRetriever({}, default=candidates(5)),
                             ScriptedScorer({"c3": 5.0, "c5": 4.0}), candidates=5).search("q", 2)
    first, second = hits
    assert first.ranks["before_rerank"] == 3 and first.ranks["rerank"] == 1
    assert second.ranks["before_rerank"] == 5 and second.ranks["rerank"] == 2
    assert first.scores["rerank"] == 5.0 and first.score == 5.0
    assert first.ranks["hybrid"] == 3  # the inner retriever's own ranks stay


def test_ties_keep_the_inner_order_and_top_k_above_candidates_is_honoured():
    inner = DictRetriever({}, default=candidates(8))
    hits = RerankedRetriever(inner, ScriptedScorer({}), candidates=3).search("q", top_k=6)
    assert [h.chunk_id for h in hits] == [f"c{i}" for i in range(1, 7)]


def test_near_duplicates_are_removed_before_reranking():
    text = "the apache licence grants a patent licence to every user of the code"
    hits = [hit("a", text, 1), hit("b", text + " too", 2), hit("c", "mit is short and permissive", 3)]
    scorer = ScriptedScorer({"b": 9.0})
    out = RerankedRetriever(DictRetriever({}, default=hits), scorer, candidates=3).search("q", 3)
    assert scorer.seen == [["a", "c"]]  # "b" never reached the reranker
    assert out[0].metadata["near_duplicates"] == ["b"]


def test_near_duplicates_by_embedding_cosine():
    import numpy as np

    vectors = {"x": [1.0, 0.0], "y": [0.99, 0.141], "z": [0.0, 1.0]}  # cos(x, y) ~ 0.99

    def embed(texts):
        return np.array([vectors[t] for t in texts]) / np.linalg.norm([vectors[t] for t in texts], axis=1)[:, None]

    hits = [hit("1", "x"), hit("2", "y"), hit("3", "z")]
    assert [h.chunk_id for h in drop_near_duplicates(hits, embed)] == ["1", "3"]
    assert [h.chunk_id for h in drop_near_duplicates(hits, embed, threshold=0.999)] == ["1", "2", "3"]


def test_search_many_is_kept_exactly_when_the_inner_has_it():
    plain = RerankedRetriever(DictRetriever({}, default=candidates(4)), ScriptedScorer({}), 4)
    assert not hasattr(plain, "search_many")
    inner = BatchRetriever(candidates(30))
    batched = RerankedRetriever(inner, ScriptedScorer({"c9": 1.0}), candidates=25)
    out = batched.search_many(["q1", "q2"], 2)
    assert inner.batches == [(["q1", "q2"], 25)]  # one inner call, candidates per query
    assert [[h.chunk_id for h in hits] for hits in out] == [["c9", "c1"], ["c9", "c1"]]


def test_config_and_factory():
    assert RetrievalConfig().rerank == "none" and RetrievalConfig().rerank_candidates == 20
    assert reranker_from_config(RetrievalConfig()) is None
    assert isinstance(reranker_from_config(RetrievalConfig(rerank="cross-encoder/x")), CrossEncoderReranker)
    with pytest.raises(InputError, match="generator"):
        reranker_from_config(RetrievalConfig(rerank="upr"))
    with pytest.raises(InputError, match="cross-encoder"):  # a generator that cannot score
        reranker_from_config(RetrievalConfig(rerank="upr"), ScriptedGenerator([]))
    with pytest.raises(InputError, match="at least 1"):
        RerankedRetriever(DictRetriever({}), ScriptedScorer({}), candidates=0)
    with pytest.raises(Exception, match="rerank_candidates"):
        RunConfig.from_dict({"retrieval": {"rerank_candidates": 0}})


def test_build_wraps_a_retriever_once_when_rerank_is_set():
    from rigkit.build import with_reranker

    inner = DictRetriever({}, default=candidates(3))
    assert with_reranker(inner, RetrievalConfig(), None) is inner
    wrapped = with_reranker(inner, RetrievalConfig(rerank="some/cross-encoder", rerank_candidates=7))
    assert isinstance(wrapped, RerankedRetriever) and wrapped.candidates == 7
    assert with_reranker(wrapped, RetrievalConfig(rerank="other")) is wrapped


def test_a_missing_cross_encoder_is_one_clear_line():
    reranker = CrossEncoderReranker("/nonexistent/cross-encoder-folder")
    with pytest.raises(InputError, match="upr"):
        reranker.rerank("q", candidates(2))


# -- UPR on a tiny random model -------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from tests.tiny_model import tiny_generator

    return tiny_generator(seed=3)


def test_batched_scores_equal_one_by_one_scores(tiny):
    prompts = ["the licence", "a code file with a notice and a patent grant", "you may"]
    conts = [" is mit", " ship the source", " not copy the binary code"]
    batched = tiny.score_continuations(prompts, conts, batch_size=3)
    alone = [tiny.score_continuations([p], [c])[0] for p, c in zip(prompts, conts)]
    assert batched == pytest.approx(alone, abs=1e-4)
    assert all(math.isfinite(s) and s < 0 for s in batched)


def test_score_is_the_mean_log_probability_of_the_continuation(tiny):
    import torch

    prompt, cont = "the apache licence", " grant a patent"
    p_ids = tiny.tokenizer(prompt).input_ids
    c_ids = tiny.tokenizer(cont, add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = tiny.model(input_ids=torch.tensor([p_ids + c_ids])).logits[0]
    logprobs = torch.log_softmax(logits.float(), -1)
    expected = sum(float(logprobs[len(p_ids) + i - 1, t]) for i, t in enumerate(c_ids)) / len(c_ids)
    assert tiny.score_continuations([prompt], [cont])[0] == pytest.approx(expected, abs=1e-5)


def test_upr_reranks_by_query_likelihood(tiny):
    hits = candidates(4)
    reranker = QueryLikelihoodReranker(tiny, batch_size=2)
    out = reranker.rerank("what is the licence", hits)
    scores = [h.scores["rerank"] for h in out]
    assert sorted(h.chunk_id for h in out) == sorted(h.chunk_id for h in hits)
    assert scores == sorted(scores, reverse=True) and all(math.isfinite(s) for s in scores)


# -- the command line -------------------------------------------------------------------------
@pytest.mark.parametrize("command", [
    ["ask", "q"], ["search", "idx", "q"], ["eval-retrieval", "--qa", "x.jsonl"],
    ["eval", "--qa", "x.jsonl", "--out", "o"],
])
def test_rerank_flag_parses_on_every_retrieving_command(command):
    from rigkit.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(command).rerank is None
    assert parser.parse_args([*command, "--rerank"]).rerank == "upr"
    assert parser.parse_args([*command, "--rerank", "cross-encoder/ms-marco-MiniLM-L6-v2"]).rerank \
        == "cross-encoder/ms-marco-MiniLM-L6-v2"


# -- the real default model -----------------------------------------------------------------------
@pytest.mark.slow
def test_upr_with_the_default_model_reranks_demo_hits(default_generator, demo_retriever):
    question = "Which licence requires a NOTICE file to be kept when the software is shipped?"
    reranked = RerankedRetriever(demo_retriever, QueryLikelihoodReranker(default_generator), candidates=6)
    hits = reranked.search(question, top_k=4)
    assert len(hits) == 4
    assert [h.ranks["rerank"] for h in hits] == [1, 2, 3, 4]
    assert all(1 <= h.ranks["before_rerank"] <= 6 for h in hits)
    assert all(math.isfinite(h.scores["rerank"]) and h.scores["rerank"] < 0 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    # the passage that answers it is among the candidates and stays in the kept four
    assert "demo-apache-notice" in {h.doc_id for h in hits}


def test_the_hit_table_shows_the_move_of_a_reranked_hit():
    from rigkit.widgets.render import hits_html

    hits = RerankedRetriever(DictRetriever({}, default=candidates(4)),
                             ScriptedScorer({"c3": 1.0}), candidates=4).search("q", 2)
    html = hits_html(hits)
    assert "3 → 1" in html and "1 → 2" in html
    assert 'data-retriever="rerank"' in html and 'data-retriever="before_rerank"' not in html
    assert "→" not in hits_html(candidates(2))  # not reranked: plain positions
