"""Metadata filters: parsing, filtering inside BM25 / dense / hybrid before top_k, one-line errors,
the `--filter` flag, `retrieval.filters`, and the server's /retrieve, rig.search and MCP search."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from rigkit.config import ConfigError, RunConfig, apply_settings
from rigkit.errors import InputError
from rigkit.retrieval import Index
from rigkit.retrieval.filters import (
    ChunkFilter,
    Condition,
    FilteredRetriever,
    FilterError,
    Filters,
    parse_filters,
)
from rigkit.testing import DictRetriever
from rigkit.trace import Hit
from tests.conftest_retrieval import DATA, HashEmbedder, write_jsonl

# twelve reports on river floods: same words everywhere, so every one scores for the query
ROWS = [
    {"id": f"report-{i}", "title": f"Flood report {i}",
     "text": f"The river flood of {1950 + 6 * i} reached the old bridge; report {i} on water levels.",
     "year": 1950 + 6 * i, "lang": "en" if i % 3 else "de", "page": 1 + i % 4,
     "modified": f"202{i % 5}-0{1 + i % 9}-15T10:00:00+00:00", "source": f"reports/{i}.pdf",
     "tags": ["flood", "bridge"] if i % 2 else ["flood"]}
    for i in range(12)
]
QUERY = "river flood bridge water"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    corpus = write_jsonl(tmp_path_factory.mktemp("corpus") / "floods.jsonl", ROWS)
    return Index.build(corpus, tmp_path_factory.mktemp("idx") / "floods", embedder=HashEmbedder())


def _docs(hits):
    return [h.doc_id for h in hits]


def _rows(**where):
    return {r["id"] for r in ROWS if all(test(r[k]) for k, test in where.items())}


# -- parsing ----------------------------------------------------------------------------------------

def test_the_text_forms():
    f = parse_filters(["lang=en", "year>=1990", "page<3", "lang!=fr", "source=a.pdf,b.pdf"])
    assert [(c.key, c.op) for c in f.conditions] == [
        ("lang", "eq"), ("year", "gte"), ("page", "lt"), ("lang", "ne"), ("source", "in")]
    assert f.conditions[1].value == 1990.0 and f.conditions[4].value == ("a.pdf", "b.pdf")
    assert str(f) == "lang=en and year>=1990 and page<3 and lang!=fr and source=a.pdf,b.pdf"
    assert parse_filters("modified<2024-01-01").conditions[0].value == datetime(2024, 1, 1, tzinfo=timezone.utc)


def test_the_json_forms_and_the_round_trip():
    f = parse_filters({"lang": "en", "year": {"gte": 1990, "lt": 2000}, "page": [1, 2]})
    assert [(c.key, c.op, c.written) for c in f.conditions] == [
        ("lang", "eq", "en"), ("year", "gte", 1990), ("year", "lt", 2000), ("page", "in", (1, 2))]
    assert parse_filters(json.loads(json.dumps(f.to_json()))) == f
    assert parse_filters(None) is None and parse_filters({}) is None and parse_filters([]) is None
    assert parse_filters(["lang=en", {"year": {"gt": 3}}]) == Filters(
        (Condition("lang", "eq", "en"), Condition("year", "gt", 3.0)))


@pytest.mark.parametrize("text", ["year=>1990", "year==1990", "=en", "lang=", "lang", "year>=", "a<=<3"])
def test_a_malformed_filter_shows_the_accepted_forms(text):
    with pytest.raises(FilterError, match="malformed filter .*accepted forms: key=value") as err:
        parse_filters([text])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("spec", "message"), [
    ({"year": {"between": [1, 2]}}, "unknown operator 'between'"),
    ({"year": {"gte": "soon"}}, "neither a number nor an ISO 8601 date"),
    (["year>=abc"], "neither a number nor an ISO 8601 date"),
    ({"year": {}}, "an empty condition"),
    ({"lang": None}, "a value is text, a number or true/false"),
    ({"lang": {"in": []}}, "non-empty list"),
    (5, "a mapping, a list or a string"),
    ([3], "strings or objects"),
])
def test_bad_json_filters_are_one_clear_line(spec, message):
    with pytest.raises(FilterError, match=message):
        parse_filters(spec)


def test_values_compare_as_numbers_dates_lists_and_booleans():
    assert Condition("year", "eq", "1990").test(1990) and Condition("year", "eq", 1990).test("1990.0")
    assert Condition("tags", "eq", "bridge").test(["flood", "bridge"])
    assert Condition("ok", "eq", "true").test(True) and not Condition("ok", "eq", "false").test(True)
    day = parse_filters("modified>=2024-01-01").conditions[0]
    assert day.test("2024-01-01T00:00:00Z") and day.test("2024-03-01") and not day.test("2023-12-31T23:59:59+00:00")
    assert not Condition("year", "gte", 3.0).test("not a number")
    assert Condition("lang", "ne", "en").test(None) and not Condition("lang", "eq", "en").test(None)


# -- inside the retrievers, before top_k --------------------------------------------------------------

@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_each_retriever_filters_before_top_k_so_the_list_stays_full(index, mode):
    retriever = index.retriever(mode)
    wanted = _rows(lang=lambda v: v == "en", year=lambda v: v >= 1970)
    assert len(wanted) >= 5
    hits = retriever.search(QUERY, 5, filters=["lang=en", "year>=1970"])
    assert len(hits) == 5 and set(_docs(hits)) <= wanted
    assert all(h.metadata["lang"] == "en" and h.metadata["year"] >= 1970 for h in hits)  # hits keep metadata
    everything = retriever.search(QUERY, len(ROWS), filters={"year": {"gte": 1970}, "lang": "en"})
    assert set(_docs(everything)) == wanted


def test_filtered_dense_ranking_is_the_unfiltered_ranking_restricted(index):
    dense = index.dense()
    full = _docs(dense.search(QUERY, len(ROWS)))
    wanted = _rows(page=lambda v: v <= 2)
    assert _docs(dense.search(QUERY, len(ROWS), filters="page<=2")) == [d for d in full if d in wanted]


def test_dates_lists_and_membership_filter(index):
    bm25 = index.bm25()
    assert set(_docs(bm25.search(QUERY, 12, filters="modified<2022-01-01"))) == _rows(
        modified=lambda v: v < "2022")
    assert set(_docs(bm25.search(QUERY, 12, filters="tags=bridge"))) == _rows(tags=lambda v: "bridge" in v)
    assert set(_docs(bm25.search(QUERY, 12, filters="source=reports/1.pdf,reports/2.pdf"))) == {
        "report-1", "report-2"}
    assert _docs(bm25.search(QUERY, 12, filters="doc_id=report-3")) == ["report-3"]


def test_unknown_key_names_the_keys_of_the_index(index):
    with pytest.raises(FilterError) as err:
        index.bm25().search(QUERY, 3, filters="yeer>=1990")
    assert str(err.value) == ("unknown filter key 'yeer' (did you mean 'year'?); the index's chunks have: "
                              "doc_id, lang, modified, page, source, tags, title, year")


def test_a_filter_matching_nothing_says_what_the_index_holds(index):
    with pytest.raises(FilterError, match=r"^no chunk has year>=3000 \(year in the index: 1950 to 2016\)$"):
        index.dense().search(QUERY, 3, filters="year>=3000")
    with pytest.raises(FilterError, match=r"no chunk has lang=fr \(lang in the index: de, en\)"):
        index.retriever("hybrid").search(QUERY, 3, filters="lang=fr")
    with pytest.raises(FilterError, match=r"no chunk has lang=de and year>=2005 together \(chunks passing "
                                          r"each alone: lang=de 4, year>=2005 2\)"):
        index.bm25().search(QUERY, 3, filters=["lang=de", "year>=2005"])


def test_a_range_on_text_or_of_the_wrong_kind_says_so(index):
    with pytest.raises(FilterError, match=r"lang>=3: a range needs numbers, and lang holds text \(de, en\)"):
        index.bm25().search(QUERY, 3, filters="lang>=3")
    with pytest.raises(FilterError, match="modified holds dates .*give the bound as a date"):
        index.bm25().search(QUERY, 3, filters="modified>=2022")


def test_masks_are_cached_per_filter(index):
    chunk_filter = ChunkFilter(index.chunks)
    f = parse_filters("lang=en")
    assert chunk_filter.mask(f) is chunk_filter.mask(parse_filters({"lang": "en"}))


# -- custom retrievers, bound filters, config ------------------------------------------------------------

def test_a_retriever_without_filters_works_unfiltered_and_refuses_a_filter():
    from rigkit.retrieval import HybridRetriever

    plain = DictRetriever({}, default=[Hit("x#0", "x", "X", "text", 1.0)])
    fused = HybridRetriever({"plain": plain})
    assert _docs(fused.search("q", 3)) == ["x"]
    with pytest.raises(FilterError, match="the retriever .* takes no filters .*`filters=None`"):
        fused.search("q", 3, filters="lang=en")
    with pytest.raises(FilterError, match="takes no filters"):
        FilteredRetriever(plain, parse_filters("lang=en"))


def test_a_chunk_scoring_retriever_without_filters_in_a_hybrid(index):
    from rigkit.retrieval import HybridRetriever

    bm25 = index.bm25()

    class OldScorer:  # the ScoresChunks protocol as it was: scored(query, depth)
        name, chunks = "old", bm25.chunks

        def scored(self, query, depth):
            return bm25.scored(query, depth)

    fused = HybridRetriever({"old": OldScorer()})
    assert len(fused.search(QUERY, 5)) == 5
    with pytest.raises(FilterError, match="'OldScorer' takes no filters .*`filters=None`"):
        fused.search(QUERY, 5, filters="lang=en")


def test_bound_filters_and_call_filters_are_anded(index):
    bound = FilteredRetriever(index.retriever("hybrid"), parse_filters("lang=en"))
    assert all(h.metadata["lang"] == "en" for h in bound.search(QUERY, 8))
    assert {h.metadata["page"] for h in bound.search(QUERY, 8, filters="page=2")} == {2}
    with pytest.raises(FilterError, match="no chunk has year>=3000"):  # checked when bound, not at a search
        FilteredRetriever(index.retriever("hybrid"), parse_filters("year>=3000"))


def test_a_reranked_retriever_filters_its_candidates(index):
    from rigkit.retrieval.rerank import RerankedRetriever, ranked_by

    class ByYear:  # newest first, whatever the inner order
        def rerank(self, query, hits):
            return ranked_by(hits, [h.metadata["year"] for h in hits])

    reranked = RerankedRetriever(index.retriever("hybrid"), ByYear(), candidates=12)
    hits = reranked.search(QUERY, 3, filters="lang=de")
    assert {h.metadata["lang"] for h in hits} == {"de"}
    assert [h.metadata["year"] for h in hits] == sorted((r["year"] for r in ROWS if r["lang"] == "de"), reverse=True)[:3]
    many = reranked.search_many([QUERY, "old bridge"], 2, filters={"year": {"lt": 1970}})
    assert all(h.metadata["year"] < 1970 for hits in many for h in hits) and all(len(hits) == 2 for hits in many)
    with pytest.raises(FilterError, match="unknown filter key 'lingo'"):
        reranked.search(QUERY, 3, filters="lingo=de")


def test_config_filters_reach_the_built_retriever(index):
    from rigkit.build import build_retriever

    config = apply_settings(RunConfig(), [f"retrieval.index={index.path}", "retrieval.mode=bm25",
                                          "retrieval.filters=[lang=de]"])
    assert config.retrieval.filters == ("lang=de",)
    hits = build_retriever(config.retrieval).search(QUERY, 12)
    assert set(_docs(hits)) == _rows(lang=lambda v: v == "de")
    mapping = apply_settings(config, ["retrieval.filters={year: {lt: 1970}}"]).retrieval
    assert set(_docs(build_retriever(mapping).search(QUERY, 12))) == _rows(year=lambda v: v < 1970)
    with pytest.raises(InputError, match="unknown filter key 'lingo'"):
        build_retriever(apply_settings(config, ["retrieval.filters=[lingo=de]"]).retrieval)


def test_a_config_file_holds_filters_and_round_trips():
    config = RunConfig.from_yaml("retrieval:\n  filters:\n    lang: en\n    year: {gte: 1990}\n")
    assert RunConfig.from_yaml(config.to_yaml()) == config
    assert parse_filters(config.retrieval.filters) == parse_filters(["lang=en", "year>=1990"])
    with pytest.raises(ConfigError, match="retrieval.filters: expected mapping or list of strings"):
        RunConfig.from_yaml("retrieval:\n  filters: 3\n")


# -- the command line --------------------------------------------------------------------------------------

def test_search_filter_flag(index, cli):
    run = cli("search", str(index.path), QUERY, "--mode", "bm25", "--top-k", "12", "--filter", "lang=de",
              "--filter", "year<2000", "--json")
    assert run.returncode == 0, run.stderr
    assert {h["doc_id"] for h in json.loads(run.stdout)} == _rows(lang=lambda v: v == "de", year=lambda v: v < 2000)


@pytest.mark.parametrize(("flag", "message"), [
    ("year>=3000", "no chunk has year>=3000 (year in the index: 1950 to 2016)"),
    ("yeer=1", "unknown filter key 'yeer'"),
    ("year=>1", "malformed filter 'year=>1'; accepted forms:"),
])
def test_search_filter_flag_errors_are_one_line(index, cli, flag, message):
    run = cli("search", str(index.path), QUERY, "--mode", "bm25", "--filter", flag)
    assert run.returncode == 2
    assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_ask_refuses_a_malformed_filter_before_loading_anything(cli):
    run = cli("ask", "What is the MIT License?", "--filter", "lang=>en")
    assert run.returncode == 2 and "malformed filter 'lang=>en'" in run.stderr


# -- the server ----------------------------------------------------------------------------------------------

@pytest.fixture
def client(index):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from rigkit.serve.app import create_app
    from rigkit.serve.service import RigService

    service = RigService(RunConfig(), retriever=index.retriever("hybrid"), load_model=False)
    with TestClient(create_app(service), base_url="http://127.0.0.1") as c:
        yield c


def _retrieved_docs(body):
    return [{item.get("document", item).get("doc_id") for item in per_query} for per_query in body["result"]]


def test_retrieve_takes_filters(client):
    r = client.post("/retrieve", json={"queries": [QUERY, "old bridge"], "topk": 5,
                                       "filters": {"lang": "en", "year": {"gte": 1970}}})
    assert r.status_code == 200, r.text
    wanted = _rows(lang=lambda v: v == "en", year=lambda v: v >= 1970)
    assert all(len(docs) == 5 and docs <= wanted for docs in _retrieved_docs(r.json()))
    unfiltered = client.post("/retrieve", json={"queries": [QUERY], "topk": 12})
    assert _retrieved_docs(unfiltered.json())[0] == {r["id"] for r in ROWS}


@pytest.mark.parametrize(("filters", "message"), [
    (["year=>1"], "malformed filter"),
    ({"year": {"gte": "soon"}}, "neither a number nor an ISO 8601 date"),
    ({"yeer": 1}, "unknown filter key 'yeer'"),
    (["year>=3000"], "no chunk has year>=3000 (year in the index: 1950 to 2016)"),
    (["lang>=3"], "a range needs numbers"),
    (7, "filters"),
])
def test_retrieve_refuses_bad_filters_with_a_4xx(client, filters, message):
    r = client.post("/retrieve", json={"queries": [QUERY], "topk": 3, "filters": filters})
    assert r.status_code in (400, 422), r.text
    assert message in r.json()["error"]["message"]


def test_rpc_search_takes_filters(client):
    call = {"jsonrpc": "2.0", "id": 1, "method": "rig.search",
            "params": {"query": QUERY, "topk": 4, "filters": ["lang=de"]}}
    reply = client.post("/rpc", json=call).json()
    assert {h["id"].split("#")[0] for h in reply["result"]} <= _rows(lang=lambda v: v == "de")
    assert len(reply["result"]) == 4
    call["params"]["filters"] = ["lingo=de"]
    error = client.post("/rpc", json=call).json()["error"]
    assert error["code"] == -32602 and "unknown filter key 'lingo'" in error["message"]
    call["params"]["filters"] = ["lang=>de"]
    error = client.post("/rpc", json=call).json()["error"]
    assert error["code"] == -32602 and "malformed filter" in error["message"]


def _mcp_call(client, arguments):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search", "arguments": arguments}}
    r = client.post("/mcp", json=body, headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code == 200, r.text
    return r.json()["result"]


def test_mcp_search_takes_filters(client):
    pytest.importorskip("mcp")
    result = _mcp_call(client, {"query": QUERY, "top_k": 5, "filters": {"year": {"lt": 1980}}})
    assert not result.get("isError"), result
    hits = result["structuredContent"]["result"]
    assert len(hits) == 5 and {h["id"].split("#")[0] for h in hits} <= _rows(year=lambda v: v < 1980)
    refused = _mcp_call(client, {"query": QUERY, "filters": ["year>=3000"]})
    assert refused["isError"] and "no chunk has year>=3000" in refused["content"][0]["text"]


def test_a_served_retriever_without_filters_serves_unfiltered_calls_and_refuses_filters():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from rigkit.serve.app import create_app
    from rigkit.serve.service import RigService

    plain = DictRetriever({}, default=[Hit("x#0", "x", "X", "text", 1.0)])
    service = RigService(RunConfig(), retriever=plain, load_model=False)
    with TestClient(create_app(service, mcp=False), base_url="http://127.0.0.1") as c:
        assert c.post("/retrieve", json={"queries": ["q"]}).status_code == 200
        r = c.post("/retrieve", json={"queries": ["q"], "filters": {"lang": "en"}})
    assert r.status_code == 422 and "takes no filters" in r.json()["error"]["message"]


def test_remote_retriever_sends_filters_and_checks_the_hits(client):
    from rigkit.retrieval.remote import RemoteRetrievalError, RemoteRetriever

    remote = RemoteRetriever("http://127.0.0.1/retrieve", transport=client._transport)
    hits = remote.search(QUERY, 4, filters={"page": {"lte": 2}})
    assert len(hits) == 4 and all(h.metadata["page"] <= 2 for h in hits)
    with pytest.raises(RemoteRetrievalError, match="unknown filter key 'pag'"):
        remote.search(QUERY, 4, filters="pag<=2")


def test_a_remote_server_that_ignores_filters_is_caught(client):
    from rigkit.retrieval.remote import RemoteRetrievalError, RemoteRetriever

    remote = RemoteRetriever("http://127.0.0.1/retrieve", transport=client._transport)
    found = remote.search_many([QUERY], 12)  # what a server that ignores `filters` would send
    with pytest.raises(RemoteRetrievalError, match="does not apply filters"):
        remote._check_filtered(found, parse_filters("lang=de"))


# -- the demo index, real embedder --------------------------------------------------------------------------

@pytest.mark.slow
def test_demo_index_language_filter_with_the_real_embedder(demo_retriever):
    """The demo corpus's `lang` field: Chinese documents only, the full top_k, for an English query."""
    languages = {json.loads(line)["lang"] for line in (DATA / "demo" / "corpus.jsonl").open(encoding="utf-8")}
    assert languages == {"en", "zh"}
    hits = demo_retriever.search("filter replacement and warranty", 3, filters="lang=zh")
    assert len(hits) == 3 and {h.metadata["lang"] for h in hits} == {"zh"}
    english = demo_retriever.search("Apache licence commercial use", 5, filters={"lang": "en"})
    assert len(english) == 5 and {h.metadata["lang"] for h in english} == {"en"}
    with pytest.raises(FilterError, match=r"no chunk has lang=fr \(lang in the index: en, zh\)"):
        demo_retriever.search("licence", 3, filters="lang=fr")
