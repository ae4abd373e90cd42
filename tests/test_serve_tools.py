"""Client-side tools in-process (FastAPI TestClient, scripted model): the paused run kept and resumed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from rigkit.serve import paused as paused_module  # noqa: E402
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
        monkeypatch.setattr(paused_module, "PAUSED_SECONDS", 0.0)
        calls_before = service.generator.calls
        # `turns: 1`: the results given up front are the one retrieval round
        final = client.post("/v1/chat/completions", json=tools_request(messages, turns=1)).json()
    assert final["choices"][0]["finish_reason"] == "stop"
    rig = final["rig"]
    assert f"search:{call['id']}" in rig["citations"]  # the result, given before the question, is cited
    assert service.generator.calls - calls_before == 3  # the whole answer written again
    assert len(service.paused) == 0  # the expired run is forgotten


# -- tools as the client declares them ------------------------------------------------------------
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the docs."}}  # rigkit's schema
TOWER = "The Eiffel Tower is 330 metres tall."


def two_tool_service(first='weather {"city": "Paris"}'):
    from rigkit.config import RunConfig
    from rigkit.serve.service import RigService
    from rigkit.testing import DictRetriever, make_segment
    from tests.test_serve_protocol import HITS, LoopingScript

    config = RunConfig.from_dict({"decider": {"name": "marker"}, "query": {"mode": "marker"}})
    generator = LoopingScript([make_segment(f"It is sunny. <retrieve>{first}</retrieve>"),
                               make_segment(" The tower is tall. <retrieve>Eiffel Tower height</retrieve>"),
                               make_segment(" The Eiffel Tower is 330 metres tall.", finish_reason="end_of_turn")])
    return RigService(config, generator=generator, retriever=DictRetriever({}, default=HITS))


def test_the_openai_sdk_runs_a_two_tool_conversation_with_structured_arguments():
    from tests.test_serve_protocol import sdk_client, tool_conversation

    service = two_tool_service()
    with local_client(create_app(service, mcp=False)) as client:
        sdk = sdk_client(client)
        question = "What is the weather by the Eiffel Tower, and how tall is it?"
        reply, names = tool_conversation(sdk, service.model_name, question, [WEATHER, SEARCH],
                                         {"weather": "Sunny, 24 °C.", "search": TOWER})
    choice = reply.choices[0]
    assert names == [("weather", {"city": "Paris"}), ("search", {"query": "Eiffel Tower height", "top_k": 3})]
    assert choice.finish_reason == "stop"
    rig = reply.model_extra["rig"]
    assert [c.split(":")[0] for c in rig["citations"]] == ["search"]  # citations name the tool
    injected = [i for r in rig["rounds"] for i in r["injected"]]
    assert [i.split(":")[0] for i in injected] == ["weather", "search"]  # one run, resumed twice
    # the model was shown the client's tool in the marker protocol's form
    system = service.generator.prompts[0][0].text
    assert "weather(city): Current weather in a city." in system and '<retrieve>weather {...}</retrieve>' in system
    prompt = "".join(p.text for p in service.generator.prompts[-1])
    assert "Sunny, 24 °C." in prompt and TOWER in prompt  # both results read, as passages


def test_searches_the_client_did_not_declare_run_on_the_served_index():
    service = two_tool_service()
    with local_client(create_app(service, mcp=False)) as client:
        messages = [{"role": "user", "content": QUESTION}]
        body = client.post("/v1/chat/completions", json={"messages": messages, "tools": [WEATHER]}).json()
        message = body["choices"][0]["message"]
        assert [c["function"]["name"] for c in message["tool_calls"]] == ["weather"]
        messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "Sunny."}]
        body = client.post("/v1/chat/completions", json={"messages": messages, "tools": [WEATHER]}).json()
    assert body["choices"][0]["finish_reason"] == "stop"  # the search ran here: no second tool round
    assert "c1" in [i for r in body["rig"]["rounds"] for i in r["injected"]]


def test_a_model_call_whose_arguments_fail_the_schema_is_searched_instead():
    service = two_tool_service(first='weather {"town": "Paris"}')
    with local_client(create_app(service, mcp=False)) as client:
        body = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": QUESTION}],
                                                         "tools": [WEATHER, SEARCH]}).json()
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "search"


def test_the_tool_call_streams_in_openai_deltas_with_its_name_and_arguments():
    service = two_tool_service()
    with local_client(create_app(service, mcp=False)) as client, client.stream(
            "POST", "/v1/chat/completions", json={"messages": [{"role": "user", "content": QUESTION}],
                                                  "tools": [WEATHER, SEARCH], "stream": True}) as r:
        chunks = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:") and "[DONE]" not in line]
    deltas = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas[0]["function"]["name"] == "weather" and deltas[0]["id"].startswith("call_")
    assert json.loads("".join(d["function"]["arguments"] for d in deltas)) == {"city": "Paris"}


@pytest.mark.parametrize("call, param, message", [
    ({"name": "calculator", "arguments": "{}"}, "messages.1.tool_calls.0.function.name",
     "unknown tool 'calculator'; the request declares weather, search"),
    ({"name": "weather", "arguments": '{"town": "Paris"}'}, "messages.1.tool_calls.0.function.arguments",
     "arguments fail the schema of 'weather'"),
    ({"name": "weather", "arguments": "{not json"}, "messages.1.tool_calls.0.function.arguments",
     "the arguments of 'weather' are not JSON"),
    ({"name": "search", "arguments": '{"query": "x", "top_k": 500}'}, "messages.1.tool_calls.0.function.arguments",
     "at top_k: 500 is greater than the maximum of 20"),
])
def test_a_call_naming_an_unknown_tool_or_failing_its_schema_is_a_422(call, param, message):
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "result"}]
    with local_client(create_app(two_tool_service(), mcp=False)) as client:
        r = client.post("/v1/chat/completions", json={"messages": messages, "tools": [WEATHER, SEARCH]})
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"] and "\n" not in error["message"]


def test_tool_declarations_are_checked():
    with local_client(create_app(two_tool_service(), mcp=False)) as client:
        for tools, param in (([WEATHER, WEATHER], "tools.1.function.name"),
                             ([{"type": "function", "function": {"name": "bad name"}}], "tools.0.function.name")):
            r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": QUESTION}],
                                                          "tools": tools})
            assert r.status_code == 422 and r.json()["error"]["param"] == param


# -- conversations kept on the server ---------------------------------------------------------------
def test_a_kept_conversation_is_bounded_in_number_size_and_age(monkeypatch):
    from rigkit.serve import conversations as module
    from rigkit.serve.conversations import Conversations
    from rigkit.serve.jobs import RequestError

    store = Conversations(max_conversations=2, max_age_s=3600)
    first, kept = store.open("new")
    assert kept == [] and first.startswith("conv_")
    monkeypatch.setattr(module, "MAX_HISTORY_TURNS", 3)
    for i in range(5):
        store.add(first, f"Q{i}?", f"A{i}.")
    assert store.open(first)[1] == [("Q2?", "A2."), ("Q3?", "A3."), ("Q4?", "A4.")]  # the newest 3
    monkeypatch.setattr(module, "MAX_HISTORY_BYTES", 10)
    store.add(first, "Q5?", "A much longer answer.")
    assert store.open(first)[1] == [("Q5?", "A much longer answer.")]  # the newest turn always stays
    second, third = store.open("new")[0], store.open("new")[0]
    store.add(second, "Q?", "A.")
    store.add(third, "Q?", "A.")  # a third conversation: the least recently used goes
    with pytest.raises(RequestError, match=f"conversation '{first}' is unknown or expired") as err:
        store.open(first)
    assert err.value.status == 404 and err.value.code == "conversation_not_found"
    store.max_age_s = 0.0
    with pytest.raises(RequestError, match="kept 0 minutes after its last turn"):
        store.open(second)


def test_an_expired_conversation_on_chat_is_a_404_and_new_starts_one():
    with local_client(create_app(make_service(), mcp=False)) as client:
        r = client.post("/chat", json={"question": QUESTION, "conversation": "conv_unknown"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "conversation"
        started = client.post("/chat", json={"question": QUESTION, "conversation": "new"}).json()
        follow = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Who designed it?"}], "conversation": started["conversation"]})
    assert follow.status_code == 200 and follow.json()["rig"]["conversation"] == started["conversation"]


def test_tools_the_decider_cannot_call_are_refused_in_one_line_naming_those_that_can():
    with local_client(create_app(two_tool_service(), mcp=False)) as client:
        body = {"messages": [{"role": "user", "content": QUESTION}], "tools": [WEATHER, SEARCH],
                "options": {"decider": "prob"}}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 422
        error = r.json()["error"]
        assert error["param"] == "tools" and "\n" not in error["message"]
        assert "weather" in error["message"] and '"marker"' in error["message"] and "'prob'" in error["message"]
        body["tools"] = [SEARCH]  # a search tool works with every decider
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text


def test_a_chinese_tool_result_is_cut_between_characters_not_emptied():
    service = two_tool_service()
    service.generator.count_tokens = len  # one token per character, as CJK text roughly costs
    service.tool_result_tokens = 30
    result = "埃菲尔铁塔高三百三十米，位于巴黎战神广场。它由古斯塔夫·埃菲尔的公司设计建造，于一八八九年完工。"
    capped = service.cap_text(result)
    assert capped.endswith("… [truncated]") and len(capped) <= 30
    assert capped.startswith("埃菲尔铁塔高三百三十米") and result.startswith(capped.removesuffix("… [truncated]"))
