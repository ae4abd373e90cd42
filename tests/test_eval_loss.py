"""Where the loss lies: decision quality, per-hop recall and the ceilings table, on hand-made rows.

Every expected figure below is worked out by hand from the fixture in the comments.
"""

from __future__ import annotations

import json

import pytest

from rigkit.eval.answers import answer_kind, typed_match
from rigkit.eval.decisions import (
    NEEDED,
    NOT_NEEDED,
    OUT_OF_REACH,
    decision_quality,
    fact_segment,
    fired_segments,
    need_labels,
    with_type_aware,
)
from rigkit.eval.gold import GoldChain, GoldHop
from rigkit.eval.hops import hop_record, hop_records, hop_rows, hop_table, retrievals_of
from rigkit.eval.loss import ceiling_table, loss_tables
from rigkit.eval.paired import ratio_interval, share_interval
from rigkit.eval.report import markdown_report
from rigkit.eval.runner import summarize_result


def _chain(qid: str) -> GoldChain:
    return GoldChain(qid, f"question {qid}?", "2hop", [
        GoldHop("p1", "First", "first hop query", "Bridge"),
        GoldHop("p2", "Second", "second hop query", "Answer")])


GOLD = {q: _chain(q) for q in ("a", "b", "c", "d")}


def _round(fire: bool, action: str, query: str | None = None, hits=(), text: str | None = None) -> dict:
    out = {"fire": fire, "action": action, "query": query, "hits": [f"{h}#0" for h in hits], "error": None}
    return out if text is None else {**out, "text": text}


def _row(qid: str, system: str, score: float, retrievals: int, rounds=(), upfront=(), answer="x") -> dict:
    return {"id": qid, "system": system, "run": 0, "type": "2hop", "question": f"question {qid}?",
            "gold": ["Answer"], "answer": answer, "type_aware": score, "cover_em": score,
            "retrievals": retrievals, "error": None,
            "summary": {"rounds": list(rounds), "upfront": [f"{p}#0" for p in upfront]}}


# closed-book right on a; wrong on b, c, d. rag right on b only. So: a not needed, b needed,
# c and d out of reach.
CLOSED = [_row("a", "closed_book", 1, 0), *(_row(q, "closed_book", 0, 0) for q in "bcd")]
RAG = [_row("a", "rag", 1, 1, upfront=["p1"]), _row("b", "rag", 1, 1, upfront=["p1", "p2"]),
       _row("c", "rag", 0, 1, upfront=["px"]), _row("d", "rag", 0, 1, upfront=["p1"])]
# rig: retrieves twice on a (not needed), never on b (needed), once on c and d.
RIG = [
    _row("a", "rig:prob", 1, 2, [_round(True, "regenerate", "q a1", ["p1"]), _round(True, "regenerate", "q a2", ["p2"]),
                                 _round(False, "accept")]),
    _row("b", "rig:prob", 0, 0, [_round(False, "accept")]),
    _row("c", "rig:prob", 0, 1, [_round(False, "accept"), _round(True, "regenerate", "second hop query x", ["p2"]),
                                 _round(False, "accept")]),
    _row("d", "rig:prob", 0, 1, [_round(True, "regenerate", "first hop", ["p1"]), _round(False, "accept")]),
]
ROWS = CLOSED + RAG + RIG


def test_labels_and_decision_quality_worked_by_hand():
    labels = need_labels(ROWS, "closed_book", "rag")
    assert labels == {"a": NOT_NEEDED, "b": NEEDED, "c": OUT_OF_REACH, "d": OUT_OF_REACH}
    rag, rig = decision_quality(ROWS, labels, GOLD, skip=("closed_book",))
    assert rag.counts == {NEEDED: 1, NOT_NEEDED: 1, OUT_OF_REACH: 2}
    assert (rag.over.value, rag.under.value, rag.where_needed.value) == (1.0, 0.0, 0.25)  # 1 of 4 searches on b
    assert rag.at_fact is None  # plain RAG never fires
    # rig: searched on the one not-needed question (over 1/1), not on the needed one (under 1/1),
    # and none of its 4 searches (2 + 0 + 1 + 1) was on a needed question
    assert (rig.over.value, rig.under.value, rig.where_needed.value) == (1.0, 1.0, 0.0)
    assert rig.at_fact.value == 0.0 and rig.at_fact.n == 1


def test_fact_segment_and_fired_segments():
    # rounds: fire on segment 0 (rewritten), keep it, keep segment 1, fire on segment 2 and keep it
    row = _row("a", "rig:prob", 0, 2, [
        _round(True, "regenerate", text="The bridge is Foo."), _round(False, "accept", text="The bridge is Bridge."),
        _round(False, "accept", text="It was built in 1900."), _round(True, "continue", text="The answer is Answer.")])
    assert fired_segments(row) == {0, 2}
    assert fact_segment(row, GOLD["a"]) == 0  # "Bridge" is a fact of the chain, written in segment 0
    # without round texts the answer's sentences stand for the segments
    plain = {**_row("a", "rig:prob", 0, 0), "answer": "I think so. It is Answer [[citation:p2#0]]."}
    assert fact_segment(plain, GOLD["a"]) == 1
    # no fact written: the segment of the short answer given, else the first
    assert fact_segment({**plain, "answer": "No idea. Paris.", "extracted_answer": "Paris"}, GOLD["a"]) == 1
    assert fact_segment({**plain, "answer": "No idea."}, None) == 0


