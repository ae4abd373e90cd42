"""The relevance cut: a search's runners-up that score far below its best are not injected mid-answer.

`context.cut_bm25_share` and `context.cut_dense_gap` judge each hit after the first by its raw scores
against the first's; cut hits are recorded in the round's injection (`dropped_relevance`), shown in
the widgets and the CLI round log, and never reach the model. Passages given up front are not cut.
"""

from __future__ import annotations

import pytest

from rigkit.build import build_run
from rigkit.config import ConfigError, ContextConfig, RunConfig, load_config
from rigkit.context import ContextManager
from rigkit.context.store import relevance_cut
from rigkit.testing import AlwaysDecider, DictRetriever, ScriptedGenerator
from rigkit.trace import Hit, RIGResult
from rigkit.widgets import render


def scored(cid: str, bm25: float | None = None, dense: float | None = None) -> Hit:
    scores = {k: v for k, v in (("bm25", bm25), ("dense", dense)) if v is not None}
    return Hit(chunk_id=f"{cid}#0", doc_id=cid, title=cid.title(), text=f"{cid} passage text about {cid}",
               score=0.03, scores=scores)


BEST = scored("best", bm25=20.0, dense=0.80)
CLOSE = scored("close", bm25=15.0, dense=0.70)  # 75% of the best's BM25, 0.10 below in cosine
LOW_BM25 = scored("lowbm", bm25=8.0, dense=0.78)  # 40%: far below on words
FAR_DENSE = scored("fardense", bm25=19.0, dense=0.45)  # close on words, 0.35 below in meaning


def ids(hits):
    return [h.chunk_id for h in hits]


def test_off_by_default_keeps_every_hit():
    assert ContextConfig().cut_bm25_share == 0.0 and ContextConfig().cut_dense_gap is None
    kept, cut = relevance_cut([BEST, CLOSE, LOW_BM25, FAR_DENSE])
    assert ids(kept) == ids([BEST, CLOSE, LOW_BM25, FAR_DENSE]) and cut == []


def test_each_signal_cuts_what_falls_far_below_the_first_hit():
    kept, cut = relevance_cut([BEST, CLOSE, LOW_BM25, FAR_DENSE], bm25_share=0.65)
    assert ids(kept) == ["best#0", "close#0", "fardense#0"] and cut == ["lowbm#0"]
    kept, cut = relevance_cut([BEST, CLOSE, LOW_BM25, FAR_DENSE], dense_gap=0.2)
    assert ids(kept) == ["best#0", "close#0", "lowbm#0"] and cut == ["fardense#0"]
    kept, cut = relevance_cut([BEST, CLOSE, LOW_BM25, FAR_DENSE], bm25_share=0.65, dense_gap=0.2)
    assert ids(kept) == ["best#0", "close#0"] and cut == ["lowbm#0", "fardense#0"]


def test_the_first_hit_always_stays_and_a_missing_score_is_not_judged():
    lone = scored("lone", bm25=0.1, dense=0.01)
    assert relevance_cut([lone], bm25_share=0.99, dense_gap=0.0) == ([lone], [])
    dense_only = scored("denseonly", dense=0.79)  # a dense-only hit: its BM25 is unknown, not low
    kept, cut = relevance_cut([BEST, dense_only], bm25_share=0.9, dense_gap=0.05)
    assert ids(kept) == ["best#0", "denseonly#0"] and cut == []
    no_scores = Hit(chunk_id="remote#0", doc_id="remote", title="", text="from a remote server", score=0.5)
    assert relevance_cut([no_scores, LOW_BM25], bm25_share=0.9, dense_gap=0.01)[1] == []


def test_bad_values_are_one_clear_line():
    with pytest.raises(ConfigError, match="cut_bm25_share"):
        load_config(None, context={"cut_bm25_share": -0.5})
    with pytest.raises(ConfigError, match="cut_dense_gap"):
        load_config(None, context={"cut_dense_gap": -1})


def context(**config) -> ContextManager:
    gen = ScriptedGenerator([])
    return ContextManager(ContextConfig(**config), gen.count_tokens, gen.render_chat)


def test_cut_hits_are_recorded_and_never_reach_the_model():
    ctx = context(cut_bm25_share=0.65, cut_dense_gap=0.2)
    ctx.start("Which one?")
    injection = ctx.inject([BEST, CLOSE, LOW_BM25, FAR_DENSE])
    assert injection.added == ["best#0", "close#0"]
    assert injection.dropped_relevance == ["lowbm#0", "fardense#0"]
    read = "".join(p.text for p in ctx.pieces())
    assert "best passage text" in read and "close passage text" in read
    assert "lowbm passage" not in read and "fardense passage" not in read
    assert {h.chunk_id for h in ctx.seen_passages} == {"best#0", "close#0"}  # a cut hit is not citable


