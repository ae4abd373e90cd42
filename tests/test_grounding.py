"""Grounding: the strict prompt, model-written [n] citations checked against what each sentence
could see, the fact check (en + zh) and the no-citation warning, through the real controller."""

from __future__ import annotations

import pytest

from rigkit.cli.ask import format_result
from rigkit.config import (
    ContextConfig,
    ControllerConfig,
    GeneratorConfig,
    QueryConfig,
    RunConfig,
    apply_settings,
)
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.errors import InputError
from rigkit.grounding import check_facts, ground, model_citations
from rigkit.prompts import GROUNDING_INSTRUCTION, NUMBERED_HEADER, render_passages
from rigkit.queries import build_query_builder
from rigkit.testing import DictRetriever, NeverDecider, ScriptedGenerator
from rigkit.trace import Attribution, Decision, Hit, RIGResult

APACHE = Hit("apache#0", "apache", "Apache License", "Apache-2.0 allows commercial use; you must ship the "
             "licence text and the NOTICE file.", 1.0)
MIT = Hit("mit#0", "mit", "MIT License", "The MIT licence allows commercial use if the copyright notice is kept.", 0.9)
HUAWEI = Hit("kl#0", "kl", "KL320", "KL320 型号于2019年发布，由华为公司生产。", 1.0)


class FireOn:
    """Retrieves when the segment contains `word`, keeping the segment (policy continue)."""

    policy = "continue"

    def __init__(self, word):
        self.word = word

    def decide(self, segment, state):
        fire = self.word in segment.text
        return Decision(fire, float(fire), "seen" if fire else "fine", decider="word")


def run(segments, decider=None, question="Can I use Apache-2.0 code commercially?", hits=(APACHE,), **ctx):
    gen = ScriptedGenerator(segments)
    context = ContextManager(ContextConfig(**{"layout": "append", **ctx}), gen.count_tokens, gen.render_chat)
    controller = RIGController(
        gen, DictRetriever({}, default=list(hits)), decider or FireOn("XYZ"),
        build_query_builder(QueryConfig(mode="masked"), gen), context,
        config=ControllerConfig(max_rounds=2), generation=GeneratorConfig(max_answer_tokens=200),
        citations=context.config.citations,
    )
    return controller.run(question), gen


# -- the prompt ---------------------------------------------------------------------------------
def test_strict_and_numbered_passages_message_en_and_zh():
    triples = [("apache#0", "Apache License", "text"), ("mit#0", "MIT License", "more")]
    en = render_passages(triples, "en", numbers={"apache#0": 1, "mit#0": 2}, strict=True)
    assert en.startswith(NUMBERED_HEADER["en"]) and GROUNDING_INSTRUCTION["en"] in en
    assert "[1] Apache License: text" in en and "[2] MIT License: more" in en and "[[citation:" not in en
    assert "do not contain" in GROUNDING_INSTRUCTION["en"]
    zh = render_passages(triples, "zh", strict=True)
    assert "只根据这些资料回答" in zh and "资料中没有" in zh and "[[citation:apache#0]]" in zh
    assert "[1]" in NUMBERED_HEADER["zh"]
    plain = render_passages(triples, "en")  # the default is today's message
    assert GROUNDING_INSTRUCTION["en"] not in plain and "[[citation:apache#0]] Apache License" in plain


def test_the_model_reads_numbered_passages_under_strict_grounding():
    result, gen = run(["Apache needs XYZ.", "You must ship the NOTICE file [1]."], grounding="strict", cite="model")
    seen = gen.prompts[1][-1].text
    assert "[1] Apache License:" in seen and GROUNDING_INSTRUCTION["en"] in seen and NUMBERED_HEADER["en"] in seen
    assert result.config == {} and result.used_retrieval_times == 1


def test_options_are_settable_and_checked():
    config = apply_settings(RunConfig(), ["context.grounding=strict", "context.cite=model"])
    assert (config.context.grounding, config.context.cite) == ("strict", "model")
    assert (RunConfig().context.grounding, RunConfig().context.cite) == ("none", "overlap")
    gen = ScriptedGenerator([])
    with pytest.raises(InputError, match="context.cite must be overlap or model"):
        ContextManager(ContextConfig(cite="footnotes"), gen.count_tokens, gen.render_chat)
    with pytest.raises(InputError, match="context.grounding must be none or strict"):
        ContextManager(ContextConfig(grounding="loose"), gen.count_tokens, gen.render_chat)