def test_per_hop_records_and_table():
    record = hop_record(RIG[2], GOLD["c"])  # c: one search, found p2 only
    assert record.found == [None, 1]
    assert record.queries == ["second hop query x", "second hop query x"]
    assert hop_record(RAG[1], GOLD["b"]).found == [1, 1]
    assert hop_record(RAG[1], GOLD["b"]).queries == ["question b?", "question b?"]  # rag searches the question
    old_rag = {**RAG[0], "summary": {"rounds": [_round(False, "accept")]}}  # kept no upfront list
    assert hop_record(old_rag, GOLD["a"]) is None
    records = hop_records(RAG + RIG, GOLD)
    header, rows = hop_table(records)
    by_system = {r[0]: dict(zip(header, r)) for r in rows}
    # rag: hop 1 on a, b, d (3/4); hop 2 on b (1/4); rig: hop 1 on a, d (2/4), hop 2 on a, c (2/4)
    assert by_system["rag"]["Hop 1 found [95%]"].startswith("0.750")
    assert by_system["rig:prob"]["Hop 2 found [95%]"].startswith("0.500")
    assert by_system["rig:prob"]["Every hop found [95%]"].startswith("0.250")  # a only
    assert by_system["rig:prob"]["Hop 2 first found in search 1 / 2 / 3+"] == "1 / 1 / 0"  # c: 1st, a: 2nd
    assert by_system["rig:prob"]["Hop 2 found − rag [95%]"].startswith("+0.250")
    assert by_system["rig:prob"]["Wins / losses, p"].startswith("2 / 1")  # wins a, c; loses b
    # b: rig never searched, so the closest query is None; d: its one query missed hop 2
    second = {r["id"]: r for r in hop_rows(records) if r["system"] == "rig:prob"}
    assert second["b"]["query"] is None and second["d"] == {**second["d"], "found_in": None, "query": "first hop"}


def test_per_hop_counts_only_the_searches_that_ran():
    # a: searched "q a1" (p1); the guard dropped the near-duplicate "q a1 again" (a skipped round
    # that keeps its query); the next query failed; then "q a2" found p2: two searches ran
    line = _row("a", "rig:prob", 0, 2, [
        _round(True, "continue", "q a1", ["p1"]), _round(True, "skip", "q a1 again"),
        {**_round(True, "accept", "q broken"), "error": "RuntimeError: down"},
        _round(True, "continue", "q a2", ["p2"]), _round(False, "accept")])
    assert [(s.index, s.query, s.pids) for s in retrievals_of(line)] == [(1, "q a1", ("p1",)), (2, "q a2", ("p2",))]
    record = hop_record(line, GOLD["a"])
    assert record.found == [1, 2] and record.retrievals == 2  # hop 2 in the 2nd search, not the 4th round
    # a miss keeps the closest query among those searched, never the dropped one
    missed = _row("b", "rig:prob", 0, 1, [_round(True, "continue", "q b1", ["px"]),
                                          _round(True, "skip", "second hop query")])
    assert hop_record(missed, GOLD["b"]).queries == ["q b1", "q b1"]


def test_the_loop_records_a_guarded_search_as_one_the_hop_count_leaves_out():
    """The same through the real controller: a repeated query is dropped by its query guard."""
    from rigkit.build import assemble
    from rigkit.config import RunConfig
    from rigkit.testing import DictRetriever, ScriptedGenerator
    from rigkit.trace import Decision, Hit, Query

    class Fire:
        name, policy = "fire", "continue"

        def decide(self, segment, state):
            return Decision(True, 1.0, "always", decider=self.name)

    class Same:
        mode = "fixed"

        def build(self, question, draft, decision, state=None):
            return Query(text="first hop query", mode=self.mode)

    retriever = DictRetriever({"first hop": [Hit("p1#0", "p1", "First", "The bridge is Bridge.", 1.0)]})
    loop = assemble(RunConfig(), ScriptedGenerator(["One.", "Two.", "Three."]), retriever, Fire(), query_builder=Same())
    result = loop.run("question a?")
    assert retriever.queries == ["first hop query"] and any(r.guards for r in result.rounds)
    line = {**_row("a", "rig:prob", 0, result.used_retrieval_times), "summary": summarize_result(result)}
    assert sum(r["query"] is not None for r in line["summary"]["rounds"]) == 3
    assert [s.query for s in retrievals_of(line)] == ["first hop query"]
    assert hop_record(line, GOLD["a"]).retrievals == result.used_retrieval_times == 1


