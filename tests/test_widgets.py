"""Widget panes and widgets on a replayed RIGResult built by hand (no model, no kernel)."""

from __future__ import annotations

import html
import re

import pytest

from rigkit.testing import make_segment
from rigkit.trace import (
    Decision,
    Hit,
    Injection,
    Query,
    RIGResult,
    RoundTrace,
    Segment,
    Span,
    TokenBudget,
)
from rigkit.widgets import figures, render, summary

QUESTION = "Can I use Apache-2.0 code commercially, and what must I ship with it?"


def _hit(cid: str, title: str, bm25: int | None, dense: int | None, score: float) -> Hit:
    ranks = {k: v for k, v in (("bm25", bm25), ("dense", dense)) if v is not None}
    return Hit(chunk_id=cid, doc_id=cid.split("#")[0], title=title, text=f"{title} says: text.",
               score=score, ranks={**ranks, "hybrid": 1}, scores={"bm25": 7.25, "dense": 0.61})


def make_result() -> RIGResult:
    seg0 = make_segment(
        "Yes, <retrieve>Apache licence commercial use</retrieve> it allows that.",
        probs=[0.95, 0.5, 0.6, 0.7, 0.9, 0.8, 0.99, 0.97],
    )
    seg1 = make_segment("You must include the NOTICE file.", probs=[0.9, 0.9, 0.9, 0.9, 0.2, 0.5])
    seg1b = make_segment("You must include the LICENSE and NOTICE files.")
    seg2 = make_segment("That is all.", finish_reason="end_of_turn")
    h_apache = _hit("apache#0", "Apache License 2.0", 1, 2, 0.032)
    h_dup = _hit("apache#1", "Apache License FAQ", 2, None, 0.016)
    h_notice = _hit("notice#0", "NOTICE files", 1, 1, 0.033)
    h_old = _hit("gpl#0", "GNU GPL", None, 3, 0.010)
    rounds = [
        RoundTrace(
            index=0, segment=seg0, action="continue", draft="Yes, it allows that.",
            decision=Decision(True, 1.0, "model wrote a retrieval marker", decider="marker",
                              threshold=0.5, unit="score", score_threshold=0.5, intents=["Apache licence commercial use"],
                              spans=[Span(1, 5, "Apache licence commercial use", 1.0)]),
            query=Query("Apache licence commercial use", "marker", intent="commercial use?"),
            hits=[h_apache, h_dup],
            injection=Injection(added=["apache#0"], dropped_duplicates=["apache#1"],
                                tokens_added=120),
            budget=TokenBudget(system=40, question=20, passages=120, draft=10, limit=1024,
                               max_retrieval_tokens=512),
            tokens_prefilled=70, tokens_reused=0, timings={"generate": 0.5, "retrieve": 0.02},
            retrieval_round=1,
        ),
        RoundTrace(
            index=1, segment=seg1, action="regenerate", draft="Yes, it allows that.",
            decision=Decision(True, 0.8, "token 'NOTICE' p=0.20 < 0.40", decider="prob",
                              threshold=0.4, unit="probability", score_threshold=0.6, spans=[Span(4, 5, "NOTICE", 0.8)],
                              evidence={"min_prob": 0.2}),
            query=Query("Apache What must ship NOTICE file", "rewrite", intent="NOTICE file",
                        llm_calls=1, fallback_from="marker"),
            hits=[h_notice, h_old],
            injection=Injection(added=["notice#0"], dropped_budget=["gpl#0"],
                                evicted=["apache#1-old"], tokens_added=90),
            budget=TokenBudget(system=40, question=20, passages=210, draft=16, limit=1024,
                               max_retrieval_tokens=512),
            tokens_prefilled=150, tokens_reused=80, timings={"generate": 0.4, "decide": 0.01},
            retrieval_round=2,
        ),
        RoundTrace(
            index=2, segment=seg1b, action="accept",
            draft="Yes, it allows that. You must include the LICENSE and NOTICE files.",
            decision=Decision(False, 0.1, "all tokens confident", decider="prob", threshold=0.4,
                              unit="probability", score_threshold=0.6),
            budget=TokenBudget(system=40, question=20, passages=210, draft=26, limit=1024),
            tokens_prefilled=30, tokens_reused=230, retrieval_round=2,
        ),
        RoundTrace(
            index=3, segment=seg2, action="accept",
            draft="Yes, it allows that. You must include the LICENSE and NOTICE files. That is all.",
            decision=Decision(False, 0.05, "all tokens confident", decider="prob", threshold=0.4,
                              unit="probability", score_threshold=0.6),
            budget=TokenBudget(system=40, question=20, passages=210, draft=30, limit=1024),
            retrieval_round=2,
        ),
    ]
    return RIGResult(question=QUESTION, answer=rounds[-1].draft, rounds=rounds,
                     used_retrieval_times=2, citations=["apache#0", "notice#0"],
                     tokens={"prompt": 300, "generated": 30, "prefilled": 250, "reused": 310})


