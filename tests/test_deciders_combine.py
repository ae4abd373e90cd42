"""Composite deciders, the entity checklist, the registry and side-by-side comparison."""

from __future__ import annotations

import json

import pytest

from rigkit.build import build_decider
from rigkit.config import DeciderConfig, RunConfig
from rigkit.deciders import (
    DECIDERS,
    CompositeDecider,
    EntityChecklist,
    EntropyDecider,
    KeywordDecider,
    ProbabilityDecider,
    compare_deciders,
)
from rigkit.deciders.base import DecisionState
from rigkit.errors import InputError
from rigkit.testing import AlwaysDecider, NeverDecider, make_segment
from rigkit.trace import Decision, Hit, Injection, Query, RIGResult, RoundTrace

INVENTED = make_segment(
    "It was directed by Zoltan Brkic in 1931.", [0.9, 0.8, 0.7, 0.6, 0.08, 0.05, 0.5, 0.04]
)
STATE = DecisionState(question="Who directed Nightfall?")


class Counting:
    """A member that records how often it was asked."""

    def __init__(self, inner, name):
        self.inner, self.name, self.calls = inner, name, 0

    def decide(self, segment, state):
        self.calls += 1
        d = self.inner.decide(segment, state)
        d.decider = self.name
        return d


def test_any_all_and_lazy_gating():
    cheap, costly = Counting(NeverDecider(), "cheap"), Counting(AlwaysDecider(), "costly")
    gated = CompositeDecider([cheap, costly], combine="all")
    d = gated.decide(INVENTED, STATE)
    assert not d.retrieve and costly.calls == 0 and d.evidence["skipped"] == ["costly"]
    eager = CompositeDecider([cheap, costly], combine="all", lazy=False)
    d = eager.decide(INVENTED, STATE)
    assert not d.retrieve and costly.calls == 1 and d.score == 0.0
    anyof = CompositeDecider([ProbabilityDecider(), KeywordDecider()], combine="any", lazy=False)
    d = anyof.decide(INVENTED, STATE)
    assert d.retrieve and d.score == max(m["score"] for m in d.evidence["members"])
    assert "Zoltan Brkic" in d.intents and d.spans


def test_weighted_vote():
    members = [AlwaysDecider(), NeverDecider(), NeverDecider()]
    assert not CompositeDecider(members, combine="vote").decide(INVENTED, STATE).retrieve
    heavy = CompositeDecider(members, combine="vote", weights=[3, 1, 1])
    d = heavy.decide(INVENTED, STATE)
    assert d.retrieve and d.score == pytest.approx(0.6)
    with pytest.raises(ValueError):
        CompositeDecider(members, combine="vote", weights=[1])
    with pytest.raises(ValueError):
        CompositeDecider(members, combine="most")


def test_entity_checklist_keeps_retrieving_until_covered():
    question = "Was Nightfall directed by Jean Dupont or by Kurt Weiler?"
    checklist = EntityChecklist(NeverDecider())
    assert checklist.entities(question) == ["Nightfall", "Jean Dupont", "Kurt Weiler"]
    seg = make_segment("Nightfall was directed by Jean Dupont.")
    d = checklist.decide(seg, DecisionState(question))
    assert d.retrieve and d.intents == ["Nightfall", "Jean Dupont", "Kurt Weiler"]
    hits = [
        Hit("1", "a", "Nightfall (film)", "Nightfall is a film by Jean Dupont.", 1.0),
        Hit("2", "b", "Kurt Weiler", "Weiler was a painter.", 1.0),
    ]
    half = checklist.decide(seg, DecisionState(question, passages=hits[:1]))
    assert half.retrieve and half.intents == ["Kurt Weiler"] and half.score == pytest.approx(1 / 3)
    done = checklist.decide(seg, DecisionState(question, passages=hits))
    assert not done.retrieve and done.evidence["missing"] == []


