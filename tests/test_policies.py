"""Continue / regenerate policies, passages read after an end of turn, visible retrieval errors."""

from __future__ import annotations

import pytest

from rigkit.config import ContextConfig, ControllerConfig, GeneratorConfig, QueryConfig
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.deciders import (
    DECIDERS,
    AlwaysRetrieve,
    CompositeDecider,
    EntityChecklist,
    MarkerDecider,
    ProbabilityDecider,
    decider_policy,
)
from rigkit.errors import InputError
from rigkit.queries import build_query_builder
from rigkit.testing import DictRetriever, ScriptedGenerator, make_segment
from rigkit.trace import Hit

DEMO_QUESTION = ("Can I use code under the Apache-2.0 licence in a commercial product, "
                 "and what must I include when I ship it?")
APACHE = Hit("apache#0", "apache", "Apache License 2.0", "Apache-2.0 allows commercial use.", 1.0)
NOTICE = Hit("notice#0", "notice", "NOTICE files", "You must ship the licence text and NOTICE file.", 1.0)
SENTENCES = ["Yes, Apache-2.0 allows commercial use.", " You must include the licence text.",
             " You must also ship the NOTICE file.", " That is all."]


def controller(generator, decider, retriever=None, max_rounds=3, policy="auto", markers=False):
    context = ContextManager(ContextConfig(layout="append"), generator.count_tokens, generator.render_chat, use_markers=markers)
    return RIGController(
        generator, retriever or DictRetriever({"notice": [NOTICE]}, default=[APACHE, NOTICE]),
        decider, build_query_builder(QueryConfig(mode="masked"), generator), context,
        config=ControllerConfig(max_rounds=max_rounds, policy=policy),
        generation=GeneratorConfig(max_answer_tokens=200),
    )


class Rotating:
    """A new hit per search, so every retrieval injects something."""

    def __init__(self):
        self.queries = []

    def search(self, query, top_k=5):
        self.queries.append(query)
        n = len(self.queries)
        return [Hit(f"p{n}", f"d{n}", f"T{n}", f"passage {n} about licences", 1.0)]


def test_default_policies_are_the_published_ones():
    want = {"always": "continue", "every_n": "continue", "marker": "continue",
            "prob": "regenerate", "entropy": "regenerate", "keyword": "regenerate",
            "classifier": "regenerate"}
    assert {name: DECIDERS[name].policy for name in want} == want
    # composite: continue when any member continues; the checklist follows what it wraps
    assert CompositeDecider([ProbabilityDecider(), MarkerDecider()]).policy == "continue"
    assert CompositeDecider([ProbabilityDecider()]).policy == "regenerate"
    assert EntityChecklist(ProbabilityDecider()).policy == "regenerate"
    assert EntityChecklist().policy == "continue"


def test_always_retrieves_after_three_different_sentences_on_the_demo_question():
    retriever = Rotating()
    result = controller(ScriptedGenerator(SENTENCES), AlwaysRetrieve(), retriever, max_rounds=3).run(DEMO_QUESTION)
    fired = [r for r in result.rounds if r.query is not None]
    assert len(fired) == 3 and result.used_retrieval_times == 3
    assert len({r.segment.text for r in fired}) == 3  # three different sentences, not one rewritten
    assert [r.action for r in fired] == ["continue"] * 3
    for sentence in SENTENCES:  # each kept in the answer, in order
        assert sentence.strip() in result.answer
    assert result.policy == "continue"


def test_policy_is_overridable_per_run_and_recorded():
    result = controller(ScriptedGenerator(SENTENCES), AlwaysRetrieve(), Rotating(), policy="regenerate").run("Q?")
    assert result.policy == "regenerate" and result.rounds[0].action == "regenerate"
    assert SENTENCES[0].strip() not in result.answer  # the flagged sentence was written again
    with pytest.raises(InputError, match="controller.policy"):
        controller(ScriptedGenerator(["x"]), AlwaysRetrieve(), policy="sometimes")


def test_a_decider_declaring_an_unknown_policy_is_refused():
    class Odd(AlwaysRetrieve):
        policy = "maybe"

    with pytest.raises(InputError, match="maybe"):
        decider_policy(Odd())


def test_passages_injected_after_an_end_of_turn_are_read():
    marker = make_segment("See <retrieve>Apache NOTICE rules</retrieve>", finish_reason="end_of_turn")
    gen = ScriptedGenerator([marker, " You must ship the NOTICE file."])
    result = controller(gen, MarkerDecider(), markers=True).run(DEMO_QUESTION)
    assert result.rounds[0].action == "continue" and result.rounds[0].injection.added
    assert len(gen.prompts) == 2  # the model was asked to go on after the passages
    assert any(p.role == "passages" for p in gen.prompts[1])
    assert "NOTICE file" in result.answer


