"""Tools and conversations against a real `rigkit serve` process (`tests.scripted_serve` with its
tool script: every question calls the client's `weather` tool, then searches "its height", then
answers), driven by the official `openai` and `mcp` SDKs and httpx."""

from __future__ import annotations

import os

import pytest

from tests.conftest import hang_limit, serving_module

httpx = pytest.importorskip("httpx")
pytest.importorskip("openai")
pytest.importorskip("mcp")

pytestmark = pytest.mark.slow  # starts a `rigkit serve` process

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the docs."}}
RESULTS = {"weather": "Sunny, 24 °C.", "search": "The Eiffel Tower is 330 metres tall and stands in Paris."}
MODEL = "smollm2-135m-instruct"  # the served name (the script stands in for it)
TURNS = ["How tall is the Eiffel Tower?", "Who designed it?", "And how old is it?"]



@pytest.fixture(scope="module")
def base(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serving_module("tests.scripted_serve", log=log, env={**os.environ, "RIGKIT_TEST_SCRIPT": "tools"}) as url:
        yield url


@pytest.fixture(scope="module")
def sdk(base):
    from openai import OpenAI

    return OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=hang_limit(30))


def test_the_openai_sdk_runs_a_two_tool_conversation(sdk):
    from tests.test_serve_protocol import tool_conversation

    reply, calls = tool_conversation(sdk, MODEL, TURNS[0], [WEATHER, SEARCH], RESULTS)
    choice = reply.choices[0]
    assert calls == [("weather", {"city": "Paris"}), ("search", {"query": "its height", "top_k": 3})]
    assert choice.finish_reason == "stop" and "330 metres" in choice.message.content
    assert [c.split(":")[0] for c in reply.model_extra["rig"]["citations"]] == ["search"]


def test_the_mcp_client_runs_the_same_two_tool_conversation_through_mcp(base):
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    tools = [WEATHER["function"], SEARCH["function"]]

    async def converse():
        async with streamablehttp_client(f"{base}/mcp") as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            results, calls = None, []
            for _ in range(3):
                reply = await session.call_tool("ask", {"question": TURNS[0], "tools": tools,
                                                        **({"tool_results": results} if results else {})})
                assert not reply.isError, reply.content
                body = reply.structuredContent
                if "tool_calls" not in body:
                    return calls, body
                calls += [(c["name"], c["arguments"]) for c in body["tool_calls"]]
                results = [{"id": c["id"], "name": c["name"], "content": RESULTS[c["name"]]} for c in body["tool_calls"]]
            raise AssertionError("no answer after three rounds")

    calls, answer = anyio.run(converse)
    assert calls == [("weather", {"city": "Paris"}), ("search", {"query": "its height", "top_k": 3})]
    assert "330 metres" in answer["answer"] and [c.split(":")[0] for c in answer["citations"]] == ["search"]


def test_an_unknown_tool_through_mcp_is_the_tools_error(base):
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def call():
        async with streamablehttp_client(f"{base}/mcp") as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            return await session.call_tool("ask", {"question": TURNS[0], "tools": [WEATHER["function"]],
                                                   "tool_results": [{"id": "x", "name": "calc", "content": "4"}]})

    reply = anyio.run(call)
    assert reply.isError and "tool_results.0: needs the call's id and the name of a declared tool" in (
        reply.content[0].text)


def _searched(rig_rounds) -> list[str]:
    return [r["query"] if isinstance(r["query"], str) else r["query"]["text"] for r in rig_rounds if r["query"]]


def test_three_turns_with_the_openai_sdk_carry_history_to_the_searches(sdk):
    messages = []
    for question in TURNS:
        messages.append({"role": "user", "content": question})
        reply = sdk.chat.completions.create(model=MODEL, messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    searched = _searched(reply.model_extra["rig"]["rounds"])
    # the third turn's "its height": "it" is the Eiffel Tower, named two turns back
    assert "Eiffel Tower's height" in searched, searched
    assert len(messages) == 6


def test_three_turns_over_chat_and_json_rpc_carry_history(base):
    history: list[list[str]] = []
    for question in TURNS:
        result = httpx.post(f"{base}/chat", json={"question": question, "history": history},
                            timeout=hang_limit(30)).json()
        history.append([question, result["answer"]])
    assert "Eiffel Tower's height" in _searched(result["rounds"])
    rpc = httpx.post(f"{base}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "rig.ask", "params": {
        "question": TURNS[2], "history": history[:2]}}, timeout=hang_limit(30)).json()["result"]
    assert "Eiffel Tower's height" in _searched(rpc["rounds"])


def test_a_conversation_id_keeps_the_history_on_the_server(base, sdk):
    first = httpx.post(f"{base}/chat", json={"question": TURNS[0], "conversation": "new"},
                       timeout=hang_limit(30)).json()
    conversation = first["conversation"]
    assert conversation.startswith("conv_")
    second = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": TURNS[1]}],
                                         extra_body={"conversation": conversation})
    assert second.model_extra["rig"]["conversation"] == conversation
    third = httpx.post(f"{base}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "rig.ask", "params": {
        "question": TURNS[2], "conversation": conversation}}, timeout=hang_limit(30)).json()["result"]
    assert "Eiffel Tower's height" in _searched(third["rounds"])  # two kept turns reached the searches


def test_an_unknown_or_expired_conversation_is_a_404_on_every_entry_point(base, sdk):
    from openai import NotFoundError

    r = httpx.post(f"{base}/chat", json={"question": TURNS[0], "conversation": "conv_gone"}, timeout=hang_limit(10))
    assert r.status_code == 404 and r.json()["error"]["code"] == "conversation_not_found"
    assert "'conv_gone' is unknown or expired" in r.json()["error"]["message"]
    with pytest.raises(NotFoundError, match="unknown or expired"):
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": TURNS[0]}],
                                    extra_body={"conversation": "conv_gone"})
    rpc = httpx.post(f"{base}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "rig.ask", "params": {
        "question": TURNS[0], "conversation": "conv_gone"}}, timeout=hang_limit(10)).json()
    assert rpc["error"]["code"] == -32602 and rpc["error"]["data"]["code"] == "conversation_not_found"


def test_history_longer_than_any_budget_is_summarised_not_refused(base):
    history = [[f"Question {i} about the tower?", "An answer. " * 40] for i in range(40)]
    r = httpx.post(f"{base}/chat", json={"question": TURNS[0], "history": history}, timeout=hang_limit(30))
    assert r.status_code == 200, r.text
    fit = r.json()["history"]
    assert fit["older_turns"] > 0 and fit["kept_turns"] < 40
