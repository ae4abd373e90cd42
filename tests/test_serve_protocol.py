"""The serving layer's protocol translation, in-process (FastAPI TestClient, scripted model).

The model is `rigkit.testing.ScriptedGenerator`, replaying the same three segments for every
question: a confident sentence, a sentence with one unsure token (the `prob` decider fires and
the segment is regenerated after retrieval), and the regenerated sentence that ends the answer.
The real-model, real-server tests are in test_serve_server.py.
"""

from __future__ import annotations

import copy
import json
import re
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

from fastapi.testclient import TestClient  # noqa: E402

from rigkit.config import RunConfig  # noqa: E402
from rigkit.serve.app import create_app  # noqa: E402
from rigkit.serve.service import RigService  # noqa: E402
from rigkit.serve.worker import Busy, CancelledJob, Draining, ModelWorker  # noqa: E402
from rigkit.streaming import Cancelled, StreamEvent, TokenStream  # noqa: E402
from rigkit.testing import DictRetriever, ScriptedGenerator, make_segment  # noqa: E402
from rigkit.text import strip_citations  # noqa: E402
from rigkit.trace import Hit  # noqa: E402

QUESTION = "How tall is the Eiffel Tower?"
LOCAL = "http://127.0.0.1"  # a loopback server answers to this Host, not to TestClient's "testserver"
HITS = [Hit("c1", "d1", "Eiffel Tower", "The Eiffel Tower is 330 metres tall and stands in Paris.", 1.0)]


class LoopingScript(ScriptedGenerator):
    """The same script for every question (reset starts it over), like a greedy model."""

    def __init__(self, segments):
        super().__init__(segments)
        self.script = [copy.deepcopy(s) for s in self.segments]
        self.calls = 0

    def reset(self, seed=None):
        self.segments = [copy.deepcopy(s) for s in self.script]

    def next_segment(self, prompt, stop, max_new_tokens, on_token=None):
        self.calls += 1
        return super().next_segment(prompt, stop, max_new_tokens, on_token)


def local_client(app) -> TestClient:
    return TestClient(app, base_url=LOCAL)


def script():
    return [
        make_segment("Paris is the capital of France."),
        make_segment("The tower is 330 metres tall.", probs=[0.9, 0.9, 0.9, 0.05, 0.9, 0.9]),
        make_segment("The Eiffel Tower is 330 metres tall.", finish_reason="end_of_turn"),
    ]


def make_service(**kwargs):
    config = RunConfig.from_dict({"decider": {"name": "prob", "threshold": 0.3}})
    generator = kwargs.pop("generator", None) or LoopingScript(script())
    return RigService(config, generator=generator, retriever=DictRetriever({}, default=HITS), **kwargs)


@pytest.fixture
def service():
    return make_service()


@pytest.fixture
def client(service):
    with local_client(create_app(service)) as c:
        yield c


def sse_events(response) -> list[tuple[str, str]]:
    """(event, data) pairs of a server-sent event stream."""
    events, name, data = [], "message", []
    for line in response.iter_lines():
        if not line:
            if data:
                events.append((name, "\n".join(data)))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    if data:
        events.append((name, "\n".join(data)))
    return events


# -- /chat ---------------------------------------------------------------------------------------
def test_chat_returns_the_rig_result_json(client):
    body = client.post("/chat", json={"question": QUESTION}).json()
    assert body["answer"] == "Paris is the capital of France. The Eiffel Tower is 330 metres tall. [[citation:c1]]"
    assert body["used_retrieval_times"] == 1 and body["citations"] == ["c1"]
    assert {"rounds", "tokens", "timings", "low_confidence"} <= set(body)


def test_chat_stream_sends_tokens_a_retract_rounds_and_the_result(client):
    with client.stream("POST", "/chat", json={"question": QUESTION, "stream": True}) as r:
        events = sse_events(r)
    kinds = [name for name, _ in events]
    assert kinds[-1] == "result" and kinds.count("round") == 3
    text = ""
    for name, data in events:
        if name == "token":
            text += json.loads(data)["text"]
        elif name == "retract":
            gone = json.loads(data)
            assert text.endswith(gone["text"]) and gone["chars"] == len(gone["text"])
            text = text[: -gone["chars"]]
    assert "retract" in kinds  # the flagged sentence was shown live, then taken back
    result = json.loads(events[-1][1])
    assert text == "Paris is the capital of France. The Eiffel Tower is 330 metres tall."
    assert result["answer"].startswith(text)


