"""The oracle's controls: layout (`rig:oracle@prefix`), loop rule (`rig:oracle~norestore`) and
distractors (`rag:gold+distractors`), on hand-built records and scripted parts."""

from __future__ import annotations

import pytest

from rigkit.config import RunConfig
from rigkit.errors import InputError
from rigkit.eval.gold import gold_chain
from rigkit.eval.oracle import by_question, gold_with_distractors
from rigkit.eval.systems import build_systems, parse_system, parse_systems, system_config
from rigkit.testing import DictRetriever, ScriptedGenerator
from rigkit.trace import Hit
from tests.test_eval_oracle import MUSIQUE


def _hit(pid: str) -> Hit:
    return Hit(chunk_id=f"{pid}#0", doc_id=pid, title=pid, text=f"{pid} text", score=1.0)


def test_control_names_parse_to_the_oracle_with_one_thing_changed():
    prefix = parse_system("rig:oracle@prefix")
    assert (prefix.kind, prefix.layout, prefix.restore) == ("oracle", "prefix", True)
    norestore = parse_system("rig:oracle~norestore")
    assert (norestore.kind, norestore.restore) == ("oracle", False)
    assert system_config(norestore, RunConfig()).controller.restore is False
    assert system_config(parse_system("rig:oracle"), RunConfig()).controller.restore is True
    assert parse_system("rag:gold+distractors").kind == "gold_distractors"
    with pytest.raises(InputError, match="prob~norestore"):  # only the oracle has the control
        parse_system("rig:prob~norestore")


def test_gold_with_distractors_keeps_the_oracle_searches_hits_with_each_gold_paragraph_first():
    chain = gold_chain(MUSIQUE)
    retriever = DictRetriever({
        # hop 1's search misses its paragraph: the gold one leads that hop's block
        "Van Hook": [_hit("d1"), _hit("d2")],
        # hop 2's search finds it second: it moves to the front of its block, d1 is not repeated
        "Mountrail County capital": [_hit("d1"), _hit("m-court"), _hit("d3")],
    })
    hits = gold_with_distractors(chain, retriever, top_k=3)
    assert [h.doc_id for h in hits] == ["m-town", "d1", "d2", "m-court", "d3"]
    assert retriever.queries == [h.query for h in chain.hops]
    # a hop whose paragraph an earlier search brought is not searched again, as the oracle does
    retriever = DictRetriever({"Van Hook": [_hit("m-court"), _hit("d1")]})
    assert [h.doc_id for h in gold_with_distractors(chain, retriever, top_k=3)] == ["m-town", "m-court", "d1"]
    assert len(retriever.queries) == 1


def test_rag_gold_distractors_answers_once_with_the_gold_among_the_distractors():
    gold = by_question({"x": gold_chain(MUSIQUE)})
    retriever = DictRetriever({"Van Hook": [_hit("d1")], "Mountrail County capital": [_hit("d2")]})
    (system,) = build_systems(parse_systems("rag:gold+distractors"), RunConfig(), ScriptedGenerator(["Stanley."]),
                              retriever, gold=gold)
    result = system.answer(MUSIQUE["question"], 0)
    assert [h.doc_id for h in result.passages] == ["m-town", "d1", "m-court", "d2"]
    assert result.used_retrieval_times == 1 and result.answer.startswith("Stanley")


def test_norestore_ends_the_answer_where_the_oracle_would_restore_the_sentence_before_the_passages():
    gold = by_question({"x": gold_chain(MUSIQUE)})
    town = Hit(chunk_id="m-town#0", doc_id="m-town", title="Van Hook Township",
               text="Van Hook is in Mountrail County.", score=1.0)
    court = Hit(chunk_id="m-court#0", doc_id="m-court", title="Mountrail County Courthouse",
                text="The courthouse in Stanley.", score=1.0)
    retriever = DictRetriever({"Van Hook": [town], "Mountrail County capital": [court]})
    # hop 1 fires on the first sentence, hop 2 on its rewrite; the rewrite after hop 2 is empty
    script = ["It is in Ohio.", "It is in Mountrail County.", ""]

    def answer(name: str):
        (system,) = build_systems(parse_systems(name), RunConfig(), ScriptedGenerator(script), retriever, gold=gold)
        return system.answer(MUSIQUE["question"], 0)

    restored = answer("rig:oracle")
    assert "restore" in [r.action for r in restored.rounds] and "Mountrail County" in restored.answer
    ended = answer("rig:oracle~norestore")
    assert "restore" not in [r.action for r in ended.rounds]
    assert "Mountrail County" not in ended.answer  # the set-aside sentence is dropped