# -- model citations through the controller -----------------------------------------------------
def test_model_citations_kept_removed_and_flagged_against_context_ids():
    result, _ = run(["Apache needs XYZ [1].", " You must ship the NOTICE file [1].", " MIT is shorter [2]."],
                    cite="model")
    assert [r.segment.context_ids for r in result.rounds] == [[], ["apache#0"], ["apache#0"]]
    first, second, third = result.attributions
    assert first.model_cites == [] and first.cited is None  # written before passage 1 arrived
    assert second.model_cites == ["apache#0"] and second.cited == "apache#0" and second.shared >= 2
    assert third.model_cites == []
    assert [(c.label, c.number, c.chunk_id, c.sentence) for c in result.removed_citations] == [
        ("[1]", 1, "apache#0", 0), ("[2]", 2, None, 2)]
    assert "not in context" in result.removed_citations[0].reason
    assert result.citations == ["apache#0"]
    assert result.answer == ("Apache needs XYZ. You must ship the NOTICE file. [[citation:apache#0]] "
                             "MIT is shorter.")
    assert any("removed 2 citation" in w for w in result.warnings)


def test_model_citations_without_tags_and_after_the_full_stop():
    result, _ = run(["Apache needs XYZ.", " You must ship the NOTICE file. [1]"], cite="model", citations=False)
    assert result.answer == "Apache needs XYZ. You must ship the NOTICE file."
    assert result.attributions[1].model_cites == ["apache#0"] and not result.removed_citations


def test_overlap_mode_leaves_bracket_numbers_alone():
    result, _ = run(["Apache needs XYZ.", " You must ship the NOTICE file [1]."])
    assert "[1]" in result.answer and not result.removed_citations
    assert all(a.model_cites == [] for a in result.attributions)


def test_numbers_follow_first_entry_and_survive_a_second_block():
    text, attributions, removed = model_citations(
        "Ship NOTICE [2]. Keep the notice [1][2]. Odd [1, 3].",
        [APACHE, MIT], [(0, ["apache#0", "mit#0"])], {"apache#0": 2, "mit#0": 1})
    assert text == "Ship NOTICE. Keep the notice. Odd."
    assert [a.model_cites for a in attributions] == [["apache#0"], ["mit#0", "apache#0"], ["mit#0"]]
    assert [(r.number, r.chunk_id) for r in removed] == [(3, None)]


# -- the fact check -----------------------------------------------------------------------------
def test_suspicious_sentences_name_their_unsupported_facts():
    answer = ("Apache-2.0 allows commercial use. It was written in 2004 by the Apache Software Foundation. "
              "You must ship the NOTICE file.")
    grounded = ground(answer, "Can I use Apache-2.0 code commercially?", [APACHE])
    assert [(s.sentence, s.facts) for s in grounded.suspicious] == [(1, ["2004", "Apache Software Foundation"])]
    assert grounded.suspicious[0].text.startswith("It was written in 2004")


def test_facts_from_the_question_or_split_names_and_dates_are_supported():
    passage = Hit("b#0", "b", "Cameron", "Cameron, James directed it; it opened on 5 March 1990 with 1,000 copies.", 1.0)
    answer = "James Cameron made Titanic. It opened on March 5, 1990 with 1000 copies."
    assert ground(answer, "Who made Titanic?", [passage]).suspicious == []
    assert [s.facts for s in ground(answer, "Who made it?", [passage]).suspicious] == [["Titanic"]]


def test_chinese_facts_digits_and_jieba_names():
    answer = "KL320 于2019年发布。它由小米公司在北京生产，售价3999元。"
    grounded = ground(answer, "KL320 是哪年发布的？", [HUAWEI])
    assert [(s.sentence, s.facts) for s in grounded.suspicious] == [(1, ["北京", "3999"])]


def test_a_sentence_is_checked_against_what_it_could_see_and_closed_book_is_not_checked():
    attributions = [Attribution("Apache-2.0 needs NOTICE.", 0, 24, visible=[]),
                    Attribution("Apache-2.0 needs NOTICE.", 25, 49, visible=["apache#0"])]
    flagged = check_facts(attributions, [APACHE], "What does it need?")
    assert [s.sentence for s in flagged] == [0] and flagged[0].facts == ["Apache-2.0", "NOTICE"]
    assert check_facts(attributions, [], "What does it need?") == []
    result, _ = run(["Rome was founded in 753 BC."], decider=NeverDecider(), question="When was Rome founded?")
    assert result.suspicious == []  # no passage: nothing to ground on
    assert result.warnings == ["the answer cites nothing: no passage was retrieved"]


