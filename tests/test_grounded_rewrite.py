"""`controller.rewrite_unsupported`: a kept segment that check_support flags is written once more
under the strict grounding prompt; the rewrite stays only if it is supported (scripted parts)."""

from __future__ import annotations

from rigkit.cli.ask import format_round
from rigkit.config import ContextConfig
from rigkit.context import ContextManager
from rigkit.eval.metrics import QAItem, score_result
from rigkit.eval.report import report_tables
from rigkit.prompts import GROUNDING_INSTRUCTION
from rigkit.run_state import RunState
from rigkit.testing import AlwaysDecider, NeverDecider, ScriptedGenerator, make_segment
from rigkit.text import strip_citations
from rigkit.trace import Action, RIGResult, SearchRequest
from rigkit.widgets.render import draft_html
from rigkit.widgets.summary import round_header_html
from tests.test_answer_checks import LICENCE, NOTICE, make, word_embed

QUESTION = "What must I ship with Apache-2.0 code?"
# round 0 fires and the passages follow it; round 1 is supported; round 2 is not
OPENING = ["Apache-2.0 needs a NOTICE file.", " a notice text file ships with apache-2.0 works:",
           " Bananas grow on trees."]
SUPPORTED = " Every redistribution must include a NOTICE text file."
UNSUPPORTED = " Kiwis are green and round."
END = " The NOTICE text file ships with the works."  # supported: the answer goes on unchanged


def grounded(script, **controller):
    settings = {"policy": "continue", "check_support": True, "rewrite_unsupported": True, "max_rounds": 1,
                **controller}
    generator = ScriptedGenerator(script)
    return generator, make(generator, AlwaysDecider(), embed=word_embed, **settings)


def test_a_flagged_sentence_is_written_again_with_the_strict_prompt_and_a_supported_rewrite_replaces_it():
    generator, controller = grounded([*OPENING, SUPPORTED, END])
    result = controller.run(QUESTION)
    assert [r.action for r in result.rounds] == ["continue", "skip", "skip", "ground", "skip"]
    assert result.rounds[2].unsupported == ["Bananas grow on trees."]
    ground = result.rounds[3]
    assert ground.fallback == "" and ground.unsupported == [] and ground.decision.decider == "grounding"
    assert "Bananas grow on trees." in ground.decision.reason
    assert "Bananas" not in result.answer and "Every redistribution must include" in result.answer
    # the rewrite's prompt: the context without the flagged segment, then its passages under the
    # strict grounding instruction, asking to go on with the answer
    prompt = generator.prompts[3]
    assert "Bananas" not in "".join(p.text for p in prompt)
    last = prompt[-1].text
    assert GROUNDING_INSTRUCTION["en"] in last and NOTICE.text in last and "Continue your answer" in last
    # the next round reads the rewrite, not the flagged segment, and no strict message stays behind
    after = "".join(p.text for p in generator.prompts[4])
    assert "Every redistribution must include" in after and GROUNDING_INSTRUCTION["en"] not in after
    assert "Bananas" not in after
    assert result.rounds[3].draft == result.rounds[4].draft.removesuffix(END)


def test_an_unsupported_rewrite_is_dropped_and_the_original_stays_recorded_as_a_fallback():
    generator, controller = grounded([*OPENING, UNSUPPORTED, END])
    result = controller.run(QUESTION)
    assert [r.action for r in result.rounds] == ["continue", "skip", "skip", "ground", "skip"]
    ground = result.rounds[3]
    assert ground.fallback == "the grounded rewrite is not supported either: 'Kiwis are green and round.'"
    assert "Bananas grow on trees." in result.answer and "Kiwis" not in result.answer
    assert "Kiwis" not in "".join(p.text for p in generator.prompts[4])  # the dropped rewrite left the context
    # the flagged sentences are counted once: in the round that kept them
    assert [len(r.unsupported) for r in result.rounds] == [0, 0, 1, 0, 0]


def test_an_empty_or_repeating_rewrite_is_dropped():
    for rewrite, reason in ((make_segment(""), "the grounded rewrite is empty"),
                            (" a notice text file ships with apache-2.0 works:",
                             "the grounded rewrite repeats accepted text")):
        result = grounded([*OPENING, rewrite, END])[1].run(QUESTION)
        assert result.rounds[3].action is Action.GROUND and result.rounds[3].fallback == reason
        assert "Bananas grow on trees." in result.answer


def test_each_flagged_segment_is_written_again_at_most_once():
    # the original stays after its rewrite is dropped; nothing of it is rewritten a second time
    script = [*OPENING, UNSUPPORTED, " Cherries are red.", " Plums are purple.", END]
    result = grounded(script, max_answer_tokens=400)[1].run(QUESTION)
    actions = [r.action for r in result.rounds]
    assert actions == ["continue", "skip", "skip", "ground", "skip", "ground", "skip"]
    assert result.rounds[4].unsupported == ["Cherries are red."]  # a new segment: its own single rewrite
    assert result.rounds[5].segment.text == " Plums are purple." and result.rounds[5].fallback
    assert actions.count("ground") == 2 and result.answer.count("Bananas") == 1


def test_a_rewrite_is_not_rewritten_and_a_rewrite_that_ends_the_turn_ends_the_answer():
    script = [*OPENING, make_segment(SUPPORTED, finish_reason="end_of_turn"), " Never read."]
    result = grounded(script)[1].run(QUESTION)
    assert [r.action for r in result.rounds] == ["continue", "skip", "skip", "ground"]
    assert strip_citations(result.answer).endswith("include a NOTICE text file.")