def test_passages_given_up_front_are_never_cut():
    ctx = context(cut_bm25_share=0.99, cut_dense_gap=0.0)
    ctx.start("Which one?", passages=[BEST, LOW_BM25, FAR_DENSE])
    assert ctx.upfront.added == ["best#0", "lowbm#0", "fardense#0"] and not ctx.upfront.dropped_relevance


def test_a_loop_round_shows_the_cut_in_its_trace_widgets_and_round_log():
    from rigkit.cli.ask import format_round

    gen = ScriptedGenerator(["Something is unclear.", "Now it is clear."])
    config = RunConfig().override(controller={"max_rounds": 1}, retrieval={"top_k": 3},
                                  context={"cut_bm25_share": 0.65})
    run = build_run(config, gen, DictRetriever({}, default=[BEST, CLOSE, LOW_BM25]))
    run.controller.decider = AlwaysDecider()
    result = run.controller.run("Which one is it?")
    first = result.rounds[0]
    assert first.injection.added == ["best#0", "close#0"] and first.injection.dropped_relevance == ["lowbm#0"]
    assert RIGResult.from_json(result.to_json()).rounds[0].injection == first.injection
    assert render.hit_status("lowbm#0", first.injection) == "below the cut"
    assert "below the cut" in render.hits_html(first.hits, first.injection)
    assert "below the cut ['lowbm#0']" in format_round(first)


@pytest.mark.slow
def test_real_hybrid_scores_drive_the_cut(demo_retriever):
    """The demo index's own BM25 and cosine scores: what the cut keeps is exactly what the rule says."""
    hits = demo_retriever.search("What must a NOTICE file contain under Apache-2.0?", 5)
    assert all({"bm25", "dense"} <= set(h.scores) for h in hits[:1])
    kept, cut = relevance_cut(hits, bm25_share=0.65, dense_gap=0.2)
    best = hits[0].scores
    for hit in hits[1:]:
        far = (hit.scores.get("bm25") is not None and hit.scores["bm25"] < 0.65 * best["bm25"]) or (
            hit.scores.get("dense") is not None and best["dense"] - hit.scores["dense"] > 0.2)
        assert (hit.chunk_id in cut) == far
    assert ids(kept) + cut and set(ids(kept)) | set(cut) == set(ids(hits)) and kept[0] is hits[0]


def test_runner_ups_of_gold_searches_are_counted_by_kind():
    """`python -m rigkit.eval.cut` on two hand-made chains: each hop's runner-up, judged by the cut."""
    from rigkit.eval.cut import cut_counts, runner_ups
    from rigkit.eval.gold import GoldChain, GoldHop

    def hit(pid, bm25, dense):
        return Hit(chunk_id=f"{pid}#0", doc_id=pid, title=pid, text=pid, score=0.03,
                   scores={"bm25": bm25, "dense": dense})

    table = {"who directed": [hit("jaws", 20, .8), hit("spielberg", 16, .7)],  # the next hop's gold, close
             "where was": [hit("spielberg", 18, .8), hit("ohio-town", 6, .5)],  # far below: cut
             "which river": [hit("nile", 10, .9), hit("nile-delta", 9, .85)]}  # the hop's own gold at rank 2
    retriever = DictRetriever({k: v for k, v in table.items()})
    chains = [
        GoldChain("q1", "Where was the director of Jaws born?", "2hop",
                  [GoldHop("jaws", "Jaws", "who directed Jaws"), GoldHop("spielberg", "Spielberg", "where was he born")],
                  [{"pid": "jaws"}, {"pid": "spielberg"}]),
        GoldChain("q2", "Which river?", "1hop", [GoldHop("nile-delta", "Delta", "which river")], [{"pid": "nile-delta"}]),
    ]
    rows = runner_ups(chains, retriever)
    # q1's second hop is not searched: its paragraph came as the first search's runner-up
    assert [(r.second.doc_id, r.hop_gold, r.gold) for r in rows] == [("spielberg", False, True),
                                                                      ("nile-delta", True, True)]
    assert cut_counts(rows, 0.0, None) == {"hop_gold": 1, "gold": 2, "other": 0}
    assert cut_counts(rows, 0.95, None) == {"hop_gold": 0, "gold": 0, "other": 0}  # 16/20 and 9/10 < .95
    assert cut_counts(rows, 0.65, 0.2) == {"hop_gold": 1, "gold": 2, "other": 0}