@pytest.fixture
def result() -> RIGResult:
    return make_result()


# ------------------------------------------------------------------------------------- panes
def test_draft_highlights_marker_tokens_and_shades_by_probability(result):
    out = render.draft_html(result.rounds, 0)
    marked = re.findall(r'class="rig-token rig-marker[^"]*"[^>]*>([^<]*)</span>', out)
    assert "".join(marked).strip() == "&lt;retrieve&gt;Apache licence commercial use&lt;/retrieve&gt;"
    # the first token is outside the marker, and its hover title gives p and entropy
    assert re.search(r'class="rig-token"[^>]*title="p=0\.950 · entropy=0\.05 nats[^"]*">Yes,<', out)
    # lower probability -> stronger shade; marker tokens carry their box only (one marking each)
    alphas = [float(a) for a in re.findall(r"rgba\(239,68,68,([0-9.]+)\)", out)]
    assert len(alphas) == 4  # Yes, · it · allows · that.
    assert alphas[0] < alphas[1] and alphas[1] == pytest.approx(0.2 * 0.85, abs=0.01)


def test_draft_underlines_triggering_span_and_keeps_earlier_rounds(result):
    out = render.draft_html(result.rounds, 1)
    spans = re.findall(r'class="rig-token rig-span"[^>]*title="p=0\.200[^"]*">([^<]*)<', out)
    assert spans == [" NOTICE"]
    assert "Yes," in out  # round 0's segment is part of the draft so far
    assert 'rig-current rig-discarded' in out  # round 1 is regenerated after retrieval


def _shown_text(out: str) -> str:
    return html.unescape("".join(re.findall(r'class="rig-token[^"]*"[^>]*>([^<]*)<', out)))


def test_draft_leaves_out_discarded_segments_of_earlier_rounds(result):
    out = render.draft_html(result.rounds, 2)
    assert _shown_text(out) == (
        "Yes, <retrieve>Apache licence commercial use</retrieve> it allows that."
        "You must include the LICENSE and NOTICE files."
    )
    assert "rig-discarded" not in out


def test_draft_escapes_html_and_handles_misaligned_tokens():
    seg = Segment(text="a <b>x</b> <retrieve>who wrote it</retrieve>", tokens=["zz"],
                  logprobs=[0.0])
    out = render.draft_html([RoundTrace(0, seg, Decision(True, 1, "m"))], 0)
    assert "<b>x</b>" not in out and "&lt;b&gt;x&lt;/b&gt;" in out
    assert 'class="rig-marker"' in out and "who wrote it" in out
    assert render.draft_html([], 0).count("No rounds yet") == 1


def test_decision_pane(result):
    out = render.decision_html(result.rounds[1].decision)
    for expected in ("prob", "0.800", "0.400", "token &#x27;NOTICE&#x27; p=0.20 &lt; 0.40",
                     '<q class="rig-trigger">NOTICE</q>', "min_prob", ">retrieve<"):
        assert expected in out, expected
    assert "retrieves above score 0.60" in out  # prob: score = 1 - p, cut = 1 - θ
    quiet = render.decision_html(result.rounds[2].decision)
    assert "no retrieval" in quiet and "rig-trigger" not in quiet


def test_query_pane(result):
    out = render.query_html(result.rounds[1].query)
    for expected in ("Apache What must ship NOTICE file", "NOTICE file", "<code>rewrite</code>",
                     "fell back from <code>marker</code>", "1 LLM call<"):
        assert expected in out, expected
    assert "No retrieval this round" in render.query_html(None)
    assert "timeout" in render.query_html(None, error="timeout")


