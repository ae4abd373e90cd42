"""The loop that pauses: `start`, `step`, `resume` with hits a caller supplies, saved and restored."""

from __future__ import annotations

import json

import pytest

from rigkit.errors import InputError
from rigkit.run_state import RunState
from rigkit.testing import AlwaysDecider, DictRetriever, NeverDecider, ScriptedGenerator
from rigkit.trace import RIGResult, RoundTrace, SearchRequest
from tests.test_controller import APACHE, MIT, FireOnWord, controller

SCRIPT = ["Apache needs XYZ.", "Apache needs the NOTICE file.", " MIT needs XYZ too.", " It keeps the notice."]
QUESTION = "What do Apache-2.0 and MIT require?"


def paused_controller(retriever=None, script=SCRIPT):
    return controller(ScriptedGenerator(script), FireOnWord("XYZ"), retriever=retriever)


def steps_until_pause(run):
    rounds = []
    while not isinstance(step := run.step(), SearchRequest):
        assert step is not None, "the run ended without a search"
        rounds.append(step)
    return rounds, step


def test_a_run_pauses_at_each_search_and_goes_on_with_the_hits_supplied():
    run = paused_controller().start(QUESTION)
    rounds, request = steps_until_pause(run)
    assert rounds == [] and request.round == 0 and request.queries and request.top_k == 3
    assert run.step() is request  # waiting: stepping again writes nothing
    assert run.resume(request.id, [APACHE]).action == "regenerate"
    accepted = run.step()
    assert isinstance(accepted, RoundTrace) and accepted.segment.text == "Apache needs the NOTICE file."
    request = run.step()
    assert isinstance(request, SearchRequest) and request.round == 2
    run.resume(request.id, ["MIT needs the copyright notice kept."])  # a plain text is a passage too
    while run.step() is not None:
        pass
    assert "NOTICE file" in run.result.answer and "XYZ" not in run.result.answer
    assert run.result.used_retrieval_times == 2
    # the hand-given text is a passage named after the search it answered, and citable
    assert f"{request.id}-1" in [p.chunk_id for p in run.result.passages]


def test_the_hits_supplied_give_the_answer_the_loop_gives_with_its_own_retriever():
    retriever = DictRetriever({}, default=[APACHE, MIT])
    whole = paused_controller(retriever).run(QUESTION)
    run = paused_controller().start(QUESTION)
    while (step := run.step()) is not None:
        if isinstance(step, SearchRequest):
            run.resume(step.id, retriever.search(step.queries[0], step.top_k))
    assert run.result.answer == whole.answer
    assert [r.action for r in run.result.rounds] == [r.action for r in whole.rounds]
    assert run.result.citations == whole.citations


def test_hits_for_another_pause_are_refused_and_the_pause_waits_on():
    first, second = paused_controller().start(QUESTION), paused_controller().start(QUESTION)
    _, mine = steps_until_pause(first)
    _, other = steps_until_pause(second)
    with pytest.raises(InputError, match=f"answer search '{other.id}', but the run waits on search '{mine.id}'"):
        first.resume(other.id, [APACHE])
    assert first.step() is mine  # nothing lost: still waiting on its own search
    first.resume(mine.id, [APACHE])
    with pytest.raises(InputError, match="not waiting for a search"):
        first.resume(mine.id, [APACHE])  # answered already


def test_a_run_without_searches_never_pauses():
    run = controller(ScriptedGenerator(["Apache is a licence."]), NeverDecider()).start("What is Apache?")
    assert isinstance(run.step(), RoundTrace) and run.step() is None
    assert run.result.answer == "Apache is a licence." and run.request is None


def test_a_failed_search_is_the_rounds_error_as_in_the_loop():
    class Down:
        def search(self, query, top_k=5):
            raise ConnectionError("index down")

    run = paused_controller().start(QUESTION)
    steps_until_pause(run)
    trace = run.search(Down())
    assert trace.error == "ConnectionError: index down" and trace.action == "accept"


def test_a_paused_run_saves_as_json_and_restores_over_fresh_parts():
    retriever = DictRetriever({}, default=[APACHE, MIT])
    whole = paused_controller(retriever).run(QUESTION)
    run = paused_controller().start(QUESTION)
    _, request = steps_until_pause(run)
    run.resume(request.id, [APACHE, MIT])
    _, request = steps_until_pause(run)
    saved = run.state().to_json()
    assert json.loads(saved)["request"]["id"] == request.id
    # a new process: the model's script goes on where the saved run stopped
    fresh = paused_controller(script=SCRIPT[3:])
    restored = fresh.restore(saved)
    assert restored.request == request and restored.step() == request
    assert fresh.context.draft == run.controller.context.draft
    assert [h.chunk_id for h in fresh.context.passages] == [h.chunk_id for h in run.controller.context.passages]
    restored.resume(request.id, retriever.search(request.queries[0], request.top_k))
    while restored.step() is not None:
        pass
    assert restored.result.answer == whole.answer and restored.result.citations == whole.citations
    assert RIGResult.from_json(restored.result.to_json()).answer == whole.answer
    assert RunState.from_json(saved).to_json() == saved  # the state itself round-trips exactly


def test_a_run_between_rounds_restores_too():
    gen = ScriptedGenerator(["One.", " Two.", " Three."])
    run = controller(gen, NeverDecider()).start("Count?")
    run.step()
    restored = controller(ScriptedGenerator([" Two.", " Three."]), NeverDecider()).restore(run.state())
    while restored.step() is not None:
        pass
    assert restored.result.answer == "One. Two. Three." and len(restored.result.rounds) == 3


def test_max_rounds_spent_means_no_more_pauses():
    run = controller(ScriptedGenerator(["A?", " B?", " C."]), AlwaysDecider(), max_rounds=1).start("Q?")
    pauses = 0
    while (step := run.step()) is not None:
        if isinstance(step, SearchRequest):
            pauses += 1
            run.resume(step.id, [APACHE])
    assert pauses == 1 and run.result.low_confidence


def test_the_model_is_reset_once_per_question_never_on_resume():
    class Resettable(ScriptedGenerator):
        resets = 0

        def reset(self, seed=None):
            self.resets += 1

    gen = Resettable(SCRIPT)
    run = controller(gen, FireOnWord("XYZ")).start(QUESTION)
    while (step := run.step()) is not None:
        if isinstance(step, SearchRequest):
            run.resume(step.id, [APACHE])
    assert gen.resets == 1  # a resumed run keeps the paused turn's cache
