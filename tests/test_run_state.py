"""A saved run comes back from outside, so `restore` trusts nothing in it: the version, every
field and its type, and the fingerprint of the controller and question it was saved from. A bad
state is one `RunStateError` line (the CLI's exit 2), never a TypeError, KeyError or RecursionError."""

from __future__ import annotations

import json

import pytest

from rigkit.errors import RigkitError, RunStateError
from rigkit.run_state import RunState
from rigkit.testing import ScriptedGenerator
from rigkit.trace import SearchRequest
from tests.test_controller import APACHE, MIT, FireOnWord, controller
from tests.test_controller_pause import QUESTION, SCRIPT, paused_controller, steps_until_pause


@pytest.fixture()
def saved() -> dict:
    """A run paused at its second search, as JSON."""
    run = paused_controller().start(QUESTION)
    _, request = steps_until_pause(run)
    run.resume(request.id, [APACHE, MIT])
    steps_until_pause(run)
    return json.loads(run.state().to_json())


def refused(state, by=None) -> str:
    with pytest.raises(RunStateError) as err:
        (by or paused_controller(script=SCRIPT[3:])).restore(state if isinstance(state, str) else json.dumps(state))
    message = str(err.value)
    assert "\n" not in message and len(message) < 300
    return message


def test_a_good_state_still_restores(saved):
    run = paused_controller(script=SCRIPT[3:]).restore(json.dumps(saved))
    assert isinstance(run.step(), SearchRequest)
    assert issubclass(RunStateError, RigkitError)  # the CLI prints it on one line and exits 2


@pytest.mark.parametrize("text, says", [
    ('{"result": "pwned"}', "names its version"),
    ("[1, 2]", "is a JSON object"),
    ("{", "not JSON"),
    ("", "not JSON"),
    ("[" * 200_000 + "]" * 200_000, "nested deeper"),
])
def test_what_is_not_a_saved_run_is_one_line(text, says):
    assert says in refused(text)


def test_a_version_it_cannot_read_is_refused(saved):
    assert "version 99" in refused({**saved, "version": 99})
    assert "version 4" in refused({**saved, "version": 4})
    assert "names its version" in refused({**saved, "version": "5"})


def test_unknown_missing_and_mistyped_fields_are_named(saved):
    assert "no field 'result'" in refused({**saved, "result": "pwned"})
    assert "lacks its field 'question'" in refused({k: v for k, v in saved.items() if k != "question"})
    assert "counters has no field 'admin'" in refused({**saved, "counters": {**saved["counters"], "admin": True}})
    assert "counters.generated should be an integer" in refused({**saved, "counters": {**saved["counters"], "generated": "9"}})
    rounds = json.loads(json.dumps(saved["rounds"]))
    rounds[0]["segment"]["token_ids"] = ["x"]
    assert "rounds[0].segment.token_ids[0] should be an integer" in refused({**saved, "rounds": rounds})
    rounds = json.loads(json.dumps(saved["rounds"]))
    rounds[0]["action"] = "delete"
    assert "rounds[0].action should be one of" in refused({**saved, "rounds": rounds})
    assert "[question, answer] pair" in refused({**saved, "history": [["only a question"]]})
    assert "operation other than" in refused({**saved, "log": [{"op": "drop"}]})
    assert "comes with the round" in refused({**saved, "waiting": None})


def test_deep_nesting_inside_a_free_form_field_is_refused(saved):
    deep: object = "x"
    for _ in range(200):
        deep = {"a": deep}
    rounds = json.loads(json.dumps(saved["rounds"]))
    rounds[0]["decision"]["evidence"] = {"deep": deep}
    assert "nested deeper than" in refused({**saved, "rounds": rounds})


def test_a_swapped_question_is_refused(saved):
    assert "another question" in refused({**saved, "question": "What does GPL-3.0 require?"})


def test_another_controllers_state_is_refused(saved):
    other = controller(ScriptedGenerator(SCRIPT[3:]), FireOnWord("XYZ"), max_rounds=1)
    assert "another controller" in refused(saved, by=other)


def test_a_state_made_in_memory_is_checked_too(saved):
    state = RunState.from_dict(saved)
    state.counters.generated = "nine"  # type: ignore[assignment]
    with pytest.raises(RunStateError, match="counters.generated"):
        paused_controller(script=SCRIPT[3:]).restore(state)
