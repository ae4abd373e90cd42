"""Which segments make up the answer: recorded by the loop on each round (`RoundTrace.kept`) and
read in one place (`rigkit.trace.kept_order`) by the loop, the widgets, the metrics and the
decision tables. Hand-built traces pin the two readers that used to disagree with the loop."""

from __future__ import annotations

import json

from rigkit.eval.decisions import fact_segment, fired_segments
from rigkit.eval.metrics import QAItem, score_result
from rigkit.eval.runner import summarize_result
from rigkit.testing import ScriptedGenerator, make_segment
from rigkit.trace import (
    Action,
    Decision,
    Kept,
    RIGResult,
    RoundTrace,
    answer_end,
    kept_order,
    kept_segments,
    round_from_dict,
)
from rigkit.widgets.render import draft_html
from tests.test_answer_checks import DEMO, FlagWord, make


def _round(i: int, text: str, action: str, fired: bool = False, finish: str = "stop", **fields) -> RoundTrace:
    return RoundTrace(i, make_segment(text, finish_reason=finish), Decision(fired, float(fired), "r"),
                      action=Action(action), **fields)


def test_the_order_follows_what_each_round_kept():
    words = [Kept.SEGMENT, Kept.NOTHING, Kept.SET_ASIDE, Kept.SEGMENT, Kept.REWRITE, Kept.PREFIX]
    # round 1 set aside, put back by round 2; round 4's rewrite takes round 3's place; round 5 kept its start
    assert kept_order(words) == [0, 1, 4, 5]
    assert kept_order([]) == [] and kept_order([Kept.NOTHING, Kept.NOTHING]) == []


def test_the_loop_records_what_it_kept_and_the_answer_is_made_of_exactly_that():
    result = make(ScriptedGenerator(DEMO), FlagWord("NOTICE")).run("What must I ship?")
    assert [r.action for r in result.rounds] == ["accept", "accept", "regenerate", "fallback", "accept"]
    assert [r.kept for r in result.rounds] == ["segment", "segment", "", "set_aside", "segment"]
    assert "".join(s.text for s in kept_segments(result.rounds)) == DEMO[0] + DEMO[1] + DEMO[2] + DEMO[4]
    again = RIGResult.from_json(result.to_json())
    assert json.loads(result.to_json())["rounds"][3]["kept"] == "set_aside" and again == result


def test_the_loop_records_a_repeats_kept_start():
    result = make(ScriptedGenerator(DEMO), FlagWord("NOTICE"), rewrite_check=False).run("What must I ship?")
    assert [(r.action, r.kept) for r in result.rounds][-1] == ("repeat", "")  # the rewrite repeated from its start
    looped = ["Paris is the capital.", " It is big. Paris is the capital."]
    result = make(ScriptedGenerator(looped), FlagWord("nothing")).run("What is the capital?")
    assert [(r.action, r.kept) for r in result.rounds] == [("accept", "segment"), ("repeat", "prefix")]
    assert answer_end(result.rounds)[1] is True


def test_rounds_of_version_4_derive_what_they_kept_once_on_load():
    rounds = [_round(0, "A.", "regenerate", True), _round(1, "", "restore", finish="end_of_turn"),
              _round(2, "B.", "regenerate", True), _round(3, "B2.", "fallback"), _round(4, "C.", "accept"),
              _round(5, "C2.", "ground"), _round(6, "C3.", "ground", fallback="not supported")]
    old = [dict(json.loads(RIGResult("q", "a", rounds=rounds).to_json())["rounds"][i]) for i in range(len(rounds))]
    for r in old:
        r.pop("kept")
    loaded = [round_from_dict(r) for r in old]
    assert [r.kept for r in loaded] == ["", "set_aside", "", "set_aside", "segment", "rewrite", ""]
    assert [s.text for s in kept_segments(loaded)] == ["A.", "B.", "C2."]


def test_the_metrics_read_the_end_of_the_answer_from_the_kept_segment_not_a_dropped_rewrite():
    # the flagged segment ended the turn; its rewrite (dropped) did not: the answer was not cut
    rounds = [_round(0, "Paris is the capital of", "regenerate", True, finish="end_of_turn"),
              _round(1, "Lyon is a city of", "fallback", fallback="the rewrite drops the flagged 'Paris'")]
    result = RIGResult("What is the capital?", "Paris is the capital of", rounds=rounds, used_retrieval_times=1)
    item = QAItem(id="q", question="What is the capital?", answer="Paris")
    row = score_result(result, item)
    assert row["ends_mid_sentence"] == 1 and row["cut_mid_sentence"] == 0
    rounds[0].segment.finish_reason = "stop"  # generation stopped there: cut
    assert score_result(result, item)["cut_mid_sentence"] == 1


def _row(rounds: list[RoundTrace], answer: str, gold: list[str]) -> dict:
    summary = summarize_result(RIGResult("q", answer, rounds=rounds))
    return {"id": "q", "system": "rig", "answer": answer, "gold": gold, "summary": summary}


def test_the_decision_table_reads_a_restored_segment_and_counts_a_fallback():
    # the set-aside segment holds the fact and is put back: the restore round's own (empty) text is not a segment
    restored = [_round(0, "Intro.", "accept"), _round(1, "Born in 1900.", "regenerate", True),
                _round(2, "", "restore", finish="end_of_turn")]
    row = _row(restored, "Intro. Born in 1900.", ["1900"])
    assert fact_segment(row, None) == 1 and fired_segments(row) == {1}
    # a fallback keeps the set-aside segment: the segments after it keep their places
    fell_back = [_round(0, "Intro.", "accept"), _round(1, "Born then.", "regenerate", True),
                 _round(2, "Unrelated.", "fallback", fallback="drops"), _round(3, "Died in 1950.", "accept", True)]
    row = _row(fell_back, "Intro. Born then. Died in 1950.", ["1950"])
    assert fact_segment(row, None) == 2 and fired_segments(row) == {1, 2}
    for line in (row,):  # a line written before rounds recorded `kept` reads the same from its actions
        for rnd in line["summary"]["rounds"]:
            rnd.pop("kept")
        assert fact_segment(line, None) == 2 and fired_segments(line) == {1, 2}


def test_the_widget_draws_the_kept_segments():
    rounds = [_round(0, "Intro.", "accept"), _round(1, "Flagged.", "regenerate", True),
              _round(2, "Rewrite.", "fallback", fallback="drops"), _round(3, " Next.", "accept")]
    html = draft_html(rounds, 3)
    assert html.index("Intro.") < html.index("Flagged.") < html.index("Next.") and "Rewrite." not in html
    assert "rig-discarded" in draft_html(rounds, 2) and "Flagged." in draft_html(rounds, 2)
