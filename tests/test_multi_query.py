"""Several queries per need: the multi-query builder, `##` markers, the RRF merge, the trace."""

from __future__ import annotations

import json

import pytest

from rigkit.config import (
    ConfigError,
    ContextConfig,
    ControllerConfig,
    GeneratorConfig,
    QueryConfig,
    load_config,
)
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.errors import InputError
from rigkit.markers import split_subqueries
from rigkit.queries import MarkerQuery, MultiQuery, build_query_builder, parse_subqueries
from rigkit.retrieval.hybrid import fuse_hit_lists, search_queries
from rigkit.testing import AlwaysDecider, DictRetriever, ScriptedGenerator
from rigkit.trace import Decision, Hit, Query, RIGResult
from rigkit.widgets.render import hits_html, query_html

QUESTION = "Who was born first, the director of Nightfall or the director of Kenji?"


def hit(cid: str, score: float = 1.0, title: str | None = None) -> Hit:
    return Hit(chunk_id=cid, doc_id=cid, title=title or cid, text=f"text of {cid}", score=score)


def need(text: str = "Nightfall was directed by someone.") -> Decision:
    return Decision(True, 1.0, "unsure", segment_text=text)


# -- parsing the model's reply ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Nightfall director\nKenji director birth date", ["Nightfall director", "Kenji director birth date"]),
        # a preamble and a closing remark around a numbered list: only the items count
        ("Sure! Here are some queries:\n1. Nightfall film director\n2. \"Kenji film director\"\n"
         "These queries will help you find it.", ["Nightfall film director", "Kenji film director"]),
        ("- Query: Nightfall director born\n- Kenji director born (this finds the date)",
         ["Nightfall director born", "Kenji director born"]),
        ("Nightfall director ## Kenji director", ["Nightfall director", "Kenji director"]),
        ("<think>two films</think>Nightfall director", ["Nightfall director"]),
        # what the default model wrote: the question, then the prompt's fields echoed
        ("Can I ship it?\n\nQuestion: Can I ship it?\n\nReply: (no, no)", ["Can I ship it"]),
        ("夜幕 导演\n健二 导演 出生", ["夜幕 导演", "健二 导演 出生"]),
    ],
)
def test_reply_parsed_one_query_per_line(reply, expected):
    assert parse_subqueries(reply, 3) == expected


def test_duplicates_dropped_and_at_most_n():
    reply = "Nightfall director\nnightfall  Director.\nKenji director\nNightfall year\nKenji year"
    assert parse_subqueries(reply, 3) == ["Nightfall director", "Kenji director", "Nightfall year"]
    assert parse_subqueries(reply, 1) == ["Nightfall director"]
    assert parse_subqueries("the of\n\n  \n", 3) == []  # nothing with content


def test_each_query_is_capped_like_a_rewrite():
    long = " ".join(f"w{i}" for i in range(50))
    assert parse_subqueries(long, 3, max_words=5) == ["w0 w1 w2 w3 w4"]


# -- the builder -----------------------------------------------------------------------------------
def test_one_call_gives_the_subqueries():
    gen = ScriptedGenerator([], replies=["1. Nightfall director\n2. Kenji director\n3. Nightfall director"])
    query = MultiQuery(gen, max_queries=3).build(QUESTION, "Nightfall was directed by", need())
    assert query.mode == "multi" and query.llm_calls == 1 and query.fallback_from is None
    assert query.subqueries == ["Nightfall director", "Kenji director"]
    assert query.searches == query.subqueries and query.text == "Nightfall director ## Kenji director"
    assert len(gen.helper_prompts) == 1 and "up to 3" in gen.helper_prompts[0]
    assert QUESTION in gen.helper_prompts[0]


def test_chinese_question_gets_the_chinese_prompt():
    gen = ScriptedGenerator([], replies=["夜幕 导演"])
    query = MultiQuery(gen, max_queries=2).build("谁导演了夜幕？", "", need("夜幕的导演是某人。"))
    assert "最多2个" in gen.helper_prompts[0] and query.subqueries == ["夜幕 导演"]


