"""Every request that validation lets through is answered: each field of each request schema gets
edge values (ints past 2^64, NaN and infinity, a lone surrogate, NUL bytes, text that is only
zero-width characters) and the answer is a 4xx naming the problem or a proper 200, never a 500.
In-process (TestClient, scripted model).
"""

from __future__ import annotations

import json
import typing

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

from fastapi.testclient import TestClient  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from rigkit.serve.app import create_app  # noqa: E402
from rigkit.serve.schemas import (  # noqa: E402
    AskParams,
    ChatCompletionRequest,
    ChatRequest,
    RetrieveRequest,
    SearchParams,
)
from tests.test_serve_protocol import LOCAL, QUESTION, make_service  # noqa: E402

EDGES = {
    "int past 2^64": 2**64 + 1,
    "int below -2^64": -(2**64) - 1,
    "NaN": float("nan"),
    "infinity": float("inf"),
    "lone surrogate": "\ud800",
    "surrogate in text": "Who built \udfff the tower?",
    "NUL bytes": "Who\x00 built\x00 it?",
    "zero-width only": "\u200b\u200c\u2060\ufeff",
    "empty": "",
}

# endpoint -> (schema, a body it answers with 200)
ENDPOINTS = {
    "/chat": (ChatRequest, {"question": QUESTION}),
    "/v1/chat/completions": (ChatCompletionRequest, {"messages": [{"role": "user", "content": QUESTION}]}),
    "/retrieve": (RetrieveRequest, {"queries": ["Eiffel"]}),
    "rig.ask": (AskParams, {"question": QUESTION}),
    "rig.search": (SearchParams, {"query": "Eiffel"}),
}
# where a nested schema is reached in a body, with the value it is reached through
NESTED = {"messages": [{"role": "user", "content": QUESTION}],
          "tools": [{"type": "function", "function": {"name": "search"}}],
          "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}


def _model_of(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in typing.get_args(annotation) if (m := _model_of(a))), None)


def _holds_list(annotation) -> bool:
    return typing.get_origin(annotation) is list or any(_holds_list(a) for a in typing.get_args(annotation))


def field_paths(model: type[BaseModel], prefix: tuple = ()) -> list[tuple]:
    """Every leaf field of `model` as a path into a body: ("options", "seed"), ("messages", 0, "content")."""
    paths = []
    for name, info in model.model_fields.items():
        nested = _model_of(info.annotation)
        if nested is not None and name != "content":
            index = (0,) if _holds_list(info.annotation) else ()
            paths += field_paths(nested, prefix + (name, *index))
        else:
            paths.append(prefix + (name,))
    return paths


def with_value(body: dict, path: tuple, value) -> dict:
    """A copy of `body` with `value` at `path`, the nested objects on the way taken from NESTED."""
    body = json.loads(json.dumps(body))
    node = body
    for i, key in enumerate(path[:-1]):
        if isinstance(node, dict) and key not in node:
            fill = NESTED.get(key, [{}] if path[i + 1] == 0 else {})
            node[key] = json.loads(json.dumps(fill))
        node = node[key]
    node[path[-1]] = value
    return body


CASES = [(endpoint, path) for endpoint, (model, _) in ENDPOINTS.items() for path in field_paths(model)]


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(make_service(), mcp=False), base_url=LOCAL, raise_server_exceptions=False) as c:
        yield c


