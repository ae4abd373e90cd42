"""Metric unit tests: answer scores, retrieval evidence, trace counts, aggregation."""

from __future__ import annotations

import math

import pytest

from rigkit.eval.aggregate import aggregate, percentile
from rigkit.eval.answers import answer_tokens, cover_match, exact_match, normalize_answer, token_f1
from rigkit.eval.metrics import (
    FaithfulnessScorer,
    QAItem,
    citation_precision,
    injected_passages,
    score_result,
    support_recall,
)
from rigkit.text import split_sentences
from rigkit.trace import (
    Attribution,
    Decision,
    Hit,
    Injection,
    Query,
    RIGResult,
    RoundTrace,
    Segment,
)


def hit(cid: str, title: str, text: str = "", doc: str | None = None) -> Hit:
    return Hit(chunk_id=cid, doc_id=doc or cid.split("#")[0], title=title, text=text, score=1.0)


ITEM = QAItem(id="q1", question="Who directed Free Guy?", answer="Shawn Levy",
              aliases=("Shawn Adam Levy",), type="compositional",
              supporting_titles=("Free Guy", "Shawn Levy"), supporting_pids=("p-free", "p-levy"))


def test_normalize_follows_squad():
    # SQuAD v1.1 removes ASCII punctuation (no space left behind) and keeps other characters
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("Jean-Luc") == "jeanluc"
    assert normalize_answer("An apple, a pear") == "apple pear"
    assert normalize_answer("“Angi Vera”") == "“angi vera”"


def test_exact_match_and_f1_use_aliases():
    assert exact_match("the Shawn Levy.", ITEM.golds) == 1.0
    assert exact_match("Shawn Adam Levy", ITEM.golds) == 1.0
    assert exact_match("Levy", ITEM.golds) == 0.0
    assert token_f1("Levy", ITEM.golds) == pytest.approx(2 * 1 * 0.5 / 1.5)
    # best over golds: "shawn adam levy" vs prediction "adam levy" -> P=1, R=2/3
    assert token_f1("Adam Levy", ITEM.golds) == pytest.approx(0.8)
    assert token_f1("Pál Gábor", ITEM.golds) == 0.0


def test_yes_no_is_all_or_nothing():
    assert token_f1("yes", ["yes"]) == 1.0
    assert token_f1("yes it is", ["yes"]) == 0.0
    assert token_f1("no", ["yes"]) == 0.0
    assert cover_match("Yes, it is older.", ["yes"]) == 1.0


def test_chinese_is_scored_per_character():
    assert answer_tokens("北京大学。") == ["北", "京", "大", "学"]
    assert answer_tokens("KL320 型号") == ["kl320", "型", "号"]
    assert exact_match("北京大学", ["北京大学"]) == 1.0
    assert token_f1("北京", ["北京大学"]) == pytest.approx(2 * 1.0 * 0.5 / 1.5)


def test_cover_match_needs_contiguous_tokens():
    assert cover_match("The film was directed by Shawn Levy in 2021.", ITEM.golds) == 1.0
    assert cover_match("Levy and Shawn", ITEM.golds) == 0.0


def _round(index: int, fire: bool, hits: list[Hit], added: list[str], tokens: int = 0,
           extra: int = 0, llm_calls: int = 0) -> RoundTrace:
    return RoundTrace(
        index=index, segment=Segment(text=f"segment {index}."),
        decision=Decision(fire, 0.9 if fire else 0.1, "test", extra_forward_passes=extra),
        query=Query("q", "masked", llm_calls=llm_calls) if fire else None,
        hits=hits, injection=Injection(added=added, tokens_added=tokens) if fire else None,
        timings={"generate": 0.5, "retrieve": 0.1 if fire else 0.0},
    )