def test_hits_pane_titles_ranks_and_status(result):
    r0, r1 = result.rounds[0], result.rounds[1]
    out0 = render.hits_html(r0.hits, r0.injection)
    assert re.findall(r'class="rig-hit-title">([^<]*)<', out0) == ["Apache License 2.0",
                                                                    "Apache License FAQ"]
    assert re.findall(r'class="rig-status rig-status-([a-z-]+)"', out0) == ["injected", "duplicate"]
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", out0)
    assert headers[2:5] == ["bm25", "dense", "hybrid"]
    dense_ranks = re.findall(r'data-retriever="dense">([^<]*)<', out0)
    assert dense_ranks == ["#2", "–"]
    assert "7.250" in out0 and "120 passage tokens added" in out0
    out1 = render.hits_html(r1.hits, r1.injection)
    assert re.findall(r'rig-status-([a-z-]+)"', out1) == ["injected", "over-budget"]
    assert "evicted from context: apache#1-old" in out1
    assert render.hit_status("x", Injection(added=["x"], evicted=["x"])) == "evicted"
    assert "No hits" in render.hits_html([], None)


def test_budget_and_timings(result):
    r1 = result.rounds[1]
    fig = figures.budget_figure(r1)
    values = {t.name: t.x[0] for t in fig.data}
    assert values == {"system": 40, "question": 20, "passages": 210, "draft": 16,
                      "free": 1024 - 286, "pre-filled": 150, "cached": 80}
    assert fig.layout.barmode == "stack" and fig.layout.shapes[0].x0 == 1024
    text = summary.budget_html(r1)
    assert "150 pre-filled" in text and "80 from the KV cache" in text and "(35% cached)" in text
    timings = summary.timings_html(r1.timings)
    assert "generate" in timings and "400 ms" in timings and "410 ms" in timings
    assert "No timings" in summary.timings_html({})


def test_a_chat_servers_round_shows_how_it_continued_and_its_reasoning(result):
    import copy

    r1 = copy.deepcopy(result.rounds[1])
    assert "continued" not in summary.budget_html(r1)  # in-process: nothing to say
    r1.segment.continuation, r1.segment.reasoning = "new_turn", "The user asks <b>this</b>."
    text = summary.budget_html(r1)
    assert "continued: new turn" in text and "reasoning (not in the answer)" in text
    assert "&lt;b&gt;this&lt;/b&gt;" in text  # the model's text is escaped


def test_header_and_answer(result):
    head = summary.round_header_html(QUESTION, 1, 4, True, result.rounds)
    assert "Round 2 of 4<" in head and "regenerate" in head and "Apache-2.0" in head
    assert "so far" in summary.round_header_html(QUESTION, 0, 1, finished=False)
    ans = summary.answer_html(result)
    assert "LICENSE and NOTICE files" in ans and "2 retrievals" in ans and "notice#0" in ans
    assert "not finished" in summary.answer_html(None)


def test_panes_are_pure_functions_of_the_saved_trace(result):
    again = RIGResult.from_json(result.to_json())
    for a, b in zip(result.rounds, again.rounds, strict=True):
        assert render.decision_html(a.decision) == render.decision_html(b.decision)
        assert render.hits_html(a.hits, a.injection) == render.hits_html(b.hits, b.injection)
    assert render.draft_html(result.rounds, 3) == render.draft_html(again.rounds, 3)


def _declared(name, threshold):
    """A decision of the real decider `name`, which records its own cut on the score scale."""
    from rigkit.build import build_decider
    from rigkit.config import DeciderConfig
    from rigkit.deciders import DecisionState

    key = "n" if name == "every_n" else "threshold"
    params = {"use_attention": False} if name == "entropy" else {}
    decider = build_decider(DeciderConfig(name=name, params={key: threshold, **params}))
    return decider.decide(make_segment("Paris was founded in 1932."), DecisionState("q"))


@pytest.mark.parametrize(
    ("decider", "threshold", "evidence", "cut"),
    [("prob", 0.3, {}, 0.7), ("entropy", 2.0, {}, 0.8647), ("keyword", 0.5, {}, 0.5),
     ("every_n", 32, {}, 1.0), ("mine", 7.0, {}, None), ("mine", 7.0, {"score_threshold": 0.2}, 0.2),
     ("always", None, {}, None)],
)
def test_score_cut_puts_thresholds_on_the_score_scale(decider, threshold, evidence, cut):
    if decider in ("prob", "entropy", "keyword", "every_n"):
        decision = _declared(decider, threshold)
        assert decision.unit  # the decider says what its threshold measures
    else:
        decision = Decision(False, 0.0, "", decider=decider, threshold=threshold, evidence=evidence)
    got = figures.score_cut(decision)
    assert got == (pytest.approx(cut, abs=1e-4) if cut is not None else None)