def test_chat_stream_notes_a_dropped_rewrite_and_shows_the_flagged_sentence_once():
    repeat = make_segment("Paris is the capital of France.", finish_reason="end_of_turn")  # the rewrite adds nothing
    service = make_service(generator=LoopingScript([*script()[:2], repeat]))
    with local_client(create_app(service)) as client, \
            client.stream("POST", "/chat", json={"question": QUESTION, "stream": True}) as r:
        events = sse_events(r)
    kinds = [name for name, _ in events]
    assert "retract" not in kinds and kinds.count("note") == 1
    note = json.loads(events[kinds.index("note")][1])["text"]
    assert note == "kept the earlier sentence: the rewrite repeats accepted text"
    text = "".join(json.loads(data)["text"] for name, data in events if name == "token")
    assert text == "Paris is the capital of France. The tower is 330 metres tall."


def test_held_token_stream_never_retracts():
    events = []
    service = make_service()
    stream = TokenStream(events.append, hold=True)
    from rigkit.build import build_controller

    controller = build_controller(service.config, generator=service.generator, retriever=service.retriever,
                                  callbacks=[stream])
    result = controller.run(QUESTION)
    assert all(e.kind == "token" for e in events)
    assert "".join(e.text for e in events) == result.rounds[-1].draft
    assert len(events) > 3  # released word by word, not as one block


def test_a_stopped_stream_aborts_the_run_between_tokens():
    seen = []
    stop_after = 3

    def emit(event: StreamEvent) -> None:
        seen.append(event)

    stream = TokenStream(emit, should_stop=lambda: len(seen) >= stop_after)
    service = make_service()
    from rigkit.build import build_controller

    controller = build_controller(service.config, generator=service.generator, retriever=service.retriever,
                                  callbacks=[stream])
    with pytest.raises(Cancelled):
        controller.run(QUESTION)
    assert len(seen) == stop_after


# -- OpenAI-compatible ---------------------------------------------------------------------------
def test_chat_completion_carries_the_cited_answer_and_rig_metadata(client):
    body = client.post("/v1/chat/completions", json={
        "model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": QUESTION}],
        "some_future_field": {"ignored": True},
    }).json()
    choice = body["choices"][0]
    assert body["object"] == "chat.completion" and choice["finish_reason"] == "stop"
    assert choice["message"]["content"].endswith("[[citation:c1]]")
    assert body["rig"]["used_retrieval_times"] == 1 and body["rig"]["citations"] == ["c1"]
    assert body["usage"]["completion_tokens"] == body["rig"]["tokens"]["generated"]


def test_chat_completion_reports_what_the_grounding_check_flagged(client):
    rig = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": QUESTION}]}).json()["rig"]
    # "France" is in no passage the model saw; 330 metres is
    assert rig["suspicious"] == [{"sentence": 0, "text": "Paris is the capital of France.", "facts": ["France"]}]
    assert rig["removed_citations"] == [] and isinstance(rig["warnings"], list)


