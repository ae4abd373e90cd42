"""Client-side tools in-process (FastAPI TestClient, scripted model): the paused run kept and resumed."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from rigkit.serve import service as service_module  # noqa: E402
from rigkit.serve.app import create_app  # noqa: E402
from tests.test_serve_protocol import QUESTION, local_client, make_service, tools_request  # noqa: E402

RESULT = "The Eiffel Tower is 330 metres tall and stands in Paris."


def first_turn(client):
    messages = [{"role": "user", "content": QUESTION}]
    first = client.post("/v1/chat/completions", json=tools_request(messages)).json()
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    return messages + [message, {"role": "tool", "tool_call_id": call["id"], "content": RESULT}], call


def test_tool_results_for_another_questions_search_are_a_4xx():
    with local_client(create_app(make_service(), mcp=False)) as client:
        messages, call = first_turn(client)
        messages[0] = {"role": "user", "content": "Who designed the Eiffel Tower?"}
        r = client.post("/v1/chat/completions", json=tools_request(messages))
    assert r.status_code == 422
    assert f"tool call {call['id']!r} was asked for another question" in r.json()["error"]["message"]


def test_a_paused_run_that_expired_reads_the_results_as_passages_and_answers_afresh(monkeypatch):
    service = make_service()
    with local_client(create_app(service, mcp=False)) as client:
        messages, call = first_turn(client)
        monkeypatch.setattr(service_module, "PAUSED_SECONDS", 0.0)
        calls_before = service.generator.calls
        # `turns: 1`: the results given up front are the one retrieval round
        final = client.post("/v1/chat/completions", json=tools_request(messages, turns=1)).json()
    assert final["choices"][0]["finish_reason"] == "stop"
    rig = final["rig"]
    assert call["id"] in rig["citations"]  # the result, given before the question, is cited
    assert service.generator.calls - calls_before == 3  # the whole answer written again
    assert not service._paused  # the expired run is forgotten
