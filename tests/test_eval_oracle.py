"""Gold chains and the oracle systems (rig:oracle, rag:gold), on hand-built records and scripted parts."""

from __future__ import annotations

import json

import pytest

from rigkit.config import RunConfig
from rigkit.deciders.base import DecisionState
from rigkit.errors import InputError
from rigkit.eval.experiment import evaluate
from rigkit.eval.gold import gold_chain, load_gold, pid_of
from rigkit.eval.oracle import OracleDecider, OracleQuery, by_question, gold_hits
from rigkit.eval.runner import read_results
from rigkit.eval.systems import answer_with_gold, build_systems, parse_system, parse_systems
from rigkit.testing import DictRetriever, ScriptedGenerator, make_segment
from rigkit.trace import Hit

MUSIQUE = {
    "id": "2hop__1_2", "question": "What is the seat of the county where Van Hook Township is located?",
    "answer": "Stanley", "type": "2hop", "dataset": "musique",
    "question_decomposition": [
        {"id": 1, "question": "Van Hook Township >> located in the administrative territorial entity",
         "answer": "Mountrail County", "paragraph_support_idx": 2},
        {"id": 2, "question": "#1 >> capital", "answer": "Stanley", "paragraph_support_idx": 0},
    ],
    "paragraphs": [
        {"pid": "m-court", "title": "Mountrail County Courthouse", "text": "The courthouse in Stanley.",
         "is_supporting": True},
        {"pid": "m-other", "title": "Port Blair", "text": "Port Blair is a city.", "is_supporting": False},
        {"pid": "m-town", "title": "Van Hook Township", "text": "Van Hook is in Mountrail County.",
         "is_supporting": True},
    ],
}
WIKI = {
    "id": "w1", "question": "What is the place of birth of the director of film The Zone (2017 Film)?",
    "answer": "Montreal", "type": "compositional", "dataset": "2wikimultihopqa",
    "supporting_facts": [["The Zone (2017 film)", 0], ["Denys Desjardins", 0]],
    "evidences": [["The Zone", "director", "Denys Desjardins"],
                  ["Denys Desjardins", "place of birth", "Montreal"]],
    "paragraphs": [
        {"pid": "w-dd", "title": "Denys Desjardins", "text": "Denys Desjardins was born in Montreal.",
         "is_supporting": True},
        {"pid": "w-zone", "title": "The Zone (2017 film)", "text": "The Zone is directed by Denys Desjardins.",
         "is_supporting": True},
    ],
}


def _hit(pid: str, title: str = "", text: str = "") -> Hit:
    return Hit(chunk_id=f"{pid}#0", doc_id=pid, title=title or pid, text=text or pid, score=1.0)


def test_musique_chain_follows_the_decomposition_and_fills_in_earlier_answers():
    chain = gold_chain(MUSIQUE)
    assert [h.pid for h in chain.hops] == ["m-town", "m-court"]
    assert [h.query for h in chain.hops] == [
        "Van Hook Township located in the administrative territorial entity", "Mountrail County capital"]
    assert chain.facts == ["Mountrail County", "Stanley"]
    assert [p["pid"] for p in chain.paragraphs] == ["m-town", "m-court"]  # hop order, not file order


def test_wiki_chain_follows_the_supporting_facts_and_matches_evidence_subjects_by_prefix():
    chain = gold_chain(WIKI)
    assert [h.pid for h in chain.hops] == ["w-zone", "w-dd"]
    # "The Zone" is the evidence subject of the title "The Zone (2017 film)"
    assert [h.query for h in chain.hops] == ["The Zone (2017 film) director", "Denys Desjardins place of birth"]
    assert chain.facts == ["Denys Desjardins", "Montreal"]
    assert pid_of("w-dd#3") == "w-dd"