def test_a_continue_round_that_ended_the_turn_continues_once_more():
    last = make_segment("Yes, Apache-2.0 allows it.", finish_reason="end_of_turn")
    gen = ScriptedGenerator([last, make_segment("", finish_reason="end_of_turn")])
    result = controller(gen, AlwaysRetrieve(), Rotating()).run(DEMO_QUESTION)
    assert len(gen.prompts) == 2 and len(result.rounds) == 2
    assert result.rounds[1].action == "accept"  # the empty turn ends it: once more, not forever


def test_no_retrieval_when_no_answer_tokens_are_left_to_read_it():
    retriever = Rotating()
    ctl = controller(ScriptedGenerator(SENTENCES), AlwaysRetrieve(), retriever)
    ctl.generation = GeneratorConfig(max_answer_tokens=12)  # the second sentence spends the rest
    result = ctl.run(DEMO_QUESTION)
    assert [len(r.segment.token_ids) for r in result.rounds] == [5, 7]
    assert [r.action for r in result.rounds] == ["continue", "skip"]
    assert len(retriever.queries) == 1 and result.used_retrieval_times == 1
    assert not result.low_confidence  # retrieval rounds were left; answer tokens were not


class Broken:
    def search(self, query, top_k=5):
        raise RuntimeError("index offline")


def test_a_failed_retrieval_is_visible_and_not_counted():
    gen = ScriptedGenerator(SENTENCES)
    result = controller(gen, AlwaysRetrieve(), Broken(), max_rounds=2).run("Q?")
    assert result.used_retrieval_times == 0  # nothing was retrieved
    assert len(result.errors) == 4 and result.errors[0] == "round 0: RuntimeError: index offline"
    assert all(r.error and r.action == "accept" for r in result.rounds)
    assert not result.low_confidence  # no round was spent
    assert result.answer.startswith(SENTENCES[0])


def test_one_failed_round_among_good_ones():
    class Flaky(Rotating):
        def search(self, query, top_k=5):
            if not self.queries:
                self.queries.append(query)
                raise TimeoutError("slow index")
            return super().search(query, top_k)

    result = controller(ScriptedGenerator(SENTENCES), AlwaysRetrieve(), Flaky(), max_rounds=3).run("Q?")
    assert result.errors == ["round 0: TimeoutError: slow index"]
    assert result.used_retrieval_times == 3  # the failure spent no round


def test_failed_retrievals_reach_the_eval_row_the_report_and_rigkit_ask():
    from rigkit.cli.ask import format_result
    from rigkit.eval.aggregate import aggregate
    from rigkit.eval.report import markdown_report
    from rigkit.eval.runner import summarize_result

    failed = controller(ScriptedGenerator(SENTENCES[:2]), AlwaysRetrieve(), Broken()).run("Q?")
    good = controller(ScriptedGenerator(SENTENCES[:2]), AlwaysRetrieve(), Rotating()).run("Q?")
    assert "every retrieval failed" in format_result(failed) and "index offline" in format_result(failed)
    assert "errors" not in format_result(good)
    rows = []
    for i, result in enumerate([failed, good]):
        summary = summarize_result(result)
        row = {"id": f"q{i}", "type": "", "system": "rig:always", "run": 0, "em": float(i),
               "latency": 1.0, "timings": {}, "error": None, "summary": summary}
        rows.append(row)
    assert rows[0]["summary"]["retrieval_failed"] and rows[0]["summary"]["retrieval_errors"] == failed.errors
    assert not rows[1]["summary"]["retrieval_failed"] and rows[1]["summary"]["policy"] == "continue"
    # rows keep these in their summary (as runs written before they were lifted to the top
    # level) or at the top level (as the runner writes them now): counted the same
    lifted = [{**row, **{k: row["summary"][k] for k in ("policy", "retrieval_errors", "retrieval_failed")}}
              for row in rows]
    for shaped in (rows, lifted):
        group = next(g for g in aggregate(shaped) if g.type == "all")
        assert group.retrieval_error_rounds == 2 and group.retrieval_failed == 1
        assert group.policies == ["continue"]
    assert group.mean["em"] == 1.0  # the answer without any retrieval is not a RIG answer
    text = markdown_report({"split": "all"}, rows)
    assert "Rounds with retrieval errors" in text and "every retrieval failed" in text


def test_pause_at_flag_gives_the_stop_rule_the_deciders_pause():
    from rigkit.deciders.probability import ProbabilityDecider

    decider = ProbabilityDecider(0.3)
    off = controller(ScriptedGenerator(["A."]), decider)
    assert off.stop.early is None
    on = controller(ScriptedGenerator(["A."]), decider)
    on = RIGController(on.generator, on.retriever, decider, on.query_builder, on.context,
                       config=ControllerConfig(pause_at_flag=True))
    assert on.stop.early == decider.pause_at and on.stop.sentence