def test_score_cut_reads_the_decision_not_the_decider_name():
    # a decider called "prob" that declares another cut is shown with its own cut
    renamed = Decision(False, 0.0, "", decider="prob", threshold=0.3, unit="score", score_threshold=0.3)
    assert figures.score_cut(renamed) == pytest.approx(0.3)
    assert "probability" in render.decision_html(_declared("prob", 0.3))


def test_decider_figures(result):
    scores = figures.scores_from_results({"prob": result})
    assert scores == {"prob": [1.0, 0.8, 0.1, 0.05]}
    fig = figures.decider_figure({"prob": [0.2, 0.9], "entropy": [0.5, 0.1]},
                                 {"prob": 0.4, "entropy": None})
    assert [t.name for t in fig.data] == ["prob", "entropy"]
    assert [s.y0 for s in fig.layout.shapes] == [0.4]
    assert figures.retrieval_counts([0.2, 0.9, 0.5], [0.0, 0.5, 0.95]) == [3, 2, 0]
    sweep = figures.threshold_sweep_figure({"prob": [0.2, 0.9]}, [0.1, 0.5, 1.0])
    assert list(sweep.data[0].y) == [2, 1, 0]


# ----------------------------------------------------------------------------------- widgets
def test_round_stepper_replay_navigation(result):
    from rigkit.widgets import RoundStepper

    stepper = RoundStepper(result)
    assert "Round 1 of 4<" in stepper.header.value and "rig-marker" in stepper.draft_pane.value
    assert stepper.slider.max == 4 and stepper.prev_button.disabled
    stepper.next_button.click()
    assert stepper.index == 1 and "Round 2 of 4<" in stepper.header.value
    assert "Apache What must ship NOTICE file" in stepper.query_pane.value
    assert "NOTICE files" in stepper.hits_pane.value
    assert stepper.budget_plot.data[2].x == (210,)
    assert stepper.decider_picker.value == "prob" and stepper.threshold_picker.value == "0.4"
    stepper.slider.value = 4
    assert "Round 4 of 4<" in stepper.header.value and stepper.next_button.disabled
    assert "No retrieval this round" in stepper.query_pane.value
    stepper.prev_button.click()
    assert stepper.index == 2
    assert "LICENSE and NOTICE files" in stepper.answer_pane.value
    assert stepper.rerun_button.disabled and "replay" in stepper.status.value


def test_round_stepper_lecture_mode(result):
    import ipywidgets as W

    from rigkit.widgets import RoundStepper

    result.rounds[0].query.intent = "Apache licence commercial use"  # the decider's intent, as a marker's is
    stepper = RoundStepper(result, lecture=True)
    assert "rigkit-lecture" in stepper._dom_classes
    # the intent is shown once, in the query pane, not again under the decision
    assert "intents" not in stepper.decision_pane.value
    assert "Apache licence commercial use" in stepper.query_pane.value
    assert "max(18px, 1em)" in stepper.children[0].value  # every pane's text at 18 px or more
    folded = [c for c in stepper.children if isinstance(c, W.Accordion)]
    assert len(folded) == 1 and folded[0].selected_index is None  # budget and timings folded away
    stepper.show(1)
    assert '<details class="rig-evidence">' in stepper.decision_pane.value
    assert "rigkit-lecture" not in RoundStepper(result)._dom_classes


def test_round_stepper_switches_lecture_mode_on_and_off(result):
    import ipywidgets as W

    from rigkit.widgets import RoundStepper

    stepper = RoundStepper(result)
    plain = list(stepper.children)
    assert not stepper.lecture_switch.value and not any(isinstance(c, W.Accordion) for c in plain)
    stepper.lecture_switch.value = True  # the "lecture" button
    assert stepper.lecture and "rigkit-lecture" in stepper._dom_classes
    assert "max(18px, 1em)" in stepper.children[0].value
    folded = [c for c in stepper.children if isinstance(c, W.Accordion)]
    assert len(folded) == 1 and folded[0].children[0] in plain  # the same budget panes, folded
    stepper.set_lecture(False)
    assert not stepper.lecture_switch.value and "rigkit-lecture" not in stepper._dom_classes
    assert list(stepper.children) == plain
    assert RoundStepper(result, lecture=True).lecture_switch.value