def test_oracle_decider_asks_each_missing_hop_once_then_stops():
    decider = OracleDecider(by_question({"x": gold_chain(MUSIQUE)}))
    question = MUSIQUE["question"]
    seg = make_segment("Van Hook is in Ohio.")
    first = decider.decide(seg, DecisionState(question=question, round_index=0))
    assert first.retrieve and first.evidence["query"].startswith("Van Hook Township")
    # hop 1's search missed its paragraph: the oracle goes on to hop 2, never asks hop 1 again
    second = decider.decide(seg, DecisionState(question=question, round_index=1, passages=[_hit("m-other")]))
    assert second.retrieve and second.evidence["hop"] == 2
    third = decider.decide(seg, DecisionState(question=question, round_index=2))
    assert not third.retrieve
    # a new question starts over; a hop already in context is not asked for
    fresh = decider.decide(seg, DecisionState(question=question, round_index=0, passages=[_hit("m-town")]))
    assert fresh.evidence["hop"] == 2
    assert OracleQuery().build(question, "", fresh).text == "Mountrail County capital"


def test_oracle_refuses_a_question_without_gold_and_systems_without_gold_data():
    decider = OracleDecider({})
    with pytest.raises(InputError, match="no gold chain"):
        decider.decide(make_segment("x"), DecisionState(question="unknown?"))
    with pytest.raises(InputError, match="no gold chain"):  # rag:gold, straight from systems
        answer_with_gold(ScriptedGenerator([]), "unknown?", by_question({"x": gold_chain(WIKI)}))
    for name in ("rig:oracle", "rag:gold"):
        with pytest.raises(InputError, match="reads the gold data"):
            build_systems([parse_system(name)], RunConfig(), ScriptedGenerator([]), DictRetriever({}))
    assert parse_system("rig:oracle").kind == "oracle" and parse_system("rag:gold").kind == "gold"
    with pytest.raises(InputError, match="unknown system"):
        parse_system("rag:gold:3")


def test_rig_oracle_searches_the_gold_sub_questions_and_rag_gold_reads_only_gold_paragraphs():
    gold = by_question({"x": gold_chain(MUSIQUE)})
    retriever = DictRetriever({"Van Hook": [_hit("m-town", "Van Hook Township")],
                               "Mountrail County capital": [_hit("m-court", "Mountrail County Courthouse")]})
    # three segments: each of the first two is written again after its hop's passage arrives
    generator = ScriptedGenerator(["It is in Ohio.", "It is Mountrail County.", "The seat is Stanley."])
    oracle, rag_gold = build_systems(parse_systems("rig:oracle,rag:gold"), RunConfig(), generator, retriever,
                                     gold=gold)
    result = oracle.answer(MUSIQUE["question"], 0)
    assert retriever.queries == ["Van Hook Township located in the administrative territorial entity",
                                 "Mountrail County capital"]
    assert [r.query.mode for r in result.rounds if r.query] == ["oracle", "oracle"]
    assert result.answer.startswith("The seat is Stanley")
    answered = rag_gold.answer(MUSIQUE["question"], 0)
    assert [h.chunk_id for h in answered.passages] == ["m-town#0", "m-court#0"]
    assert answered.used_retrieval_times == 1 and len(retriever.queries) == 2  # nothing searched
    assert [h.doc_id for h in gold_hits(gold_chain(WIKI))] == ["w-zone", "w-dd"]


def test_evaluate_passes_the_gold_chains_of_its_qa_file(tmp_path):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps(MUSIQUE) + "\n" + json.dumps(WIKI) + "\n")
    assert set(load_gold(qa)) == {"2hop__1_2", "w1"}
    generator = ScriptedGenerator(["The seat is Stanley.", "Montreal."] * 2)
    evaluate(qa, tmp_path / "run", "rag:gold", generator=generator, retriever=DictRetriever({}),
             faithfulness=False, progress=False, report=False)
    rows = read_results(tmp_path / "run")
    assert [r["support_recall_pid"] for r in rows] == [1.0, 1.0]
    assert rows[0]["summary"]["upfront"] == ["m-town#0", "m-court#0"]
    with pytest.raises(InputError, match="not on Ray"):
        evaluate(qa, tmp_path / "ray", "rig:oracle", ray="local", progress=False)
