"""Conversation history reaches the query builders: a follow-up's pronouns are named in its searches."""

from __future__ import annotations

import pytest

from rigkit.config import ContextConfig, ControllerConfig, GeneratorConfig, QueryConfig
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.queries import build_query_builder, standalone_question
from rigkit.testing import DictRetriever, ScriptedGenerator
from rigkit.text import split_words
from rigkit.trace import Decision, Hit

NOTICE = Hit("apache#1", "apache", "Apache-2.0", "Apache-2.0 requires the NOTICE file to ship with the work.", 1.0)
EN = ([("What does Apache-2.0 require?", "It requires a copy of the licence.")], "and what about its NOTICE file?",
      "its NOTICE file")
ZH = ([("Apache-2.0要求什么？", "它要求附上许可证副本。")], "那它的NOTICE文件呢？", "它的NOTICE文件")


class AsksWithMarker:
    """Fires on the first segment, as the marker decider does, with the phrase the model wrote."""

    policy = "continue"

    def __init__(self, phrase):
        self.phrase, self.fired = phrase, False

    def decide(self, segment, state):
        fire, self.fired = not self.fired, True
        return Decision(fire, float(fire), "marker", decider="marker",
                        evidence={"markers": [{"phrase": self.phrase}]} if fire else {})


def follow_up(history, question, phrase, mode):
    gen = ScriptedGenerator(["It must ship.", " Done."])
    retriever = DictRetriever({}, default=[NOTICE])
    context = ContextManager(ContextConfig(), gen.count_tokens, gen.render_chat)
    controller = RIGController(gen, retriever, AsksWithMarker(phrase), build_query_builder(QueryConfig(mode=mode), gen),
                               context, config=ControllerConfig(max_rounds=1),
                               generation=GeneratorConfig(max_answer_tokens=50))
    result = controller.run(question, history=history)
    return result, retriever.queries


@pytest.mark.parametrize("history, question, phrase", [EN, ZH], ids=["english", "chinese"])
@pytest.mark.parametrize("mode", ["marker", "keywords", "masked"])
def test_a_follow_up_searches_for_what_its_pronoun_points_to(history, question, phrase, mode):
    result, searched = follow_up(history, question, phrase, mode)
    assert searched, "the follow-up searched"
    for query in searched:
        words = {w.text.lower() for w in split_words(query)}
        if mode != "masked":  # masked searches the model's own sentence, whose "It" is the file
            assert not words & {"its", "it", "它"}, query
        assert "Apache-2.0" in query, query
    assert result.rounds[0].query.text == searched[0]


def test_without_history_the_query_is_kept_as_built():
    _, searched = follow_up([], "and what about its NOTICE file?", "its NOTICE file", "marker")
    assert searched == ["its NOTICE file"]


@pytest.mark.parametrize("question, history, expected", [
    ("and what about its NOTICE file?", EN[0], "and what about Apache-2.0's NOTICE file?"),
    ("那它的NOTICE文件呢？", ZH[0], "那Apache-2.0的NOTICE文件呢？"),
    ("它的许可证是什么？", [("谁维护Kettle？", "")], "Kettle的许可证是什么？"),
    ("Does it allow patents?", [("Who maintains Kettle?", "Ada Moss.")], "Does Kettle allow patents?"),
    ("Is it free?", [], "Is it free?"),  # nothing to point to
    ("Does Apache-2.0 allow it?", EN[0], "Does Apache-2.0 allow it?"),  # names its subject already
    ("What is the capital of France?", EN[0], "What is the capital of France?"),  # no pointing word
])
def test_standalone_question(question, history, expected):
    assert standalone_question(question, history) == expected