def test_chat_completion_stream_is_openai_chunks_with_usage_last(client):
    request = {"messages": [{"role": "user", "content": QUESTION}], "stream": True,
               "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=request) as r:
        frames = [data for _, data in sse_events(r)]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "stop"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == "Paris is the capital of France. The Eiffel Tower is 330 metres tall."
    assert finish[0]["rig"]["citations"] == ["c1"]


def test_stop_strings_cut_the_answer(client):
    body = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": QUESTION}], "stop": ["capital"]}).json()
    assert body["choices"][0]["message"]["content"] == "Paris is the "


def tools_request(messages, **extra):
    return {"messages": messages, "tools": [{"type": "function", "function": {
        "name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}], **extra}


def test_client_side_tool_loop_suspends_then_continues_the_same_answer(client, service):
    messages = [{"role": "user", "content": QUESTION}]
    first = client.post("/v1/chat/completions", json=tools_request(messages)).json()
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "search" and json.loads(call["function"]["arguments"])["query"]
    assert choice["message"]["content"] == "Paris is the capital of France."
    calls_before = service.generator.calls
    messages += [choice["message"], {"role": "tool", "tool_call_id": call["id"],
                                     "content": "The Eiffel Tower is 330 metres tall and stands in Paris."}]
    final = client.post("/v1/chat/completions", json=tools_request(messages)).json()
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["choices"][0]["message"]["content"] == (  # the citation names the tool
        f"Paris is the capital of France. The Eiffel Tower is 330 metres tall. [[citation:search:{call['id']}]]")
    # the two segments written before the tool call are not generated again: the paused run goes on
    assert service.generator.calls - calls_before == 1


def test_turns_caps_the_tool_rounds(client):
    body = client.post("/v1/chat/completions", json=tools_request(
        [{"role": "user", "content": QUESTION}], turns=0)).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["rig"]["low_confidence"] is True and body["rig"]["used_retrieval_times"] == 0


def test_tool_results_shown_to_the_model_are_capped_with_a_visible_note():
    service = make_service(tool_result_tokens=12)
    with local_client(create_app(service, mcp=False)) as client:
        messages = [{"role": "user", "content": QUESTION}]
        first = client.post("/v1/chat/completions", json=tools_request(messages)).json()
        call = first["choices"][0]["message"]["tool_calls"][0]
        long_result = " ".join(f"word{i}" for i in range(200))
        messages += [first["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": long_result}]
        client.post("/v1/chat/completions", json=tools_request(messages))
    prompt = "".join(piece.text for piece in service.generator.prompts[-1])
    assert "word5 " in prompt and "word150" not in prompt and "[truncated]" in prompt


def test_tool_call_stream_follows_the_openai_delta_format(client):
    with client.stream("POST", "/v1/chat/completions",
                       json=tools_request([{"role": "user", "content": QUESTION}], stream=True)) as r:
        frames = [data for _, data in sse_events(r)]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"][0]["delta"].get("tool_calls")]
    assert all(d["index"] == 0 for d in deltas)
    assert deltas[0]["id"].startswith("call_") and deltas[0]["function"]["name"] == "search"
    assert all("id" not in d and "name" not in d["function"] for d in deltas[1:])
    arguments = "".join(d["function"].get("arguments", "") for d in deltas)
    assert "query" in json.loads(arguments) and len(deltas) > 2  # the arguments came in fragments
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_models_lists_the_loaded_model(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and body["data"][0]["id"] == "smollm2-135m-instruct"


# -- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/chat", b"{not json", 400, None),
        ("/v1/chat/completions", b'{"messages": [', 400, None),
        ("/chat", {"question": 42}, 422, "question"),
        ("/chat", {"question": "   "}, 422, "question"),
        ("/chat", {"question": "q", "options": {"temperature": "hot"}}, 422, "options.temperature"),
        ("/chat", {"question": "q", "options": {"decider": "oracle"}}, 422, "options.decider"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 422, "messages.0.content"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}]}, 422, "messages.0.content"),
        ("/v1/chat/completions", {"messages": []}, 422, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}], "turns": "x"}, 422, "turns"),
        ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user", "content": "q"}]}, 404, "model"),
        ("/retrieve", {"queries": "one", "topk": 3}, 422, "queries"),
    ],
)
def test_bad_input_gets_a_clear_status_and_names_the_field(client, path, body, status, field):
    if isinstance(body, bytes):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"]
    if field is not None:
        assert error["param"] == field and field in error["message"]


def test_tool_messages_must_answer_the_calls(client):
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}]
    r = client.post("/v1/chat/completions", json=tools_request(messages))
    assert r.status_code == 422 and "call_1" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "q"}], "tools": [
        {"type": "function", "function": {"name": "calc", "parameters": {"type": "no-such-type"}}}]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "tools.0.function.parameters"


def test_body_over_the_limit_is_413():
    with local_client(create_app(make_service(), max_body_bytes=200, mcp=False)) as client:
        r = client.post("/chat", json={"question": "x" * 500})
        assert r.status_code == 413 and "200 bytes" in r.json()["error"]["message"]
        assert client.post("/chat", json={"question": QUESTION}).status_code == 200