def test_nothing_usable_falls_back_to_the_masked_query():
    gen = ScriptedGenerator([], replies=["Here is a query for you."])
    query = MultiQuery(gen).build(QUESTION, "", need())
    assert query.fallback_from == "multi" and query.mode == "masked" and query.llm_calls == 1
    assert query.subqueries == [] and query.searches == [query.text] and "Nightfall" in query.text
    assert len(gen.helper_prompts) == 1  # no second call


def test_registered_and_configured():
    gen = ScriptedGenerator([], replies=["a one\nb two\nc three"])
    builder = build_query_builder(QueryConfig(mode="multi", max_subqueries=2), gen)
    assert isinstance(builder, MultiQuery) and builder.build(QUESTION, "", need()).subqueries == ["a one", "b two"]
    with pytest.raises(InputError, match="needs a generator"):
        build_query_builder(QueryConfig(mode="multi"), None)
    with pytest.raises(ConfigError, match="max_subqueries: must be at least 1"):
        load_config(None, query={"max_subqueries": 0})
    assert QueryConfig().max_subqueries == 3 and QueryConfig().mode == "auto"  # a marker phrase when there is one, else masked


# -- markers with several searches -----------------------------------------------------------------
def marker_decision(*phrases: str) -> Decision:
    markers = [{"start": 0, "end": 1, "phrase": p, "closed": True} for p in phrases]
    return Decision(True, 1.0, "marker", intents=list(phrases), evidence={"markers": markers})


def test_marker_phrase_split_on_hashes():
    assert split_subqueries(" a b ## c d ##  ## e ") == ["a b", "c d", "e"]
    assert split_subqueries("夜幕 导演 ＃＃ 健二 导演") == ["夜幕 导演", "健二 导演"]
    query = MarkerQuery().build(QUESTION, "", marker_decision("Nightfall director ## Kenji director"))
    assert query.mode == "marker" and query.subqueries == ["Nightfall director", "Kenji director"]
    assert query.text == "Nightfall director ## Kenji director"


def test_marker_searches_capped_and_two_markers_are_two_searches():
    capped = MarkerQuery(max_subqueries=2).build(QUESTION, "", marker_decision("a b ## c d ## e f"))
    assert capped.subqueries == ["a b", "c d"]
    two = MarkerQuery().build(QUESTION, "", marker_decision("Nightfall director", "Kenji director"))
    assert two.subqueries == ["Nightfall director", "Kenji director"]  # two markers: searched together
    plain = MarkerQuery(split_markers=False).build(QUESTION, "", marker_decision("Nightfall director", "Kenji director"))
    assert plain.text == "Nightfall director; Kenji director" and plain.subqueries == []
    single = MarkerQuery().build(QUESTION, "", marker_decision("Nightfall director ##"))
    assert single.text == "Nightfall director" and single.searches == ["Nightfall director"]


# -- retrieving and merging ------------------------------------------------------------------------
class ListRetriever:
    """Fixed ranked lists per query; counts its calls."""

    def __init__(self, lists: dict[str, list[Hit]]):
        self.lists, self.calls = lists, []

    def search(self, query: str, top_k: int = 5) -> list[Hit]:
        self.calls.append(query)
        return self.lists.get(query, [])[:top_k]


class BatchRetriever(ListRetriever):
    def search_many(self, queries: list[str], top_k: int = 5) -> list[list[Hit]]:
        self.calls.append(tuple(queries))
        return [self.lists.get(q, [])[:top_k] for q in queries]


LISTS = {"q one": [hit("a"), hit("b"), hit("c")], "q two": [hit("c"), hit("d"), hit("a")]}


@pytest.mark.parametrize("kind", [ListRetriever, BatchRetriever])
def test_merge_by_rrf_dedups_and_records_who_found_each(kind):
    retriever = kind(LISTS)
    hits = search_queries(retriever, ["q one", "q two"], top_k=3)
    assert [h.chunk_id for h in hits] == ["a", "c", "b"]  # found by both lists first
    assert len({h.chunk_id for h in hits}) == 3
    assert hits[0].ranks == {"q1": 1, "q2": 3, "merged": 1}
    assert hits[2].ranks == {"q1": 2, "merged": 3}
    assert hits[0].score == pytest.approx(1 / 61 + 1 / 63)
    expected = [("q one", "q two")] if kind is BatchRetriever else ["q one", "q two"]
    assert retriever.calls == expected  # one batched call where the retriever has one


