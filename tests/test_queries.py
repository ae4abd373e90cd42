"""Query builders: each mode on hand-written decisions, and rewrite post-processing."""

from __future__ import annotations

import pytest

from rigkit.config import QueryConfig
from rigkit.deciders import EntropyDecider, MarkerDecider, ProbabilityDecider
from rigkit.deciders.base import DecisionState
from rigkit.errors import InputError
from rigkit.queries import (
    QUERY_BUILDERS,
    AttentionQuery,
    KeywordsQuery,
    MarkerQuery,
    MaskedQuery,
    RewriteQuery,
    build_query_builder,
    clean_rewrite,
    truncate_query,
)
from rigkit.testing import ScriptedGenerator, make_segment
from rigkit.trace import Decision, Span

QUESTION = "Who directed the film Nightfall?"
INVENTED = make_segment(
    "It was directed by Zoltan Brkic in 1931.", [0.9, 0.8, 0.7, 0.6, 0.08, 0.05, 0.5, 0.04]
)


def decided(decider, segment, question=QUESTION) -> Decision:
    d = decider.decide(segment, DecisionState(question))
    d.segment_text = segment.text  # the controller's job
    return d


def test_masked_drops_low_confidence_words():
    d = decided(ProbabilityDecider(), INVENTED)
    q = MaskedQuery(include_question=False).build(QUESTION, "", d)
    assert q.text == "It was directed by in." and q.mode == "masked" and q.llm_calls == 0
    withq = MaskedQuery().build(QUESTION, "", d)
    assert withq.text.startswith("Nightfall") and "Zoltan" not in withq.text
    assert "1931" not in withq.text and withq.text.endswith("It was directed by in.")


def test_masked_everything_removed_uses_question():
    seg = make_segment("Zoltan Brkic.", [0.01, 0.01])
    q = MaskedQuery().build(QUESTION, "", decided(ProbabilityDecider(), seg))
    assert q.text == QUESTION and q.fallback_from == "masked"


def test_masked_without_char_offsets_and_with_markers():
    d = Decision(True, 1, "r", spans=[Span(4, 6, "Zoltan Brkic")],
                 segment_text="By Zoltan Brkic <retrieve>director</retrieve> in Nightfall.")
    q = MaskedQuery(include_question=False).build(QUESTION, "", d)
    assert q.text == "By in Nightfall."


def test_marker_phrase_and_fallbacks():
    seg = make_segment("It was <retrieve>Nightfall film director</retrieve>")
    q = MarkerQuery().build(QUESTION, "", decided(MarkerDecider(), seg))
    assert q.text == "Nightfall film director" and q.mode == "marker" and q.fallback_from is None
    short = make_segment("It was <retrieve>director</retrieve>")
    gen = ScriptedGenerator([], replies=["Sure! Here is a query: Nightfall 1931 film director"])
    builder = build_query_builder(QueryConfig(mode="marker", min_marker_words=2), gen)
    q = builder.build(QUESTION, "It was", decided(MarkerDecider(), short))
    assert q.text == "Nightfall 1931 film director" and q.mode == "rewrite"
    assert q.fallback_from == "marker" and q.llm_calls == 1
    assert "director" in gen.helper_prompts[0] and QUESTION in gen.helper_prompts[0]
    # no generator: the short phrase falls back to the masked sentence
    short = make_segment("Nightfall was made by <retrieve>director</retrieve>")
    q = build_query_builder(QueryConfig(mode="marker", include_question=False)).build(
        QUESTION, "", decided(MarkerDecider(), short)
    )
    assert q.mode == "masked" and q.fallback_from == "marker" and q.text == "Nightfall was made by"