def test_a_flagged_segment_that_ended_the_turn_is_still_written_again():
    script = [*OPENING[:2], make_segment(" Bananas grow on trees.", finish_reason="end_of_turn"), UNSUPPORTED,
              " Never read."]
    result = grounded(script)[1].run(QUESTION)
    assert [r.action for r in result.rounds] == ["continue", "skip", "skip", "ground"]  # and then it ends
    assert strip_citations(result.answer).endswith("Bananas grow on trees.")


def test_off_by_default_and_without_the_support_check_nothing_is_rewritten():
    for settings in ({"rewrite_unsupported": False}, {"check_support": False}):
        result = grounded([*OPENING, SUPPORTED], **settings)[1].run(QUESTION)
        assert Action.GROUND not in [r.action for r in result.rounds]
        assert "Bananas grow on trees." in result.answer


def test_a_segment_the_passages_follow_is_not_rewritten():
    generator = ScriptedGenerator(["x"])
    context = ContextManager(ContextConfig(layout="append"), generator.count_tokens, generator.render_chat)
    context.start(QUESTION)
    context.inject([NOTICE])
    flagged = make_segment("Bananas grow on trees.")
    flagged.context_ids = [NOTICE.chunk_id]
    context.accept(flagged)
    assert context.grounding_pieces(flagged, 40) is not None
    assert context.grounding_pieces(flagged, 10**6) is None  # no room for the rewrite
    context.inject([LICENCE])  # the passages it asked for come after it: it stays as written
    assert context.grounding_pieces(flagged, 40) is None
    unseen = make_segment("Kiwis are green.")
    unseen.context_ids = []
    context.accept(unseen)
    assert context.grounding_pieces(unseen, 40) is None  # no passage it could see


def test_the_ground_round_survives_the_json_round_trip_and_a_saved_run_goes_on_after_it():
    result = grounded([*OPENING, SUPPORTED, END])[1].run(QUESTION)
    again = RIGResult.from_json(result.to_json())
    assert again == result and again.rounds[3].action is Action.GROUND
    # saved before the rewrite, and after it (its replacement is in the run's log)
    for pause in (3, 4):
        _, controller = grounded([*OPENING, SUPPORTED, END])
        run = controller.start(QUESTION)
        while len(run.rounds) < pause:
            if isinstance(run.step(), SearchRequest):
                run.search(controller.retriever)
        saved = RunState.from_json(run.state().to_json())
        assert saved.counters.ground is (pause == 3)
        _, fresh = grounded((OPENING + [SUPPORTED, END])[pause:])
        resumed = fresh.restore(saved)
        while (step := resumed.step()) is not None:
            assert not isinstance(step, SearchRequest)  # max_rounds was spent before the pause
        assert resumed.result.answer == result.answer
        assert [r.action for r in resumed.result.rounds] == [r.action for r in result.rounds]


def test_without_passages_the_loop_is_unchanged():
    never = make(ScriptedGenerator(["Bananas grow on trees."]), NeverDecider(), embed=word_embed,
                 check_support=True, rewrite_unsupported=True).run(QUESTION)
    assert [r.action for r in never.rounds] == ["accept"]


def test_ask_and_the_round_stepper_show_the_grounded_rewrite():
    kept = grounded([*OPENING, SUPPORTED, END])[1].run(QUESTION)
    printed = format_round(kept.rounds[3])
    assert "grounded  the previous segment written again under the strict grounding prompt: supported" in printed
    assert "action    ground" in printed
    head = round_header_html(QUESTION, 3, len(kept.rounds), rounds=kept.rounds)
    assert ">ground</code>" in head and "rig-grounded" in head
    draft = draft_html(kept.rounds, 4)
    assert "Bananas" not in draft and "redistribution" in draft  # the rewrite stands in for the flagged one
    dropped = grounded([*OPENING, UNSUPPORTED, END])[1].run(QUESTION)
    printed = format_round(dropped.rounds[3])
    assert ": dropped" in printed and "fallback  the grounded rewrite is not supported either" in printed
    head = round_header_html(QUESTION, 3, len(dropped.rounds), rounds=dropped.rounds)
    assert "rig-fallback" in head and "rig-grounded" not in head
    assert "Kiwis" not in draft_html(dropped.rounds, 4) and "Bananas" in draft_html(dropped.rounds, 4)


def test_the_report_counts_grounded_rewrites_tried_and_kept_and_a_dropped_one_as_a_fallback():
    item = QAItem("q1", QUESTION, "a NOTICE text file")
    kept = score_result(grounded([*OPENING, SUPPORTED, END])[1].run(QUESTION), item)
    dropped = score_result(grounded([*OPENING, UNSUPPORTED, END])[1].run(QUESTION), item)
    assert (kept["grounded_rewrites"], kept["grounded_kept"], kept["fallbacks"]) == (1, 1, 0)
    assert (dropped["grounded_rewrites"], dropped["grounded_kept"], dropped["fallbacks"]) == (1, 0, 1)
    # the decider judged four segments of five (the rewrite is not its round) and fired on all four
    assert kept["trigger_rate"] == 1.0 and kept["segments"] == 5
    rows = [{**record, "id": "q1", "type": "comparison", "system": system, "run": 0, "latency": 1.0, "error": None}
            for system, record in (("rig:kept", kept), ("rig:dropped", dropped))]
    header, table = next(t for title, t in report_tables(rows).items() if title.startswith("Loop guards"))
    at = header.index("Grounded rewrites/q")
    assert header[at + 1] == "Grounded kept/q"
    assert [row[at:at + 2] for row in table] == [["1.00", "1.00"], ["1.00", "0.00"]]