def test_skip_if_no_entity():
    question = "Who directed Nightfall?"
    gate = EntityChecklist(AlwaysDecider(), checklist=False, skip_if_no_entity=True)
    skipped = gate.decide(make_segment("Let me think about it."), DecisionState(question))
    assert not skipped.retrieve and skipped.evidence["skipped"]
    assert gate.decide(make_segment("Nightfall is old."), DecisionState(question)).retrieve
    assert gate.decide(make_segment("It dates from 1931."), DecisionState(question)).retrieve


def test_entity_checklist_chinese():
    checklist = EntityChecklist()
    question = "李白和杜甫谁先出生？"
    assert checklist.entities(question) == ["李白", "杜甫"]
    hits = [Hit("1", "a", "李白", "李白生于701年。", 1.0)]
    d = checklist.decide(make_segment("李白先出生。"), DecisionState(question, passages=hits))
    assert d.retrieve and d.intents == ["杜甫"]


def test_registry_and_build_decider():
    assert {"marker", "prob", "entropy", "keyword", "classifier", "composite", "always",
            "every_n", "never"} <= set(DECIDERS)
    prob = build_decider(DeciderConfig(name="prob"))
    assert isinstance(prob, ProbabilityDecider) and prob.threshold == 0.3
    assert build_decider(DeciderConfig(name="prob", threshold=0.1)).threshold == 0.1
    ent = build_decider(DeciderConfig(name="entropy", params={"use_attention": False}))
    assert isinstance(ent, EntropyDecider) and not ent.use_attention
    assert build_decider(DeciderConfig(name="every_n", params={"n": 7})).n == 7
    with pytest.raises(InputError, match="prob, entropy"):
        build_decider(DeciderConfig(name="nope"))
    with pytest.raises(InputError, match="does not take"):
        build_decider(DeciderConfig(name="prob", params={"bogus": 1}))
    with pytest.raises(InputError, match="members"):
        build_decider(DeciderConfig(name="composite"))


def test_build_composite_and_checklist_from_yaml():
    config = RunConfig.from_yaml(
        """
decider:
  name: composite
  combine: all
  members:
    - {name: keyword}
    - {name: entropy, threshold: 1.0}
  entity_checklist: true
"""
    ).decider
    decider = build_decider(config)
    assert isinstance(decider, EntityChecklist) and isinstance(decider.inner, CompositeDecider)
    members = decider.inner.members
    assert isinstance(members[1], EntropyDecider) and members[1].threshold == 1.0
    d = decider.decide(INVENTED, DecisionState("Who directed Nightfall?"))
    assert d.retrieve and d.decider == "composite+checklist"


def test_compare_deciders_on_segments_and_results():
    segments = [INVENTED, make_segment("I'm not sure about the year.")]
    deciders = {"prob": ProbabilityDecider(), "keyword": KeywordDecider()}
    rows = compare_deciders(segments, deciders, question="Who directed Nightfall?")
    assert len(rows) == 2 and rows[0]["text"] == INVENTED.text
    assert rows[0]["prob.retrieve"] and rows[1]["keyword.retrieve"]
    assert rows[0]["prob.score"] == rows[0]["decisions"]["prob"].score
    json.dumps([{k: v for k, v in r.items() if k != "decisions"} for r in rows])
    # from a saved result: the second round sees the passage injected in the first
    hit = Hit("c1", "d1", "Nightfall", "Nightfall (1931) was directed by Zoltan Brkic.", 1.0)
    result = RIGResult(
        question="Who directed Nightfall?",
        answer="...",
        rounds=[
            RoundTrace(0, INVENTED, Decision(True, 1, "x"), query=Query("q", "masked"), hits=[hit],
                       injection=Injection(added=["c1"]), draft=""),
            RoundTrace(1, INVENTED, Decision(False, 0, "x"), draft=INVENTED.text),
        ],
    )
    rows = compare_deciders(RIGResult.from_json(result.to_json()), {"keyword": KeywordDecider()})
    assert rows[0]["keyword.retrieve"] and not rows[1]["keyword.retrieve"]
    with pytest.raises(TypeError):
        compare_deciders(["text"], deciders)