def send(client: TestClient, endpoint: str, body: dict):
    raw = json.dumps(body)  # NaN and Infinity as JS literals, surrogates as \ud800 escapes
    if endpoint.startswith("rig."):
        raw = json.dumps({"jsonrpc": "2.0", "id": 1, "method": endpoint, "params": body})
        endpoint = "/rpc"
    return client.post(endpoint, content=raw.encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize(("endpoint", "path"), CASES, ids=[f"{e}:{'.'.join(map(str, p))}" for e, p in CASES])
def test_each_field_edge_value_is_answered_or_refused(client, endpoint, path):
    base = ENDPOINTS[endpoint][1]
    wrong = []
    for label, value in EDGES.items():
        for shaped in ([value] if path[-1] in ("queries", "stop") else []) + [value]:
            r = send(client, endpoint, with_value(base, path, shaped))
            answer = r.json()
            error = answer.get("error") if isinstance(answer, dict) else None
            if r.status_code >= 500 or (error and error.get("code") == -32603):
                wrong.append(f"{label} {shaped!r}: {r.status_code} {r.text[:200]}")
            elif r.status_code >= 400 and not error.get("message"):
                wrong.append(f"{label}: {r.status_code} without a message")
    assert not wrong, "\n".join(wrong)


def test_the_field_list_covers_nested_schemas():
    paths = {".".join(map(str, p)) for e, p in CASES if e == "/v1/chat/completions"}
    assert {"options.seed", "messages.0.content", "tools.0.function.name", "seed", "n", "stop"} <= paths


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("/chat", {"question": "\ud800"}, "question"),
        ("/chat", {"question": "\u200b\u200b"}, "question"),
        ("/chat", {"question": QUESTION, "options": {"seed": 2**64 + 1}}, "options.seed"),
        ("/chat", {"question": QUESTION, "options": {"threshold": float("nan")}}, "options.threshold"),
        ("/chat", {"question": QUESTION, "history": [["\udc00", "a"]]}, "history"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ufeff"}]}, "messages.0.content"),
        ("/v1/chat/completions", {"model": "\ud800", "messages": [{"role": "user", "content": QUESTION}]}, "model"),
        ("/v1/chat/completions", {"seed": 2**63, "messages": [{"role": "user", "content": QUESTION}]}, "seed"),
        ("/v1/chat/completions", {"temperature": float("inf"), "messages": [{"role": "user", "content": "q"}]},
         "temperature"),
        ("/retrieve", {"queries": ["\u200b"]}, "queries"),
        ("/retrieve", {"queries": ["\ud800"]}, "queries"),
    ],
)
def test_what_cannot_be_answered_is_a_422_naming_the_field(client, endpoint, body, param):
    r = send(client, endpoint, body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["message"]


def test_a_seed_in_int64_range_is_answered(client):
    r = send(client, "/chat", {"question": QUESTION, "options": {"seed": 2**63 - 1}})
    assert r.status_code == 200 and r.json()["answer"]


def test_rpc_with_an_unencodable_id_or_method_is_an_invalid_request(client):
    for call in ({"jsonrpc": "2.0", "id": "\ud800", "method": "rig.models"},
                 {"jsonrpc": "2.0", "id": 1, "method": "rig.\udfff"}):
        r = client.post("/rpc", content=json.dumps(call).encode(), headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.json()["error"]["code"] == -32600, r.text


# -- OpenAI fields rigkit does not do, and the happy path continued --------------------------------
@pytest.mark.parametrize(
    ("extra", "param"),
    [({"n": 2}, "n"), ({"logprobs": True}, "logprobs"), ({"top_logprobs": 5}, "top_logprobs"),
     ({"tool_choice": "required"}, "tool_choice"),
     ({"tool_choice": {"type": "function", "function": {"name": "search"}}}, "tool_choice")],
)
def test_unsupported_openai_parameters_are_refused_by_name(client, extra, param):
    body = {"messages": [{"role": "user", "content": QUESTION}],
            "tools": [{"type": "function", "function": {"name": "search"}}], **extra}
    r = send(client, "/v1/chat/completions", body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == param and param in r.json()["error"]["message"]


@pytest.mark.parametrize("extra", [{"n": 1}, {"logprobs": False}, {"tool_choice": "auto"}, {"tool_choice": "none"}])
def test_the_values_rigkit_does_are_accepted(client, extra):
    body = {"messages": [{"role": "user", "content": QUESTION}], **extra}
    assert send(client, "/v1/chat/completions", body).status_code == 200


def test_a_follow_up_question_after_a_finished_tool_round_is_answered(client):
    """The openai-SDK tool loop, continued with a second question in the same conversation."""
    tools = NESTED["tools"]
    messages = [{"role": "user", "content": QUESTION}]
    first = send(client, "/v1/chat/completions", {"messages": messages, "tools": tools}).json()
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages += [first["choices"][0]["message"],
                 {"role": "tool", "tool_call_id": call["id"], "content": "The Eiffel Tower is 330 metres tall."}]
    final = send(client, "/v1/chat/completions", {"messages": messages, "tools": tools}).json()
    assert final["choices"][0]["finish_reason"] == "stop"
    messages += [final["choices"][0]["message"], {"role": "user", "content": "And who designed it?"}]
    follow_up = send(client, "/v1/chat/completions", {"messages": messages, "tools": tools})
    assert follow_up.status_code == 200, follow_up.text
    assert follow_up.json()["choices"][0]["finish_reason"] == "tool_calls"  # a new need, a new round
    # a tool reply after the new question still has to answer a call made after it
    stray = messages + [{"role": "tool", "tool_call_id": call["id"], "content": "late"}]
    r = send(client, "/v1/chat/completions", {"messages": stray, "tools": tools})
    assert r.status_code == 422 and call["id"] in r.json()["error"]["message"]


def test_rig_search_is_capped_like_retrieve(client):
    from rigkit.serve.schemas import MAX_QUERIES

    over = ["Eiffel"] * (MAX_QUERIES + 1)
    assert send(client, "/retrieve", {"queries": over}).status_code == 422
    r = send(client, "rig.search", {"queries": over})
    assert r.json()["error"]["code"] == -32602 and str(MAX_QUERIES) in r.json()["error"]["message"]
    assert len(send(client, "rig.search", {"queries": ["Eiffel"] * MAX_QUERIES}).json()["result"]) == MAX_QUERIES