# -- warnings, the CLI and the trace ------------------------------------------------------------
def test_an_answer_that_cites_nothing_is_warned_about_and_printed():
    result, _ = run(["Licences XYZ.", " Lawyers decide such things."])
    assert result.citations == []
    assert result.warnings == ["the answer cites nothing: no sentence is attributed to a passage, "
                               "though 1 passage(s) were in context"]
    printed = format_result(result)
    assert "warning   the answer cites nothing" in printed
    model, _ = run(["Licences XYZ.", " You must ship the NOTICE file."], cite="model")
    assert model.citations == [] and "the model cited none it could see" in model.warnings[0]
    cited, _ = run(["Apache needs XYZ.", " You must ship the licence text and the NOTICE file."])
    assert cited.citations == ["apache#0"] and cited.warnings == []


def test_suspicious_sentences_are_printed_and_round_trip():
    result, _ = run(["Apache needs XYZ.", " It was written in 2004 [1]."], cite="model")
    assert [s.facts for s in result.suspicious] == [["XYZ"], ["2004"]]  # XYZ: before any passage
    assert "suspicious 'It was written in 2004.' (2004)" in format_result(result)
    assert RIGResult.from_json(result.to_json()) == result


def test_a_trace_from_before_grounding_still_loads():
    result, _ = run(["Apache needs XYZ.", " It was written in 2004 [9]."], cite="model")
    old = result.to_dict()
    for key in ("suspicious", "removed_citations", "warnings"):
        del old[key]
    for item in old["attributions"]:
        del item["model_cites"]
    loaded = RIGResult.from_dict(old)
    assert loaded.suspicious == [] and loaded.removed_citations == [] and loaded.warnings == []
    assert loaded.attributions[1].model_cites == [] and loaded.answer == result.answer


def test_widgets_mark_suspicious_sentences():
    from rigkit.widgets.summary import answer_html

    result, _ = run(["Apache needs XYZ.", " It was written in 2004 [1]."], cite="model")
    html = answer_html(result)
    assert '<mark class="rig-suspicious"' in html and "2004" in html
    assert "rig-warning" not in html  # it cites the passage it saw


# -- the real default model ---------------------------------------------------------------------
@pytest.mark.slow
def test_strict_model_citations_with_the_default_model(default_generator, demo_retriever):
    from rigkit.build import build_controller
    from rigkit.config import load_config

    config = load_config("configs/cpu.yaml", decider={"name": "always"}, controller={"max_rounds": 1},
                         generator={"max_answer_tokens": 60},
                         context={"grounding": "strict", "cite": "model"})
    question = "Can I use code under the Apache-2.0 licence in a commercial product?"
    result = build_controller(config, default_generator, demo_retriever).run(question)
    assert result.used_retrieval_times == 1 and result.passages
    for item in result.attributions:  # every kept citation names a passage the sentence could see
        assert set(item.model_cites) <= set(item.visible)
    assert all(c.chunk_id is None or c.chunk_id not in result.attributions[c.sentence].visible
               for c in result.removed_citations)
    assert set(result.citations) <= {h.chunk_id for h in result.passages} | {
        c for r in result.rounds for c in (r.segment.context_ids or [])}
    assert isinstance(result.suspicious, list) and isinstance(result.warnings, list)
    assert RIGResult.from_json(result.to_json()) == result


def test_rigkit_ask_grounded_sets_both_options_and_prints_warnings(monkeypatch, capsys):
    import rigkit.build
    from rigkit.cli import main

    seen = {}

    def scripted(config, callbacks=()):
        seen["context"] = config.context
        gen = ScriptedGenerator(["Licences XYZ.", " Lawyers decide [1]."])
        context = ContextManager(config.context, gen.count_tokens, gen.render_chat)
        return RIGController(gen, DictRetriever({}, default=[APACHE]), FireOn("XYZ"),
                             build_query_builder(QueryConfig(mode="masked"), gen), context, callbacks=callbacks)

    monkeypatch.setattr(rigkit.build, "build_controller", scripted)
    assert main(["ask", "--grounded", "Can I use Apache-2.0 code commercially?"]) == 0
    assert (seen["context"].grounding, seen["context"].cite) == ("strict", "model")
    out = capsys.readouterr().out
    assert "warning   the answer cites nothing" not in out  # [1] was seen: it cites apache#0
    assert "citations apache#0" in out
    assert apply_settings(RunConfig(), ["context.grounding=none"]).context.grounding == "none"


def test_evaluation_records_the_share_of_suspicious_sentences():
    from rigkit.eval.metrics import QAItem, score_result

    item = QAItem(id="q1", question="Can I use Apache-2.0 code commercially?", answer="yes")
    result, _ = run(["Apache needs XYZ.", " It was written in 2004 [1]."], cite="model")
    assert score_result(result, item)["suspicious_share"] == 1.0  # XYZ and 2004: both sentences
    closed, _ = run(["Yes."], decider=NeverDecider())
    assert score_result(closed, item)["suspicious_share"] is None
