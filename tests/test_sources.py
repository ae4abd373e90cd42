"""Several knowledge bases in one run, over real indexes: the demo corpus and a small corpus of sea
animals, built here with the real embedder, and a third index served by a real `rigkit serve`
(`/retrieve`, uvicorn on a loopback port). Routing by a named source, by a rule and across all
sources merged by RRF; hits and citations name their source; a source that is down leaves the
others answering and the result says which was missing; bad input is one line."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from rigkit.build import build_retriever, build_run  # noqa: E402
from rigkit.citations import source_label  # noqa: E402
from rigkit.config import RetrievalConfig, RunConfig, SourceConfig, load_config  # noqa: E402
from rigkit.errors import InputError  # noqa: E402
from rigkit.retrieval import Index, open_index  # noqa: E402
from rigkit.retrieval.hybrid import rrf_scores  # noqa: E402
from rigkit.retrieval.remote import RemoteRetriever  # noqa: E402
from rigkit.retrieval.sources import (  # noqa: E402
    DOWN_SECONDS,
    Source,
    SourcesDownError,
    SourcesRetriever,
    collect_notes,
)
from rigkit.serve.app import create_app  # noqa: E402
from rigkit.serve.service import RigService  # noqa: E402
from rigkit.testing import ScriptedGenerator  # noqa: E402
from rigkit.trace import RIGResult  # noqa: E402
from tests.test_search_r1_protocol import serving  # noqa: E402

SEA = [
    {"id": "narwhal", "title": "Narwhal", "text": "The narwhal's tusk is a tooth that grows through its upper lip "
     "and can reach three metres. Narwhals live in Arctic waters around Greenland and Canada."},
    {"id": "walrus", "title": "Walrus", "text": "A walrus uses its tusks to haul itself onto the ice. An adult male "
     "weighs up to one and a half tonnes."},
    {"id": "orca", "title": "Orca", "text": "Orcas hunt in family groups called pods and eat fish, seals and even "
     "whales. They are the largest members of the dolphin family."},
]
RIVERS = [
    {"id": "danube", "title": "Danube", "text": "The Danube flows through ten countries, more than any other river, "
     "from the Black Forest to the Black Sea."},
    {"id": "rhine", "title": "Rhine", "text": "The Rhine rises in the Swiss Alps and reaches the North Sea in the "
     "Netherlands; barges carry coal and containers along it."},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, str]:
    """Three real indexes (the real default embedder): the demo corpus (its cached implicit
    index, as `rigkit ask` uses it), sea animals and rivers."""
    folder = tmp_path_factory.mktemp("sources")
    built = {"licences": str(open_index(RetrievalConfig()).path)}
    for name, corpus in (("sea", write_jsonl(folder / "sea.jsonl", SEA)),
                         ("rivers", write_jsonl(folder / "rivers.jsonl", RIVERS))):
        Index.build(corpus, folder / name)
        built[name] = str(folder / name)
    return built


@pytest.fixture(scope="module")
def rivers_server(indexes):
    """A real `rigkit serve` app over the rivers index: its `/retrieve` is a remote source."""
    config = RunConfig().override(retrieval={"index": indexes["rivers"]})
    service = RigService(config, generator=ScriptedGenerator([]))
    with serving(create_app(service, mcp=False)) as base:
        yield base + "/retrieve"


def sources_config(indexes, rivers_url, **sea) -> RetrievalConfig:
    return RetrievalConfig(top_k=4, sources=(
        SourceConfig("licences", indexes["licences"]),
        SourceConfig("sea", indexes["sea"], **sea),
        SourceConfig("rivers", rivers_url)))


@pytest.fixture(scope="module")
def routed(indexes, rivers_server):
    return build_retriever(sources_config(indexes, rivers_server, route=r"\b(narwhal|walrus|orca)s?\b"))


def test_all_sources_are_searched_and_merged_by_rrf(routed):
    query = "tusks on the ice, the MIT licence and the Danube river"  # no rule matches
    hits = routed.search(query, top_k=4)
    own = {name: routed.search(query, top_k=4, source=name) for name in ("licences", "sea", "rivers")}
    assert {h.source for h in hits} == {"licences", "sea", "rivers"}
    for hit in hits:
        assert hit.chunk_id.startswith(hit.source + ":") and hit.ranks[hit.source] >= 1
    fused = rrf_scores({name: [h.chunk_id for h in found] for name, found in own.items()})
    assert [h.score for h in hits] == [fused[h.chunk_id] for h in hits] == sorted(fused.values(), reverse=True)[:4]
    assert [h.ranks["sources"] for h in hits] == [1, 2, 3, 4]
    assert own["rivers"][0].title == "Danube" and own["sea"][0].title == "Walrus"  # the remote answered


def test_a_named_source_or_a_rule_sends_the_query_to_one_source(routed):
    assert {h.source for h in routed.search("How heavy is a walrus?", top_k=3)} == {"sea"}  # the rule
    named = routed.search("How heavy is a walrus?", top_k=3, source="rivers")  # the name wins over the rule
    assert {h.source for h in named} == {"rivers"}
    assert len({h.source for h in routed.search("which licence needs a NOTICE file", top_k=4)}) > 1  # no rule
    with pytest.raises(InputError, match="unknown source 'lakes'; known: licences, sea, rivers"):
        routed.search("x", source="lakes")


def test_a_source_that_is_down_leaves_the_others_answering(indexes):
    down = f"http://127.0.0.1:{free_port()}/retrieve"  # nothing listens there
    both = build_retriever(RetrievalConfig(sources=(SourceConfig("sea", indexes["sea"]),)))
    retriever = SourcesRetriever([*both.sources.values(), Source("wiki", RemoteRetriever(down, retries=0))])
    with collect_notes() as notes:
        hits = retriever.search("narwhal tusk", top_k=2)
    assert [h.source for h in hits] == ["sea", "sea"] and hits[0].title == "Narwhal"
    assert len(notes) == 1 and notes[0].startswith("source 'wiki' did not answer (RemoteRetrievalError")
    assert notes[0].endswith("its passages are missing")
    with collect_notes() as later:  # left out for a while: one search paid for its retries, not each
        assert [h.source for h in retriever.search("orca pods", top_k=2)] == ["sea", "sea"]
    assert later == [f"source 'wiki' left out: it did not answer {DOWN_SECONDS:g} s ago or less "
                     f"{notes[0].split(' did not answer ')[1]}"]
    with pytest.raises(SourcesDownError, match="no source answered: 'wiki' left out"):
        retriever.search("narwhal", top_k=2, source="wiki")
    fresh = SourcesRetriever([*both.sources.values(), Source("wiki", RemoteRetriever(down, retries=0))])
    service = RigService(RunConfig(), generator=ScriptedGenerator([]), retriever=fresh)
    with serving(create_app(service, mcp=False)) as base:
        answer = httpx.post(base + "/retrieve", json={"queries": ["narwhal tusk"], "topk": 1}).json()
    assert answer["result"][0][0]["title"] == "Narwhal"
    assert len(answer["warnings"]) == 1 and answer["warnings"][0].startswith("source 'wiki' did not answer")


def test_a_run_routes_by_its_markers_names_sources_and_says_which_was_missing(indexes, rivers_server):
    down = f"http://127.0.0.1:{free_port()}/retrieve"
    sea = build_retriever(RetrievalConfig(sources=(SourceConfig("sea", indexes["sea"]),
                                                   SourceConfig("licences", indexes["licences"]))))
    retriever = SourcesRetriever([*sea.sources.values(), Source("wiki", RemoteRetriever(down, retries=0))])
    generator = ScriptedGenerator(["The tusk <retrieve>@sea narwhal tusk tooth</retrieve>",
                                   " is a tooth. Licences <retrieve>MIT licence copyright notice</retrieve>",
                                   " need the notice."])
    config = load_config(decider={"name": "marker"}, query={"mode": "marker"},
                         controller={"policy": "continue"}, retrieval={"top_k": 2})
    result = build_run(config, generator, retriever).controller.run("What is a narwhal's tusk?")
    searched = [r for r in result.rounds if r.query is not None]
    assert [r.query.source for r in searched] == ["sea", ""]
    assert {h.source for h in searched[0].hits} == {"sea"} and searched[0].hits[0].title == "Narwhal"
    assert "licences" in {h.source for h in searched[1].hits}
    assert [w for w in result.warnings if "wiki" in w] == [
        w for w in result.warnings if w.startswith("round 1: source 'wiki' did not answer")]
    assert any("wiki" in w for w in result.warnings) and not result.errors
    assert source_label(searched[0].hits[0]) == "sea: Narwhal"
    from rigkit.widgets.render import hits_html

    assert 'class="rig-hit-source" style="font-size:11px;">sea: Narwhal</span>' in hits_html(searched[0].hits)
    back = RIGResult.from_json(result.to_json())
    assert back.rounds[0].hits[0].source == "sea" and back.rounds[0].query.source == "sea"
    assert back.to_dict() == result.to_dict()


def test_an_older_trace_without_sources_still_loads():
    old = {"question": "q", "answer": "a", "version": 2,
           "passages": [{"chunk_id": "d#0", "doc_id": "d", "title": "T", "text": "x", "score": 1.0}],
           "rounds": [{"index": 0, "segment": {"text": "a"}, "decision": {"retrieve": True, "score": 1.0, "reason": ""},
                       "query": {"text": "q", "mode": "masked"}, "hits": []}]}
    result = RIGResult.from_dict(old)
    assert result.passages[0].source == "" and result.rounds[0].query.source == ""


def test_the_server_searches_one_named_source_and_refuses_an_unknown_one(routed):
    service = RigService(RunConfig(), generator=ScriptedGenerator([]), retriever=routed)
    with serving(create_app(service, mcp=False)) as base:
        ok = httpx.post(base + "/retrieve", json={"queries": ["walrus weight", "Rhine barges"], "topk": 2,
                                                  "source": "rivers"})
        bad = httpx.post(base + "/retrieve", json={"queries": ["walrus"], "source": "lakes"})
    assert ok.status_code == 200
    assert {d["id"].split(":")[0] for hits in ok.json()["result"] for d in hits} == {"rivers"}
    assert ok.json()["result"][1][0]["title"] == "Rhine"
    assert bad.status_code == 422 and "unknown source 'lakes'" in bad.json()["error"]["message"]


def test_two_sources_of_one_name_are_refused(indexes, cli):
    config = RetrievalConfig(sources=(SourceConfig("sea", indexes["sea"]), SourceConfig("sea", indexes["rivers"])))
    with pytest.raises(InputError, match="two sources are named 'sea'"):
        build_retriever(config)
    run = cli("ask", "q?", "--index", f"sea={indexes['sea']}", "--retriever", "sea=http://127.0.0.1:9/retrieve")
    assert run.returncode != 0 and run.stderr.strip().splitlines()[-1].endswith(
        "two sources are named 'sea': give each source a name of its own")
    mixed = cli("ask", "q?", "--index", indexes["sea"], "--index", f"rivers={indexes['rivers']}")
    assert mixed.returncode != 0 and "with several sources, name each one" in mixed.stderr
    both = cli("ask", "q?", "--corpus", "data/demo/corpus.jsonl", "--index", f"sea={indexes['sea']}")
    assert both.returncode != 0 and "--corpus and --index both name where passages come from" in both.stderr


def test_the_command_line_names_several_sources(indexes):
    from rigkit.cli import build_parser
    from rigkit.cli.serve import _config

    args = build_parser().parse_args(["serve", "--index", f"sea={indexes['sea']}", "--index",
                                      f"licences={indexes['licences']}", "--retriever",
                                      "rivers=http://127.0.0.1:8100/retrieve?x=1"])
    assert _config(args).retrieval.sources == (
        SourceConfig("sea", indexes["sea"]), SourceConfig("licences", indexes["licences"]),
        SourceConfig("rivers", "http://127.0.0.1:8100/retrieve?x=1"))
    one = build_parser().parse_args(["serve", "--retriever", "http://127.0.0.1:8100/retrieve?a=b"])
    assert _config(one).retrieval.index == "http://127.0.0.1:8100/retrieve?a=b" and not _config(one).retrieval.sources


def test_the_report_breaks_retrievals_down_by_source(indexes, routed, tmp_path):
    from rigkit.eval.experiment import evaluate
    from rigkit.eval.runner import read_results
    from tests.test_serve_protocol import LoopingScript

    qa = tmp_path / "qa.jsonl"
    write_jsonl(qa, [{"dataset": "toy", "id": f"q{i}", "question": q, "answer": a, "answer_aliases": [],
                      "type": "bridge", "supporting_titles": [], "paragraphs": []}
                     for i, (q, a) in enumerate([("What is a narwhal's tusk?", "a tooth"),
                                                 ("Which licence needs a NOTICE file?", "Apache")])])
    config = RunConfig(retrieval=sources_config(indexes, "http://127.0.0.1:9/retrieve"))
    evaluate(qa, tmp_path / "run", "rag", config=config, generator=LoopingScript(["It is known."]),
             retriever=routed, faithfulness=False, progress=False)
    rows = read_results(tmp_path / "run")
    added = [c.split(":")[0] for r in rows for c in r["summary"]["upfront"]]
    report = (tmp_path / "run" / "report.md").read_text()
    section = report.split("## Retrievals by source")[1].split("\n## ")[0]
    lines = {cells[2]: cells[3:6] for line in section.splitlines()
             if (cells := [c.strip() for c in line.split("|")]) and len(cells) > 5 and cells[1] == "rag"}
    assert set(lines) == {"licences", "sea", "rivers"}
    for name, (hits, in_context, share) in lines.items():
        assert hits == in_context and float(in_context) == pytest.approx(added.count(name) / 2, abs=0.005)
        assert share == f"{added.count(name) / len(added):.0%}"
    assert lines["sea"][1] != "0.00"  # the narwhal question went to the sea animals by the rule