def test_one_query_is_one_plain_search():
    retriever = BatchRetriever(LISTS)
    hits = search_queries(retriever, ["q one"], top_k=2)
    assert retriever.calls == ["q one"] and hits == LISTS["q one"][:2]  # unchanged, no merge ranks


def test_fuse_hit_lists_keeps_top_k_and_collapses_copies():
    copy = Hit(chunk_id="a2", doc_id="a2", title="a", text="text of a", score=1.0)
    hits = fuse_hit_lists({"q1": [hit("a"), hit("b")], "q2": [copy, hit("e")]}, top_k=2)
    assert [h.chunk_id for h in hits] == ["a", "b"] and hits[0].metadata["collapsed"] == ["a2"]


def test_controller_searches_each_subquery_and_records_the_merge():
    gen = ScriptedGenerator(["Nightfall was directed by X.", " Done."], replies=["q one\nq two"])
    retriever = BatchRetriever(LISTS)
    context = ContextManager(ContextConfig(), gen.count_tokens, gen.render_chat)
    result = RIGController(
        gen, retriever, AlwaysDecider(), build_query_builder(QueryConfig(mode="multi"), gen), context,
        config=ControllerConfig(max_rounds=1), generation=GeneratorConfig(max_answer_tokens=100), top_k=3,
    ).run(QUESTION)
    fired = result.rounds[0]
    assert fired.query.subqueries == ["q one", "q two"] and retriever.calls == [("q one", "q two")]
    assert [h.chunk_id for h in fired.hits] == ["a", "c", "b"] and fired.hits[1].ranks["q1"] == 3
    loaded = RIGResult.from_json(result.to_json())
    assert loaded.rounds[0].query == fired.query and loaded.rounds[0].hits == fired.hits
    html = query_html(fired.query)
    assert "sub-queries" in html and html.count('class="rig-subquery"') == 2
    table = hits_html(fired.hits)
    assert table.index('data-retriever="q1"') < table.index('data-retriever="merged"')


def test_old_trace_json_loads_without_subqueries():
    gen = ScriptedGenerator(["Apache needs XYZ.", " Done."])
    context = ContextManager(ContextConfig(), gen.count_tokens, gen.render_chat)
    result = RIGController(
        gen, DictRetriever({}, default=[hit("a")]), AlwaysDecider(),
        build_query_builder(QueryConfig(), gen), context, config=ControllerConfig(max_rounds=1),
    ).run(QUESTION)
    data = json.loads(result.to_json())
    for r in data["rounds"]:
        if r["query"]:
            del r["query"]["subqueries"]  # as written before sub-queries existed
    loaded = RIGResult.from_dict(data)
    query = loaded.rounds[0].query
    assert query.subqueries == [] and query.searches == [query.text]
    assert "sub-queries" not in query_html(query)
    assert Query("x", "masked").searches == ["x"]


# -- the real default model ------------------------------------------------------------------------
@pytest.mark.slow
def test_multi_query_round_with_the_default_model(default_generator, demo_retriever):
    from rigkit.build import build_controller

    config = load_config("configs/cpu.yaml", decider={"name": "always"}, controller={"max_rounds": 1},
                         query={"mode": "multi", "max_subqueries": 3}, generator={"max_answer_tokens": 48})
    result = build_controller(config, default_generator, demo_retriever).run(
        "Can I use code under the Apache-2.0 licence in a commercial product, and what must I include?")
    fired = [r for r in result.rounds if r.query is not None]
    assert fired and not result.errors
    query, hits = fired[0].query, fired[0].hits
    assert query.llm_calls == 1
    assert 1 <= len(query.searches) <= 3
    assert hits and len(hits) <= config.retrieval.top_k and len({h.chunk_id for h in hits}) == len(hits)
    if query.mode == "multi" and len(query.subqueries) > 1:  # merged: each hit names its finders
        assert all("merged" in h.ranks and any(k.startswith("q") for k in h.ranks) for h in hits)