def test_bearer_auth_guards_every_route():
    with local_client(create_app(make_service(), api_key="s3cret", mcp=False)) as client:
        assert client.get("/v1/models").status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200


# -- JSON-RPC and /retrieve ----------------------------------------------------------------------
def test_rpc_single_batch_notification_and_error_codes(client):
    single = client.post("/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "rig.ask",
                                       "params": {"question": QUESTION}}).json()
    assert single["id"] == 1 and single["result"]["citations"] == ["c1"]
    batch = client.post("/rpc", json=[
        {"jsonrpc": "2.0", "id": "a", "method": "rig.models"},
        {"jsonrpc": "2.0", "id": "b", "method": "rig.search", "params": {"query": "Eiffel", "topk": 1}},
        {"jsonrpc": "2.0", "method": "rig.models"},  # a notification: no reply
        {"jsonrpc": "2.0", "id": "c", "method": "rig.nope"},
        {"jsonrpc": "2.0", "id": "d", "method": "rig.ask", "params": {"question": ""}},
        {"id": "e", "method": "rig.models"},
    ]).json()
    by_id = {r["id"]: r for r in batch}
    assert set(by_id) == {"a", "b", "c", "d", "e"}
    assert by_id["a"]["result"] == ["smollm2-135m-instruct"]
    assert by_id["b"]["result"][0]["id"] == "c1"
    assert by_id["c"]["error"]["code"] == -32601
    assert by_id["d"]["error"]["code"] == -32602
    assert by_id["e"]["error"]["code"] == -32600
    parse = client.post("/rpc", content=b"{oops", headers={"content-type": "application/json"}).json()
    assert parse["error"]["code"] == -32700 and parse["id"] is None
    assert client.post("/rpc", json=[]).json()["error"]["code"] == -32600


def test_retrieve_answers_per_query_lists(client):
    body = client.post("/retrieve", json={"queries": ["Eiffel", "Paris"], "topk": 1}).json()
    assert len(body["result"]) == 2
    assert set(body["result"][0][0]) >= {"id", "title", "text", "score"}


# -- the worker ----------------------------------------------------------------------------------
def test_worker_bounds_its_queue_frees_cancelled_slots_and_drains():
    worker = ModelWorker(max_queue=1)
    release = threading.Event()
    running = worker.submit(lambda job: release.wait(5) and "first")
    while worker.depth != 1 or running.future.running() is False and not worker._running:
        pass
    waiting = worker.submit(lambda job: "second")
    with pytest.raises(Busy) as busy:
        worker.submit(lambda job: "third")
    assert busy.value.retry_after >= 1
    worker.cancel(waiting)  # the client went away: its slot is free at once
    assert isinstance(waiting.future.exception(timeout=1), CancelledJob)
    last = worker.submit(lambda job: "fourth")
    worker.drain()
    with pytest.raises(Draining):
        worker.submit(lambda job: "refused")
    release.set()
    worker.close(timeout=5)
    assert running.future.result(timeout=1) == "first" and last.future.result(timeout=1) == "fourth"


# -- several searches in one assistant message ---------------------------------------------------

TWO_MARKERS = "The tower <retrieve>Eiffel Tower height</retrieve> was built by <retrieve>Eiffel Tower architect</retrieve>"
RESULTS = {"Eiffel Tower height": "The Eiffel Tower is 330 metres tall.",
           "Eiffel Tower architect": "Gustave Eiffel's company designed and built the tower."}


def two_marker_service():
    config = RunConfig.from_dict({"decider": {"name": "marker"}, "query": {"mode": "marker"}})
    generator = LoopingScript([make_segment(TWO_MARKERS),
                               make_segment("It is 330 metres tall.", finish_reason="end_of_turn")])
    return RigService(config, generator=generator, retriever=DictRetriever({}, default=HITS))


def sdk_client(client):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{LOCAL}/v1", api_key="unused", http_client=client, max_retries=0)