def _result() -> RIGResult:
    h1 = hit("p-free#0", "Free Guy", "Free Guy is a 2021 film directed by Shawn Levy.")
    h2 = hit("p-other#0", "Other film", "Unrelated text about a river.")
    h3 = hit("p-levy#0", "Shawn Levy", "Shawn Levy is a Canadian director.")
    rounds = [
        _round(0, True, [h1, h2], added=["p-free#0"], tokens=40, extra=1, llm_calls=1),
        _round(1, False, [], added=[]),
        _round(2, True, [h1, h3], added=["p-levy#0"], tokens=30),  # h1 deduplicated
    ]
    return RIGResult(
        question=ITEM.question, answer="Free Guy was directed by Shawn Levy. [[citation:p-free#0]]",
        rounds=rounds, used_retrieval_times=2, citations=["p-free#0", "p-other#0"],
        tokens={"prompt": 100, "generated": 20, "prefilled": 150, "reused": 90},
    )


def test_injected_passages_are_the_added_ones_only():
    ids = [h.chunk_id for h in injected_passages(_result())]
    assert ids == ["p-free#0", "p-levy#0"]


def test_support_recall_by_title_and_pid():
    hits = [hit("p-free#0", "Free Guy"), hit("x#0", "Shawn Levy", doc="p-levy-copy")]
    by_title, by_pid = support_recall(hits, ITEM)
    assert by_title == 1.0
    assert by_pid == 0.5  # the second title matches, its paragraph id does not
    assert support_recall([], ITEM) == (0.0, 0.0)
    assert support_recall(hits, QAItem("q", "?", "a")) == (None, None)


def test_citation_precision_counts_answer_or_support():
    result = _result()
    # p-free#0 is supporting; p-other#0 is neither (never injected, not supporting).
    assert citation_precision(result, ITEM, injected_passages(result)) == 0.5
    result.citations = []
    result.answer = "No citations here."
    assert citation_precision(result, ITEM, []) is None


class FakeEmbedder:
    """Bag-of-letters vectors: similar texts share letters; deterministic and model-free."""

    def encode(self, texts, normalize_embeddings=True):
        out = []
        for text in texts:
            vec = [0.0] * 26
            for word in text.lower().split():
                for ch in word:
                    if "a" <= ch <= "z":
                        vec[ord(ch) - 97] += 1.0
            norm = math.sqrt(sum(v * v for v in vec)) or 1.0
            out.append([v / norm for v in vec])
        return out


def test_faithfulness_flags_unsupported_sentences():
    passages = [hit("c1", "Free Guy", "Free Guy is a film directed by Shawn Levy.")]
    scorer = FaithfulnessScorer(FakeEmbedder(), threshold=0.9)
    good = scorer("Free Guy is a film directed by Shawn Levy.", passages)
    assert good == {"answer_sentences": 1, "supported_sentences": 1,
                    "all_sentences_supported": True, "sentence_support_share": 1.0}
    mixed = scorer("Free Guy is a film directed by Shawn Levy. Zzz qqq xxx.", passages)
    assert mixed["supported_sentences"] == 1 and mixed["all_sentences_supported"] is False
    assert mixed["sentence_support_share"] == 0.5
    assert scorer("An answer.", [])["all_sentences_supported"] is None


def test_support_counts_only_passages_in_context_when_the_sentence_was_written():
    passages = [hit("c1", "Free Guy", "Free Guy is a film directed by Shawn Levy.")]
    scorer = FaithfulnessScorer(FakeEmbedder(), threshold=0.9)
    answer = "Free Guy is a film directed by Shawn Levy. Free Guy is a film directed by Shawn Levy."
    row = scorer(answer, passages, visible=[[], ["c1"]])  # c1 arrived after the first sentence
    assert row["supported_sentences"] == 1 and row["all_sentences_supported"] is False
    # score_result reads the visibility from the trace's attributions
    result = _result()
    result.answer = "Free Guy was directed by Shawn Levy. [[citation:p-free#0]]"
    result.attributions = [Attribution("Free Guy was directed by Shawn Levy.", 0, 36, visible=[])]
    row = score_result(result, ITEM, FaithfulnessScorer(FakeEmbedder()))
    assert row["supported_sentences"] == 0 and row["sentence_support_share"] == 0.0
    result.attributions[0].visible = ["p-free#0"]
    row = score_result(result, ITEM, FaithfulnessScorer(FakeEmbedder()))
    assert row["supported_sentences"] == 1 and row["all_sentences_supported"] is True


