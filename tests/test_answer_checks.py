"""Retrieval makes the answer better, never worse: the loop's answer checks with scripted parts.

A rewrite that adds nothing, or that no new passage supports while one supports the set-aside
segment, falls back to that segment; a repeated sentence is cut and ends the answer; an unfinished last sentence is trimmed;
the short answer line; the query guards; the in-loop support check; the trace round trip.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from rigkit.config import ContextConfig, ControllerConfig, GeneratorConfig, QueryConfig
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.errors import InputError
from rigkit.eval.metrics import QAItem, score_result
from rigkit.guards import phrase_loop_at
from rigkit.queries import build_query_builder
from rigkit.testing import (
    AlwaysDecider,
    DictRetriever,
    NeverDecider,
    ScriptedGenerator,
    make_segment,
)
from rigkit.trace import TRACE_VERSION, Action, Decision, Hit, RIGResult, SearchRequest, Span

NOTICE = Hit("notice#0", "notice", "The NOTICE file",
             "A NOTICE text file ships with Apache-2.0 works: every redistribution must include it.", 1.0)
LICENCE = Hit("apache#0", "apache", "The Apache License 2.0",
              "Apache-2.0 allows use for any purpose, including commercial products.", 1.0)


class FlagWord:
    """Fires on segments holding `word`, flagging it as the uncertain span (like `prob`)."""

    policy = "regenerate"

    def __init__(self, word: str):
        self.word = word

    def decide(self, segment, state):
        at = segment.text.find(self.word)
        spans = [Span(0, 1, self.word, 1.0, at, at + len(self.word))] if at >= 0 else []
        return Decision(at >= 0, float(at >= 0), "flagged" if at >= 0 else "fine", decider="word", spans=spans)


def make(generator, decider, retriever=None, query=None, embed=None, max_answer_tokens=200, **controller):
    context = ContextManager(ContextConfig(), generator.count_tokens, generator.render_chat)
    query = query or QueryConfig(mode="masked")
    return RIGController(
        generator, retriever or DictRetriever({}, default=[NOTICE, LICENCE]), decider,
        build_query_builder(query, generator), context, config=ControllerConfig(**controller),
        generation=GeneratorConfig(max_answer_tokens=max_answer_tokens), embed=embed, query_config=query,
    )


# -- a rewrite must earn its place ----------------------------------------------------------------
DEMO = [
    "Yes, you can use it commercially.",
    " It allows use for any purpose, including commercial products.",
    " You must also include a NOTICE text file.",  # flagged
    " It allows use for any purpose, including commercial products.",  # the rewrite repeats
    " That is all.",
]


def test_a_rewrite_that_repeats_accepted_text_falls_back_to_the_flagged_segment():
    result = make(ScriptedGenerator(DEMO), FlagWord("NOTICE")).run("What must I ship with Apache-2.0 code?")
    actions = [r.action for r in result.rounds]
    assert actions == ["accept", "accept", "regenerate", "fallback", "accept"]
    assert result.rounds[3].fallback == "the rewrite repeats accepted text"
    unused = result.rounds[3].unused  # the trace names the passages no kept rewrite was written from, and why
    assert list(unused) == result.rounds[2].injection.added and all("repeats accepted text" in w for w in unused.values())
    assert "NOTICE text file" in result.answer and result.answer.count("It allows use") == 1
    # the kept segment now stands after the passages: it cites the NOTICE passage
    assert "notice#0" in result.citations


def test_without_the_check_the_rewrite_is_kept_and_the_repeat_guard_ends_the_answer():
    result = make(ScriptedGenerator(DEMO), FlagWord("NOTICE"), rewrite_check=False).run("What must I ship?")
    assert [r.action for r in result.rounds] == ["accept", "accept", "regenerate", "repeat"]
    assert "NOTICE" not in result.answer and result.answer.count("It allows use") == 1
    assert result.rounds[-1].guards and result.rounds[-1].guards[0].startswith("repeat:")


# Which of the two stays is decided with the passages the flagged round brought in (NOTICE and
# LICENCE here): the old sentence comes back only when the rewrite adds nothing, or when no new
# passage supports the rewrite while one supports the old sentence.
OLD_SUPPORTED = "You must include a NOTICE text file."  # rests on notice#0
OLD_UNSUPPORTED = "The NOTICE goes to Mars."  # shares one content word with a passage: not support


@pytest.mark.parametrize(
    ("old", "rewrite", "kept", "why"),
    [
        # supported by a new passage: kept, even though it drops the flagged word
        (OLD_SUPPORTED, "Every redistribution of Apache-2.0 works must include the file.", "rewrite", ""),
        # unsupported, and the old sentence is supported: the old one comes back
        (OLD_SUPPORTED, "Bananas are yellow fruit.", "old",
         "no new passage supports the rewrite, notice#0 supports the set-aside segment: it drops the flagged 'notice'"),
        # the flagged word kept does not save an unsupported rewrite from a supported old sentence
        (OLD_SUPPORTED, "A NOTICE goes to Mars.", "old",
         "no new passage supports the rewrite, notice#0 supports the set-aside segment"),
        # neither rests on the new passages: the rewrite, written with them in view, stays
        (OLD_UNSUPPORTED, "Bananas are yellow fruit.", "rewrite", ""),
    ],
)
def test_a_rewrite_stays_unless_the_passages_back_the_old_sentence_and_not_it(old, rewrite, kept, why):
    result = make(ScriptedGenerator([old, rewrite, " Done."]), FlagWord("NOTICE")).run("What must I ship?")
    flagged, judged = result.rounds[0], result.rounds[1]
    assert flagged.action is Action.REGENERATE and judged.fallback == why
    if kept == "old":
        assert judged.action is Action.FALLBACK and result.answer.startswith(old)
        # the trace names the passages no kept text was written from, and why
        assert list(judged.unused) == flagged.injection.added
        assert all(w == f"{why}: the sentence written before it is kept" for w in judged.unused.values())
        assert rewrite not in result.answer
    else:
        assert judged.action is Action.ACCEPT and not judged.unused
        assert result.answer.startswith(rewrite) and old not in result.answer


def test_the_old_sentence_counts_as_supported_only_with_its_flagged_claim():
    # it shares "every redistribution must include ... file" with the NOTICE passage, but the
    # word in doubt, "Mars", is in no passage: nothing backs the old sentence over the rewrite
    old, rewrite = "Every redistribution must include the Mars file.", "Bananas are yellow fruit."
    result = make(ScriptedGenerator([old, rewrite, " Done."]), FlagWord("Mars")).run("What must I ship?")
    assert [r.action for r in result.rounds][:2] == ["regenerate", "accept"] and not result.rounds[1].fallback
    assert result.answer.startswith(rewrite)
    # the same sentence flagged at a word the passage holds is backed by it
    result = make(ScriptedGenerator([old, rewrite, " Done."]), FlagWord("file")).run("What must I ship?")
    assert result.rounds[1].action is Action.FALLBACK and result.answer.startswith(old)


def flagged(**controller):
    """(the controller's checks, the rounds) once the old sentence is set aside after its search."""
    c = make(ScriptedGenerator([OLD_SUPPORTED]), FlagWord("NOTICE"), **controller)
    run = c.start("What must I ship?")
    assert isinstance(run.step(), SearchRequest)  # the flagged sentence asks for a search
    run.search(c.retriever)
    assert [r.action for r in run.rounds] == [Action.REGENERATE]
    return c.checks, run.rounds


def test_a_rewrite_that_adds_nothing_falls_back_and_a_new_one_stays():
    checks, rounds = flagged()
    assert checks.rewrite_fault(rounds, make_segment("   ")) == "the rewrite is empty"
    assert checks.rewrite_fault(rounds, make_segment("A NOTICE text file ships with it.")) == ""
    assert checks.rewrite_fault(rounds, make_segment("Bananas are yellow fruit.")).startswith("no new passage")
    checks, rounds = flagged(rewrite_check=False)  # the check off: every rewrite stays
    assert checks.rewrite_fault(rounds, make_segment("Bananas are yellow fruit.")) == ""


def test_support_is_the_citation_rule_over_every_sentence():
    checks = make(ScriptedGenerator([]), NeverDecider()).checks
    assert checks.backing("A NOTICE text file must ship.", [NOTICE, LICENCE]) == ["notice#0"]
    assert checks.backing("A NOTICE text file must ship. Bananas are yellow.", [NOTICE, LICENCE]) == []
    assert checks.backing("A NOTICE text file must ship.", [LICENCE]) == []
    assert checks.backing("", [NOTICE]) == []


# -- no repeated sentences, end on a sentence -----------------------------------------------------
def test_a_near_repeat_cut_short_is_cut_and_the_answer_ends():
    segments = ["Apache-2.0 is permissive.", " It allows use for any purpose and redistribution.",
                " Apache 2.0 is permissive.", " More text."]
    result = make(ScriptedGenerator(segments), NeverDecider()).run("Is Apache-2.0 permissive?")
    assert result.rounds[-1].action is Action.REPEAT and len(result.rounds) == 3
    assert result.answer == "Apache-2.0 is permissive. It allows use for any purpose and redistribution."


def test_a_repeat_inside_a_segment_keeps_what_comes_before_it():
    segments = ["Apache-2.0 is permissive.", " It is old. Apache-2.0 is permissive."]
    result = make(ScriptedGenerator(segments), NeverDecider()).run("Is Apache-2.0 permissive?")
    assert result.answer == "Apache-2.0 is permissive. It is old."
    off = make(ScriptedGenerator(segments), NeverDecider(), repeat_guard=False).run("Is it?")
    assert off.answer.count("Apache-2.0 is permissive.") == 2


TWILIGHT = "The Twilight Saga: Breaking Dawn – Part 2: " * 7 + "The Twilight Saga"
BHANWAREY = "Bhanwarey is a film about a young man who is a part of" + " a film about a young man who is a part of" * 6


def test_a_phrase_loop_inside_one_sentence_is_found_where_it_comes_back():
    assert TWILIGHT[phrase_loop_at("", TWILIGHT):].startswith("The Twilight Saga: Breaking Dawn – Part 2: The")
    assert TWILIGHT[: phrase_loop_at("", TWILIGHT)] == "The Twilight Saga: Breaking Dawn – Part 2: "
    assert BHANWAREY[: phrase_loop_at("", BHANWAREY)] == "Bhanwarey is a film about a young man who is a part of "
    # a phrase named twice in a sentence is prose; three times in three sentences is not a loop either
    assert phrase_loop_at("", "Breaking Dawn Part 1 came before Breaking Dawn Part 2 in the saga.") is None
    three = "The Twilight Saga film came out. The Twilight Saga film did well. The Twilight Saga film ended."
    assert phrase_loop_at("", three) is None
    # a title named three times in one long sentence, at no one period, is prose too
    titles = ("A Nightmare on Elm Street 5: The Dream Child: A Nightmare on Elm Street 5: The Dream Child is a"
              " 1989 slasher film and the fourth sequel in the A Nightmare on Elm Street series.")
    assert phrase_loop_at("", titles) is None
    loop = "The maternal grandfather of" + " the maternal grandfather of" * 5
    assert loop[: phrase_loop_at("", loop)] == "The maternal grandfather of "
    left = "The House of Pulcini: The House of Pulcini: The House of Pulcini is a 1924 Italian silent film."
    assert phrase_loop_at("", left) is None  # the model left the loop by itself
    # the loop may start in the draft's unfinished sentence: the cut falls at the segment's start
    assert phrase_loop_at("It is. The Twilight Saga: Breaking Dawn – Part 2: The Twilight Saga: Breaking",
                          " Dawn – Part 2: The Twilight Saga: Breaking Dawn – Part 2: The Twilight Saga: Breaking Dawn") == 0
    assert phrase_loop_at("", "许可证许可证许可证许可证许可证。") is not None  # CJK counts characters


def test_a_phrase_loop_is_cut_where_it_comes_back_and_the_answer_ends():
    segments = [make_segment(TWILIGHT, finish_reason="length"), " More."]
    result = make(ScriptedGenerator(segments), NeverDecider()).run("Which film came out later?")
    assert result.answer == "The Twilight Saga: Breaking Dawn – Part 2:"
    assert result.rounds[-1].action is Action.REPEAT and result.rounds[-1].guards[0].startswith("phrase loop:")
    line = score_result(result, QAItem(id="q", question="Which film?", answer="Breaking Dawn"))
    assert (line["repeats_cut"], line["query_guard_hits"], line["ends_mid_sentence"], line["cut_mid_sentence"]) == (1, 0, 1, 1)
    off = make(ScriptedGenerator(segments), NeverDecider(), repeat_guard=False).run("Which film?")
    assert off.answer.count("Breaking Dawn") == 7


def test_a_phrase_the_model_ends_on_is_unfinished_but_not_cut():
    ended = make(ScriptedGenerator([make_segment("Letitia Green Stevenson (1843 – 1913)", finish_reason="end_of_turn")]),
                 NeverDecider()).run("Who was she?")
    line = score_result(ended, QAItem(id="q", question="Who was she?", answer="Letitia"))
    assert (line["ends_mid_sentence"], line["cut_mid_sentence"]) == (1, 0)
    budget = make(ScriptedGenerator([make_segment("Apache allows", finish_reason="length")]), NeverDecider()).run("Is it?")
    line = score_result(budget, QAItem(id="q", question="Is it?", answer="yes"))
    assert (line["ends_mid_sentence"], line["cut_mid_sentence"]) == (1, 1)


def test_an_answer_out_of_budget_mid_sentence_is_trimmed_and_the_trace_says_so():
    segments = ["Apache-2.0 is permissive.", make_segment(" It allows redistribution in", finish_reason="length")]
    result = make(ScriptedGenerator(segments), NeverDecider()).run("Is Apache-2.0 permissive?")
    assert result.answer == "Apache-2.0 is permissive." and result.trimmed == "It allows redistribution in"
    assert [a.text for a in result.attributions] == ["Apache-2.0 is permissive."]
    off = make(ScriptedGenerator(segments), NeverDecider(), end_on_sentence=False).run("Is it?")
    assert off.answer.endswith("redistribution in") and off.trimmed == ""


def test_an_answer_with_no_whole_sentence_is_kept_with_a_warning():
    result = make(ScriptedGenerator([make_segment("Apache allows", finish_reason="length")]),
                  NeverDecider()).run("Is it?")
    assert result.answer == "Apache allows" and result.trimmed == ""
    assert any("mid-sentence" in w for w in result.warnings)


# -- the short answer line ------------------------------------------------------------------------
def test_the_short_answer_is_extracted_or_asked_and_the_long_answer_kept():
    question = "Which film came out first, Niyoti or Angali Pangali?"
    reply = "Niyoti was released before Angali Pangali."
    extracted = make(ScriptedGenerator([reply]), NeverDecider()).run(question)
    assert extracted.short_answer == "Niyoti" and extracted.answer == reply
    asked = make(ScriptedGenerator([reply], replies=["Answer: the film Niyoti"]), NeverDecider(),
                 short_answer="ask").run(question)
    assert asked.short_answer == "the film Niyoti"
    empty = make(ScriptedGenerator([reply], replies=[""]), NeverDecider(), short_answer="ask").run(question)
    assert empty.short_answer == "Niyoti"  # an empty reply falls back to extraction
    assert make(ScriptedGenerator([reply]), NeverDecider(), short_answer="none").run(question).short_answer == ""
    with pytest.raises(InputError, match="short_answer"):
        make(ScriptedGenerator([reply]), NeverDecider(), short_answer="maybe")


def test_the_ask_prompt_is_in_the_question_language():
    gen = ScriptedGenerator(["他出生在北京。"], replies=["答案：北京"])
    result = make(gen, NeverDecider(), short_answer="ask").run("他出生在哪里？")
    assert result.short_answer == "北京" and "答案" in gen.helper_prompts[0]


# -- the loop's query guards ----------------------------------------------------------------------
def test_a_near_duplicate_query_is_not_searched_again():
    retriever = DictRetriever({}, default=[LICENCE])
    segments = ["Apache needs NOTICE files here.", "Apache needs NOTICE files here.", " Fine."]
    result = make(ScriptedGenerator(segments), FlagWord("NOTICE"), retriever=retriever,
                  policy="continue", repeat_guard=False).run("What?")
    assert len(retriever.queries) == 1 and result.used_retrieval_times == 1
    assert result.rounds[1].action is Action.SKIP and "searched before" in result.rounds[1].guards[0]


def marker_decision(*phrases):
    return Decision(True, 1.0, "marker", decider="marker",
                    evidence={"markers": [{"phrase": p} for p in phrases]})


class MarkerDecider:
    policy = "continue"

    def __init__(self, *phrases):
        self.phrases = phrases

    def decide(self, segment, state):
        return marker_decision(*self.phrases) if state.round_index == 0 else Decision(False, 0.0, "no marker")


def test_two_markers_become_two_searches_searched_together_and_the_query_is_capped():
    retriever = DictRetriever({}, default=[LICENCE])
    long = "what exactly does the licence say about shipping the notice file with binaries today please"
    result = make(ScriptedGenerator(["Looking.", " Done."]), MarkerDecider("apache licence commercial use", long),
                  retriever=retriever, query=QueryConfig(mode="marker")).run("What?")
    query = result.rounds[0].query
    assert query.subqueries == ["apache licence commercial use", long]
    assert any(g.startswith("capped:") for g in result.rounds[0].guards)
    assert len(retriever.queries[-1].split()) == 12 or any(len(c.split()) == 12 for c in retriever.queries)


def test_chinese_queries_are_capped_at_twenty_characters():
    from rigkit.guards import cap_query

    assert cap_query("阿帕奇许可证允许商业使用吗以及发布时必须包含哪些文件和声明", 12, 20) == "阿帕奇许可证允许商业使用吗以及发布时必须"
    assert cap_query("one two three", 2, 20) == "one two"


def test_an_empty_or_garbage_marker_query_is_skipped_with_a_reason():
    retriever = DictRetriever({}, default=[LICENCE])
    result = make(ScriptedGenerator(["Looking.", " Done."]), MarkerDecider("%%% ### !!!"), retriever=retriever,
                  query=QueryConfig(mode="marker", min_marker_words=1)).run("What?")
    assert retriever.queries == [] and result.rounds[0].action is Action.SKIP
    assert result.rounds[0].guards and "skipped" in result.rounds[0].guards[0]


def test_cites_nothing_is_warned_also_when_nothing_was_retrieved():
    result = make(ScriptedGenerator(["Rome is old."]), NeverDecider()).run("Is Rome old?")
    assert "the answer cites nothing: no passage was retrieved" in result.warnings
    quiet = make(ScriptedGenerator(["Rome is old."]), NeverDecider(), warn_no_retrieval=False).run("Is Rome old?")
    assert quiet.warnings == []


# -- grounding while answering --------------------------------------------------------------------
def word_embed(texts):
    """Bag-of-words unit vectors: a sentence sharing words with a passage is close to it."""
    vocab = sorted({w for t in texts for w in t.lower().split()})
    rows = np.array([[t.lower().split().count(w) for w in vocab] for t in texts], dtype=float)
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-9)