def test_ceilings_table_reads_every_gold_paragraph_in_context():
    rows = [{**r, "support_recall_pid": 1.0 if r["id"] == "b" else 0.5} for r in RAG + RIG]
    header, table = ceiling_table(rows, "rag")
    rag = dict(zip(header, table[0]))
    assert rag["Type-aware [95%]"].startswith("0.500")
    assert rag["Every gold paragraph in context [95%]"].startswith("0.250")
    assert rag["Type-aware when it was [95%]"].startswith("1.000")  # b: all found and right
    rig = dict(zip(header, table[1]))
    assert rig["− rag [95%]"].startswith("-0.250") and rig["Wins / losses, p"].startswith("0 / 1")


def test_loss_tables_in_the_report_and_without_gold_data(tmp_path):
    qa = tmp_path / "qa.jsonl"
    records = [{"id": q, "question": f"question {q}?", "answer": "Answer", "type": "2hop",
                "question_decomposition": [{"question": "first hop query", "answer": "Bridge", "paragraph_support_idx": 0},
                                           {"question": "second hop query", "answer": "Answer", "paragraph_support_idx": 1}],
                "paragraphs": [{"pid": "p1", "title": "First", "text": "", "is_supporting": True},
                               {"pid": "p2", "title": "Second", "text": "", "is_supporting": True}]} for q in "abcd"]
    qa.write_text("".join(json.dumps(r) + "\n" for r in records))
    titles = list(loss_tables({"qa": str(qa)}, ROWS, "rag"))
    assert [t.split(" ")[0] for t in titles] == ["Where", "Decision", "Per-hop"]
    assert list(loss_tables({}, ROWS, "rag"))[1].startswith("Decision")  # no qa file: no per-hop table
    report = markdown_report({"qa": str(qa)}, ROWS)
    assert "Fired at the missing fact" in report and "Cover EM is lenient" in report


def test_type_aware_score_reads_yes_no_and_two_option_answers():
    assert answer_kind("Are both from France?", ["yes"]) == "yes/no"
    assert typed_match("Yes, both are.", "Are both from France?", ["yes"]) == 1.0
    assert typed_match("No, but yes in part.", "Are both from France?", ["yes"]) == 0.0  # Cover EM: 1
    assert typed_match("Both are from the United Kingdom.", "Are both from France?", ["yes"]) == 0.0
    q = "Which film came out first, Heat or Alien?"
    assert answer_kind(q, ["Alien"]) == "choice"
    assert typed_match("Alien came out before Heat.", q, ["Alien"]) == 1.0
    assert typed_match("Heat or Alien.", q, ["Alien"]) == 0.0  # names both: Cover EM gives it 1
    assert typed_match("Heat, not Alien.", q, ["Alien"]) == 0.0
    # the longer option wins where both start at one place; a title's own "?" does not matter
    q2 = "Which came first, Rocky or Rocky II?"
    assert typed_match("Rocky II did.", q2, ["Rocky II"]) == 1.0 and typed_match("Rocky II did.", q2, ["Rocky"]) == 0.0
    assert answer_kind("Which came first, Heat or Why Does Herr R. Run Amok??", ["Why Does Herr R. Run Amok?"]) == "choice"
    assert typed_match("It is Paris.", "Where is it?", ["Paris"]) == 1.0  # open: Cover EM
    rows = with_type_aware([{"answer": "Yes.", "question": "Is it?", "gold": ["no"]}])
    assert rows[0]["type_aware"] == 0.0


def test_share_and_ratio_intervals():
    share = share_interval([1, 0, 1, 0])
    assert share.value == 0.5 and share.low <= 0.5 <= share.high and share.n == 4
    assert str(share_interval([1, 1, 1])) == "1.000 [1.000, 1.000]"
    ratio = ratio_interval([2, 0, 1], [2, 3, 1])
    assert ratio.value == pytest.approx(0.5) and 0 <= ratio.low <= ratio.value <= ratio.high <= 1
    assert ratio_interval([0, 0], [0, 0]) is None


def test_question_walk_lists_each_round_with_the_hops_it_found():
    from rigkit.eval.walk import answers_of, question_walk

    walk = question_walk(RAG + RIG, GOLD["a"])
    assert [(w["system"], w["round"], w["fired"], w["found"]) for w in walk] == [
        ("rag", "upfront", True, ["hop 1"]), ("rig:prob", None, True, ["hop 1"]),
        ("rig:prob", None, True, ["hop 2"]), ("rig:prob", None, False, [])]
    answers = {a["system"]: a for a in answers_of(RAG + RIG, GOLD["a"])}
    assert answers["rag"]["fired_at_fact"] is None and answers["rig:prob"]["fired_at_fact"] is True


def test_hop_two_by_question_type():
    from rigkit.eval.hops import hop_type_table

    rows = RAG + RIG + [{**RIG[0], "id": "e", "type": "compositional"}]
    gold = {**GOLD, "e": _chain("e")}
    header, body = hop_type_table(hop_records(rows, gold))
    assert header == ["Type", "Questions", "rag", "rig:prob"]
    # 2hop: rag finds hop 2 on b (1/4), rig on a and c (2/4); compositional: only rig's e (found)
    assert body == [["2hop", "4", "0.250", "0.500"], ["compositional", "1", "–", "1.000"]]