def tool_conversation(sdk, model: str, question: str, tools: list[dict], results: dict[str, str], turns: int = 3):
    """Ask `question`; answer each tool call from `results` (by tool name) and ask on, as a client
    does, for at most `turns` replies -> (the last reply, the (name, arguments) of each call)."""
    messages = [{"role": "user", "content": question}]
    calls = []
    for _ in range(turns):
        reply = sdk.chat.completions.create(model=model, messages=messages, tools=tools)
        choice = reply.choices[0]
        if choice.finish_reason != "tool_calls":
            break
        messages.append(choice.message.model_dump(exclude_none=True))
        for call in choice.message.tool_calls:
            calls.append((call.function.name, json.loads(call.function.arguments)))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": results[call.function.name]})
    return reply, calls


SEARCH_TOOL = [{"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]


def test_two_needs_in_one_segment_are_two_tool_calls_in_one_message_and_both_results_are_read():
    service = two_marker_service()
    with local_client(create_app(service, mcp=False)) as client:
        sdk = sdk_client(client)
        messages = [{"role": "user", "content": QUESTION}]
        reply = sdk.chat.completions.create(model=service.model_name, messages=messages, tools=SEARCH_TOOL)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        queries = [json.loads(c.function.arguments)["query"] for c in calls]
        assert queries == ["Eiffel Tower height", "Eiffel Tower architect"]
        assert len({c.id for c in calls}) == 2
        messages.append(choice.message.model_dump(exclude_none=True))
        for call, query in reversed(list(zip(calls, queries))):  # replies in any order, matched by id
            messages.append({"role": "tool", "tool_call_id": call.id, "content": RESULTS[query]})
        calls_before = service.generator.calls
        final = sdk.chat.completions.create(model=service.model_name, messages=messages, tools=SEARCH_TOOL)
    assert final.choices[0].finish_reason == "stop"
    content = final.choices[0].message.content
    assert strip_citations(content).strip().endswith("It is 330 metres tall.")
    # the sentence was finished with the tool results in context, so it may cite one of them
    assert re.search(r"\[\[citation:search:call_\w+\]\]$", content)
    assert service.generator.calls - calls_before == 1  # the marker segment was replayed
    prompt = "".join(piece.text for piece in service.generator.prompts[-1])
    assert all(text in prompt for text in RESULTS.values())  # both results were injected
    rig = final.model_extra["rig"]
    assert rig["used_retrieval_times"] == 1
    assert rig["rounds"][0]["injected"] == [f"search:{c.id}" for c in calls]


def test_several_tool_calls_stream_each_under_its_own_index():
    service = two_marker_service()
    with local_client(create_app(service, mcp=False)) as client:
        stream = sdk_client(client).chat.completions.create(
            model=service.model_name, messages=[{"role": "user", "content": QUESTION}], tools=SEARCH_TOOL,
            stream=True)
        chunks = list(stream)
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    by_index: dict[int, dict] = {}
    for d in deltas:  # how OpenAI clients assemble streamed calls
        call = by_index.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
        assert (d.id is not None) == (call["id"] is None)  # the id comes once, in the call's first delta
        call["id"] = call["id"] or d.id
        call["name"] = call["name"] or (d.function.name if d.function else None)
        call["arguments"] += (d.function.arguments or "") if d.function else ""
    assert sorted(by_index) == [0, 1]
    assert [json.loads(by_index[i]["arguments"])["query"] for i in (0, 1)] == list(RESULTS)
    assert all(c["name"] == "search" and c["id"].startswith("call_") for c in by_index.values())
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_one_need_is_one_tool_call_whatever_the_query_builder():
    from rigkit.serve.paused import _needs
    from rigkit.trace import Decision

    one = Decision(True, 1.0, "", intents=["Eiffel Tower height"])
    assert _needs(one) == [one]
    two = Decision(True, 1.0, "", intents=["height", "architect"])
    assert [d.intents for d in _needs(two)] == [["height"], ["architect"]]


def test_mcp_ask_reports_the_answer_and_the_grounding_checks():
    pytest.importorskip("mcp")
    with local_client(create_app(make_service())) as client:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "ask", "arguments": {"question": QUESTION}}}
        r = client.post("/mcp", json=body, headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code == 200, r.text
    result = r.json()["result"]["structuredContent"]
    assert result["citations"] == ["c1"] and result["used_retrieval_times"] == 1
    assert [s["facts"] for s in result["suspicious"]] == [["France"]] and "warnings" in result