def test_split_sentences_handles_cjk_and_citations():
    assert split_sentences("One fact. [[citation:a]] Two facts! 三个。四个") == [
        "One fact.", "Two facts!", "三个。", "四个"]


def test_score_result_reads_the_trace():
    row = score_result(_result(), ITEM, FaithfulnessScorer(FakeEmbedder()))
    assert row["cover_em"] == 1.0 and row["em"] == 0.0
    assert row["retrievals"] == 2 and row["segments"] == 3
    assert row["trigger_rate"] == pytest.approx(2 / 3)
    assert row["passages_injected"] == 2 and row["tokens_injected"] == 70
    assert row["support_recall"] == 1.0 and row["support_recall_pid"] == 1.0
    assert row["tokens_prefilled"] == 150 and row["tokens_reused"] == 90
    assert row["extra_forward_passes"] == 1 and row["extra_model_calls"] == 1
    assert row["model_calls"] == 4  # three rounds, each a generation request, and one helper call
    assert row["forward_passes"] == 21
    assert row["timings"] == pytest.approx({"generate": 1.5, "retrieve": 0.2})
    # no recorded visibility (an old trace): every injected passage counts; h1 supports it
    assert row["all_sentences_supported"] is True and row["sentence_support_share"] == 1.0
    assert row["extracted_answer"] == "Shawn Levy"
    assert row["em_extracted"] == 1.0 and row["f1_extracted"] == 1.0


def test_percentile_matches_numpy_linear():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4, 5], 95) == pytest.approx(4.8)
    assert percentile([], 50) is None


def test_aggregate_mean_and_spread_across_runs():
    rows = []
    for run, ems in enumerate([[1, 0], [1, 1]]):
        for i, em in enumerate(ems):
            rows.append({"id": f"q{i}", "system": "rag", "run": run, "type": "t" + str(i),
                         "em": em, "latency": 1.0 + i, "timings": {"generate": 1.0},
                         "support_recall": None})
    rows.append({"id": "q9", "system": "rag", "run": 0, "type": "t0", "error": "Boom"})
    groups = aggregate(rows)
    overall = groups[0]
    assert (overall.system, overall.type, overall.runs, overall.errors) == ("rag", "all", 2, 1)
    assert overall.mean["em"] == pytest.approx(0.75)  # run means 0.5 and 1.0
    assert overall.spread["em"] == pytest.approx(math.sqrt(0.125))
    assert overall.mean["support_recall"] is None
    assert overall.latency_p50 == pytest.approx(1.5)
    assert overall.stages == {"generate": 1.0}
    by_type = {g.type: g for g in groups[1:]}
    assert by_type["t0"].mean["em"] == 1.0 and by_type["t1"].mean["em"] == 0.5


def test_sentence_support_share_pools_sentences_across_questions():
    rows = [
        {"id": "q1", "system": "rig", "run": 0, "answer_sentences": 4, "supported_sentences": 4,
         "all_sentences_supported": True, "sentence_support_share": 1.0},
        {"id": "q2", "system": "rig", "run": 0, "answer_sentences": 1, "supported_sentences": 0,
         "all_sentences_supported": False, "sentence_support_share": 0.0},
    ]
    overall = aggregate(rows, by_type=False)[0]
    assert overall.mean["sentence_support_share"] == pytest.approx(0.8)  # 4 of 5 sentences
    assert overall.mean["all_sentences_supported"] == pytest.approx(0.5)  # 1 of 2 questions