class FakeController:
    """Streams a saved result's rounds one by one, like RIGController.stream."""

    def __init__(self, result: RIGResult, fail_at: int | None = None):
        self.saved, self.fail_at = result, fail_at
        self.pulled = 0
        self.last_result: RIGResult | None = None

    def stream(self, question):
        for trace in self.saved.rounds:
            if self.pulled == self.fail_at:
                raise RuntimeError("retriever down")
            self.pulled += 1
            yield trace
        self.last_result = self.saved


def test_round_stepper_live_pulls_one_round_per_next(result):
    from rigkit.widgets import RoundStepper

    controller = FakeController(result)
    stepper = RoundStepper.live(controller, QUESTION)
    assert controller.pulled == 1 and "Round 1 of 1 so far" in stepper.header.value
    assert "not finished" in stepper.answer_pane.value
    stepper.next()
    assert controller.pulled == 2 and "Round 2 of 2 so far" in stepper.header.value
    stepper.show(0)
    stepper.next()
    assert controller.pulled == 2  # stepping back and forth replays, it does not run
    assert stepper.run_to_end() is result and stepper.finished
    assert stepper.index == 1 and "Round 2 of 4<" in stepper.header.value
    assert "LICENSE and NOTICE files" in stepper.answer_pane.value


def test_round_stepper_live_error_is_shown(result):
    from rigkit.widgets import RoundStepper

    stepper = RoundStepper.live(FakeController(result, fail_at=1), QUESTION)
    stepper.next()
    assert "retriever down" in stepper.status.value and stepper.finished
    assert stepper.index == 0 and stepper.next_button.disabled


def test_round_stepper_rerun_uses_factory(result):
    from rigkit.widgets import RoundStepper

    calls = []

    def factory(name, threshold):
        calls.append((name, threshold))
        return FakeController(result)

    stepper = RoundStepper.live(FakeController(result), QUESTION, factory=factory,
                                deciders=["prob", "entropy"])
    stepper.run_to_end()
    stepper.show(3)
    stepper.decider_picker.value = "entropy"
    stepper.threshold_picker.value = "0.7"
    stepper.rerun_button.click()
    assert calls == [("entropy", 0.7)]
    stepper.threshold_picker.value = "high"
    stepper.rerun()
    assert len(calls) == 1 and "threshold must be a number" in stepper.status.value
    assert len(stepper.rounds) == 1 and stepper.index == 0 and not stepper.finished


def test_decider_comparison_and_retrieval_inspector(result):
    from rigkit.testing import DictRetriever
    from rigkit.widgets import DeciderComparison, RetrievalInspector

    other = make_result()
    for r in other.rounds:
        r.decision.score, r.decision.threshold, r.decision.score_threshold = 0.3, 0.6, 0.6
    comp = DeciderComparison.from_results({"prob": result, "entropy": other})
    assert [t.name for t in comp.score_plot.data] == ["prob", "entropy"]
    # the threshold of a run is the first one its decisions recorded (marker: 0.5)
    assert sorted(s.y0 for s in comp.score_plot.layout.shapes) == [0.5, 0.6]
    assert comp.sweep_plot is not None and len(comp.sweep_plot.data) == 2
    from rigkit.deciders import compare_deciders
    from rigkit.testing import AlwaysDecider, NeverDecider

    rows = compare_deciders(result, {"always": AlwaysDecider(), "never": NeverDecider()})
    comp2 = DeciderComparison.from_comparison(rows, sweep=False)
    assert comp2.scores == {"always": [1.0] * 4, "never": [0.0] * 4}
    assert comp2.segments[1] == "You must include the NOTICE file." and comp2.sweep_plot is None

    hits = result.rounds[0].hits
    inspector = RetrievalInspector(
        {"bm25": DictRetriever({"apache": hits}), "dense": DictRetriever({}, default=hits[::-1])}
    )
    rankings = inspector.search("apache licence")
    assert [h.title for h in rankings["dense"]] == ["Apache License FAQ", "Apache License 2.0"]
    assert inspector.query_box.value == "apache licence"
    assert 'data-retriever="bm25"' in inspector.results.value
    assert "Apache License FAQ" in inspector.results.value