def test_rewrite_counts_the_call_and_cleans_the_reply():
    gen = ScriptedGenerator([], replies=['Sure! Here is a search query:\n\n"Nightfall 1931 director"\n\nThis query will find it.'])
    q = RewriteQuery(gen).build(QUESTION, "It was directed by", decided(ProbabilityDecider(), INVENTED))
    assert q.text == "Nightfall 1931 director" and q.llm_calls == 1 and q.mode == "rewrite"
    assert q.intent == "Zoltan Brkic; 1931"
    assert "Zoltan Brkic; 1931" in gen.helper_prompts[0]
    empty = ScriptedGenerator([], replies=["Sure!"])
    q = RewriteQuery(empty).build(QUESTION, "", decided(ProbabilityDecider(), INVENTED))
    assert q.text == QUESTION and q.fallback_from == "rewrite" and q.llm_calls == 1
    zh = ScriptedGenerator([], replies=["好的，搜索查询：「夜幕 导演」"])
    q = RewriteQuery(zh).build("《夜幕》的导演是谁？", "", Decision(True, 1, "r"))
    assert q.text == "夜幕 导演" and "问题" in zh.helper_prompts[0]


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("Sure! Here is a query: capital of France", "capital of France"),
        ('Sure! Here is a search query:\n\n"population of Paris 2020"\n\nThis finds it.',
         "population of Paris 2020"),
        ('Query: "KL320 release date"', "KL320 release date"),
        ("1. KL320 release date (this finds the date)", "KL320 release date"),
        ("**Search query:** Apache 2.0 licence NOTICE file.", "Apache 2.0 licence NOTICE file"),
        ("Here is a search query for you.\nwho directed Nightfall", "who directed Nightfall"),
        ("KL320 release date. This query will find it.", "KL320 release date"),
        ("U.S. president born 1961", "U.S. president born 1961"),
        ("Sure thing!\n- 'Einstein birthplace'", "Einstein birthplace"),
        ("<think>hmm</think>Einstein birthplace - this will find it", "Einstein birthplace"),
        ("“Nightfall” director <retrieve>x</retrieve>", "Nightfall director"),
        ("好的，搜索查询：KL320 发布日期", "KL320 发布日期"),
        ("搜索：李白出生年份。这个查询可以找到答案。", "李白出生年份"),
        ("", ""),
        ("Sure!", ""),
    ],
)
def test_clean_rewrite_on_messy_outputs(reply, expected):
    assert clean_rewrite(reply) == expected


def test_length_limits_words_and_cjk_characters():
    words = " ".join(f"w{i}" for i in range(50))
    assert clean_rewrite(words).split() == [f"w{i}" for i in range(30)]
    assert clean_rewrite("北京" * 30) == "北京" * 15
    assert truncate_query("KL320 发布 日期 today", 3) == "KL320 发布"
    assert clean_rewrite(words, max_words=5) == "w0 w1 w2 w3 w4"


def test_keywords_mode():
    d = decided(ProbabilityDecider(), INVENTED)
    q = KeywordsQuery().build(QUESTION, "", d)
    assert q.text.split()[:3] == ["Zoltan", "Brkic", "1931"] and "Nightfall" in q.text
    assert q.text.count("1931") == 1 and "directed" in q.text  # the question's key terms
    assert KeywordsQuery(include_question=False).build(QUESTION, "", d).text == "Zoltan Brkic 1931"
    code = make_segment("The KL320 pump appeared in 2019.", [0.9, 0.1, 0.9, 0.9, 0.9, 0.1])
    q = KeywordsQuery(include_question=False).build("q", "", decided(ProbabilityDecider(), code))
    assert q.text == "KL320 2019"


def test_attention_mode_uses_qfs_words_else_masked():
    d = Decision(True, 1, "r", evidence={"attended_words": ["directed", "Nightfall"]},
                 segment_text=INVENTED.text)
    q = AttentionQuery(include_question=False).build(QUESTION, "", d)
    assert q.text == "directed Nightfall" and q.mode == "attention"
    d = decided(EntropyDecider(), INVENTED)  # no attention available: no QFS words
    q = AttentionQuery().build(QUESTION, "", d)
    assert q.mode == "masked" and q.fallback_from == "attention" and "Brkic" not in q.text


def test_registry_and_errors():
    assert set(QUERY_BUILDERS) == {"auto", "marker", "masked", "rewrite", "keywords", "attention", "multi"}
    for mode in ("marker", "masked", "keywords", "attention"):
        assert build_query_builder(QueryConfig(mode=mode)).mode == mode
    with pytest.raises(InputError, match="needs a generator"):
        build_query_builder(QueryConfig(mode="rewrite"))
    with pytest.raises(InputError, match="masked, rewrite"):
        build_query_builder(QueryConfig(mode="hyde"))
    gen = ScriptedGenerator([], replies=["x y z " * 20])
    rewrite = build_query_builder(QueryConfig(mode="rewrite", max_words=4), gen)
    assert rewrite.build(QUESTION, "", Decision(True, 1, "r")).text == "x y z x"


def test_the_default_query_mode_searches_a_markers_phrase_and_otherwise_the_masked_sentence():
    from rigkit.config import RunConfig

    assert QueryConfig().mode == "auto" and RunConfig.from_dict({}).query.mode == "auto"
    builder = build_query_builder(QueryConfig(include_question=False))
    seg = make_segment("It was <retrieve>Nightfall film director</retrieve>")
    q = builder.build(QUESTION, "", decided(MarkerDecider(), seg))
    assert q.text == "Nightfall film director" and q.mode == "marker"
    plain = make_segment("Nightfall was directed by Zoltan Brkic.", [0.9, 0.9, 0.9, 0.9, 0.1, 0.1])
    q = builder.build(QUESTION, "", decided(ProbabilityDecider(0.3), plain))
    assert q.mode == "masked" and "Nightfall" in q.text and "Brkic" not in q.text