def test_each_kept_sentence_is_checked_against_its_passages_during_the_loop():
    segments = ["Apache-2.0 needs a NOTICE file.", " a notice text file ships with apache-2.0 works:",
                " Bananas grow on trees."]
    result = make(ScriptedGenerator(segments), AlwaysDecider(), policy="continue", check_support=True,
                  embed=word_embed, max_rounds=1).run("What?")
    assert result.rounds[0].unsupported == []  # written before any passage: nothing to check against
    assert result.rounds[1].unsupported == []
    assert result.rounds[2].unsupported == ["Bananas grow on trees."]


# -- the trace -------------------------------------------------------------------------------------
def test_the_new_fields_survive_the_json_round_trip_and_old_traces_load():
    result = make(ScriptedGenerator(DEMO), FlagWord("NOTICE")).run("What must I ship with Apache-2.0 code?")
    again = RIGResult.from_json(result.to_json())
    assert again == result and again.version == TRACE_VERSION
    assert again.rounds[3].action is Action.FALLBACK and again.pre_retrieval_draft
    old = result.to_dict()
    for key in ("short_answer", "trimmed", "pre_retrieval_draft"):
        old.pop(key)
    for r in old["rounds"]:
        for key in ("fallback", "guards", "unsupported"):
            r.pop(key)
    old["version"] = 2
    loaded = RIGResult.from_dict(old)
    assert loaded.short_answer == "" and loaded.rounds[0].guards == []


# -- the guard holds for a served model too: the chat backend against a scripted chat server --------
from tests.test_chat_faults import _ask, _words, server  # noqa: E402,F401 - the scripted server fixture


def test_a_chat_backend_that_writes_the_same_sentence_again_is_cut(cli, server):  # noqa: F811
    # every segment request answers the same sentence, cut at the token limit: the loop asks again
    server.settings = {"stream": _words("It is one. It", finish="length")}
    done = _ask(cli, server, "--json", decider="never")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["answer"] == "It is one." and result["rounds"][-1]["action"] == "repeat"
    assert result["model"]["source"].startswith(f"chat {server.url}/v1")


def test_stream_yields_the_rounds_that_searched_too():
    gen = ScriptedGenerator(["Apache needs a NOTICE text file.", "You ship the NOTICE file.", " Done."])
    controller = make(gen, FlagWord("NOTICE"))
    streamed = [r.index for r in controller.stream("What must I ship?")]
    assert streamed == [r.index for r in controller.last_result.rounds]