def test_summary_tables(result):
    closed = RIGResult(question=QUESTION, answer="No <idea>.", tokens={"generated": 5},
                       timings={"total": 1.25})
    table = summary.results_html({"closed-book": closed, "RIG": result})
    cells = re.findall(r'<tr class="rig-results-row">(.*?)</tr>', table)
    assert len(cells) == 2 and "No &lt;idea&gt;." in cells[0] and "1.2" in cells[0]
    assert re.findall(r"<td[^>]*>(\d+)</td>", cells[1])[:5] == ["2", "4", "30", "250", "310"]
    recall = summary.recall_html({"bm25": {"recall@5": 0.5, "mrr": 0.7},
                                  "hybrid": {"recall@5": 0.6, "mrr": 0.65}})
    assert "<b>0.600</b>" in recall and "<b>0.700</b>" in recall and ">0.500<" in recall

    from rigkit.deciders import compare_deciders
    from rigkit.testing import AlwaysDecider, NeverDecider

    rows = compare_deciders(result, {"always": AlwaysDecider(), "never": NeverDecider()})
    html_rows = re.findall(r'<tr class="rig-comparison-row">(.*?)</tr>', summary.comparison_html(rows))
    assert len(html_rows) == 4 and html_rows[0].count(">retrieve<") == 1
    assert f'title="{html.escape(rows[0]["decisions"]["always"].reason)}"' in html_rows[0]


def test_round_stepper_shows_the_runs_policy_and_each_rounds_action(result):
    from rigkit.widgets import RoundStepper

    result.policy = "regenerate"
    stepper = RoundStepper(result)

    def shown(cls):
        return re.search(rf'class="{cls}"[^>]*>([^<]*)<', stepper.header.value).group(1)

    assert shown("rig-policy") == "regenerate" and shown("rig-action") == "continue"
    assert 'title="retrieved: the segment stays and the answer goes on after the passages"' in stepper.header.value
    stepper.next()
    assert shown("rig-policy") == "regenerate" and shown("rig-action") == "regenerate"
    assert "dropped and written again" in stepper.header.value
    stepper.show(3)
    assert shown("rig-action") == "accept"

    controller = FakeController(result)
    controller.policy = "continue"  # a live run: the controller's policy before any result exists
    live = RoundStepper.live(controller, QUESTION)
    assert 'class="rig-policy">continue<' in live.header.value and live.result is None
    result.policy = ""
    assert "rig-policy" not in summary.round_header_html(QUESTION, 0, 4, True, result.rounds)


def test_answer_pane_numbers_citations_and_hits_drop_the_repeated_fused_score(result):
    result.answer = "It allows that. [[citation:apache#0]] Ship the NOTICE file. [[citation:notice#0]]"
    result.passages = [_hit("apache#0", "Apache License 2.0", 1, 2, 0.032), _hit("notice#0", "NOTICE files", 1, 1, 0.033)]
    out = summary.answer_html(result)
    assert "[[citation:" not in out
    assert re.findall(r'<sup class="rig-cite"><a href="#(rig\d+-p\d)"', out) == [
        re.search(r'<li id="(rig\d+-p1)"', out).group(1), re.search(r'<li id="(rig\d+-p2)"', out).group(1)]
    table = render.hits_html(result.passages)
    assert "<th" in table and ">score<" not in table and ">fused<" not in table


def test_switching_decider_resets_the_threshold_to_its_default_in_its_unit(result):
    from rigkit.widgets import RoundStepper

    calls = []

    def factory(name, threshold):
        calls.append((name, threshold))
        return FakeController(result)

    stepper = RoundStepper.live(FakeController(result), QUESTION, factory=factory,
                                deciders=["prob", "entropy", "every_n"])
    stepper.run_to_end()
    stepper.show(1)
    assert stepper.decider_picker.value == "prob" and stepper.threshold_picker.value == "0.4"
    stepper.decider_picker.value = "entropy"  # 0.4 probability is no entropy threshold
    assert stepper.threshold_picker.value == "2" and stepper.threshold_picker.description == "threshold (nats)"
    stepper.rerun_button.click()
    assert calls == [("entropy", 2.0)]
    stepper.decider_picker.value = "every_n"
    assert stepper.threshold_picker.value == "32" and "tokens" in stepper.threshold_picker.description
