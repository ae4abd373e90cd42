"""Answer scores: the official SQuAD v1.1 / HotpotQA logic, the Chinese path, answer extraction.

`tests/data/official_answer_scores.jsonl` was produced by the official scripts' own functions
(SQuAD v1.1 `evaluate-v1.1.py` normalize_answer / exact_match_score, HotpotQA
`hotpot_evaluate_v1.py` f1_score) run on each (prediction, gold) pair, copied verbatim.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigkit.eval.answers import (
    cover_match,
    exact_match,
    extract_answer,
    normalize_answer,
    squad_exact,
    squad_f1,
    token_f1,
)

ROWS = [json.loads(line) for line in
        (Path(__file__).parent / "data" / "official_answer_scores.jsonl").read_text("utf-8").splitlines()]


def test_fixture_is_large_enough_and_covers_the_tricky_classes():
    assert len(ROWS) >= 30
    cases = " ".join(r["case"] for r in ROWS)
    for word in ("hyphen", "article", "unicode", "number", "yes"):
        assert word in cases


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_scores_match_the_official_scripts(row):
    assert squad_exact(row["prediction"], row["gold"]) == row["em"]
    assert squad_f1(row["prediction"], row["gold"]) == pytest.approx(row["f1"], abs=1e-6)
    if row["gold"] and normalize_answer(row["gold"]):
        assert exact_match(row["prediction"], [row["gold"]]) == row["em"]
        assert token_f1(row["prediction"], [row["gold"]]) == pytest.approx(row["f1"], abs=1e-6)


def test_chinese_gold_is_scored_per_character_on_its_own_path():
    assert exact_match("北京大学。", ["北京大学"]) == 1.0  # Unicode punctuation goes on this path
    assert cover_match("它位于北京大学附近。", ["北京大学"]) == 1.0
    # the official path would make the whole phrase one token and score 0
    assert squad_f1("北京", "北京大学") == 0.0


@pytest.mark.parametrize("reply, question, short", [
    ("The answer is Shawn Levy.", "Who directed Free Guy?", "Shawn Levy"),
    ("I think the final answer is: 1932. It was long ago.", "When was he born?", "1932"),
    ("Free Guy was directed by Shawn Levy. He is Canadian.", "Who directed Free Guy?", "Shawn Levy"),
    ("Yes, both films are from the United States.", "Are both films American?", "yes"),
    ("No. The first one is older.", "Did the two films come out in the same year?", "no"),
    ("He was born on 5 May 1932 in Budapest.", "When was Zoltan Brkic born?", "5 May 1932"),
    ("答案是北京。", "他出生在哪里？", "北京"),
    ("It is hard to say.", "Who directed Free Guy?", "It is hard to say"),
])
def test_extract_answer(reply, question, short):
    assert extract_answer(reply, question) == short


def test_extraction_turns_a_sentence_answer_into_an_exact_match():
    reply = "Free Guy was directed by Shawn Levy. [[citation:p#0]]"
    assert exact_match(reply, ["Shawn Levy"]) == 0.0
    assert exact_match(extract_answer(reply, "Who directed Free Guy?"), ["Shawn Levy"]) == 1.0
