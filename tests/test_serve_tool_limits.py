"""Hostile client tool schemas and arguments against a real server (uvicorn on a loopback port,
the scripted two-tool model, one server per module): nothing is fetched, every limit is a 422
naming it, and a check that runs to its time budget leaves /health answering meanwhile."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from rigkit.serve.app import create_app  # noqa: E402
from tests.conftest import hang_limit, local_http_server  # noqa: E402
from tests.test_search_r1_protocol import serving  # noqa: E402
from tests.test_serve_tools import WEATHER, two_tool_service  # noqa: E402

QUESTION = "How tall is the Eiffel Tower?"


@pytest.fixture(scope="module")
def base():
    with serving(create_app(two_tool_service(), mcp=False)) as url:
        yield url


def tool(parameters) -> dict:
    return {"type": "function", "function": {"name": "lookup", "description": "Look it up.", "parameters": parameters}}


def with_call(arguments: str, name: str = "lookup") -> list[dict]:
    """A conversation whose assistant turn called `name` with `arguments` (JSON text)."""
    return [{"role": "user", "content": QUESTION},
            {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                                  "function": {"name": name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a result"}]


def post(base: str, tools: list[dict], messages: list[dict] | None = None, timeout: float | None = None):
    body = {"messages": messages or [{"role": "user", "content": QUESTION}], "tools": tools}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=timeout or hang_limit(2))


def refused(reply, param: str, *words: str) -> str:
    """The one-line 422 message of `reply`, naming `param` and holding each of `words`."""
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error
    for word in words:
        assert word in error["message"], error["message"]
    return error["message"]


class Recorder(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.hits.append(self.path)
        body = json.dumps({"type": "object"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


# -- 1. a schema never fetches ----------------------------------------------------------------------
def test_a_remote_reference_is_refused_and_never_fetched(base):
    with local_http_server(Recorder, hits=[]) as listener:
        remote = f"{listener.url}/s.json"
        cases = [({"$ref": remote}, remote),
                 ({"$id": f"{listener.url}/", "type": "object", "properties": {"a": {"$ref": "s.json"}}}, "s.json"),
                 ({"type": "object", "properties": {"a": {"$dynamicRef": remote}}}, remote)]
        for parameters, named in cases:
            reply = post(base, [tool(parameters)], with_call('{"a": 1}'))
            refused(reply, "tools.0.function.parameters", repr(named), "points outside the schema")
        # an `$id` that moves the base URI to the listener: local references still stay inside
        moved = {"$id": f"{listener.url}/base.json", "type": "object",
                 "properties": {"a": {"$ref": "#/$defs/missing"}}}
        refused(post(base, [tool(moved)], with_call('{"a": 1}')), "tools.0.function.parameters",
                "'#/$defs/missing'", "points at nothing in the schema")
        assert listener.hits == []


def test_a_file_reference_is_refused_by_name(base):
    reply = post(base, [tool({"$ref": "file:///etc/passwd"})], with_call("{}"))
    refused(reply, "tools.0.function.parameters", "'file:///etc/passwd'", "nothing is fetched")


def test_local_references_resolve_inside_the_schema(base):
    node = {"$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
    tree: dict = {"name": "leaf"}
    for _ in range(8):
        tree = {"name": "inner", "children": [tree]}
    reply = post(base, [tool(node), WEATHER], with_call(json.dumps(tree)))
    assert reply.status_code == 200, reply.text
    wrong = {"name": "inner", "children": [{"name": 7}]}
    refused(post(base, [tool(node)], with_call(json.dumps(wrong))), "messages.1.tool_calls.0.function.arguments",
            "at children/0/name", "7 is not of type 'string'")


# -- 3. what answered 500 with a traceback is a 422 naming the limit ----------------------------------
def nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("parameters, words", [
    (nested(200), ["nested deeper than 32 levels"]),
    ({"$ref": "#"}, ["references nest deeper than 32 levels", "'#'"]),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}, ["'#/$defs/nope'", "points at nothing"]),
    ({"type": "object", "properties": {"a": {"$ref": "file:///tmp/s.json"}}}, ["'file:///tmp/s.json'"]),
], ids=["200-levels", "ref-loop", "missing-ref", "file-ref"])
def test_schemas_past_a_limit_are_422_naming_it(base, parameters, words):
    assert len(json.dumps(nested(200))) > 5_000
    reply = post(base, [tool(parameters)], with_call('{"a": "x"}'))
    assert "Traceback" not in reply.text
    refused(reply, "tools.0.function.parameters", *words)


@pytest.mark.parametrize("arguments, words", [
    ("[" * 50_000, ["nested deeper than 32 levels"]),
    ('{"city": ' + "[" * 40 + "]" * 40 + "}", ["nested deeper than 32 levels"]),
    ('{"city": "' + "x" * 70_000 + '"}', ["70012 bytes, over the limit of 65536"]),
    ('{"city": NaN}', ["not strict JSON", "NaN"]),  # 11: Python's json reads these; JSON has none
    ('{"city": Infinity}', ["not strict JSON", "Infinity"]),
    ('{"city": -Infinity}', ["not strict JSON", "-Infinity"]),
], ids=["50000-brackets", "40-levels", "70-KB", "NaN", "Infinity", "-Infinity"])
def test_arguments_past_a_limit_or_not_strict_json_are_422(base, arguments, words):
    reply = post(base, [WEATHER], with_call(arguments, "weather"))
    refused(reply, "messages.1.tool_calls.0.function.arguments", "the arguments of 'weather' are", *words)


# -- 2. a check cannot freeze the server -------------------------------------------------------------
def exponential_schema(levels: int = 30) -> dict:
    """Each level tries both branches of an `anyOf` over the next: 2**levels paths for a value
    that fails them all, from a schema of a few KB."""
    defs = {f"a{i}": {"anyOf": [{"$ref": f"#/$defs/a{i + 1}"}, {"$ref": f"#/$defs/a{i + 1}", "minimum": 0}]}
            for i in range(levels)}
    defs[f"a{levels}"] = {"type": "string"}
    return {"$defs": defs, "type": "object", "properties": {"x": {"$ref": "#/$defs/a0"}}}


def test_health_answers_while_a_hostile_check_runs_to_its_budget(base):
    outcome: dict = {}

    def hostile() -> None:
        outcome["start"] = time.monotonic()
        outcome["reply"] = post(base, [tool(exponential_schema())], with_call('{"x": 1}'), timeout=hang_limit(3))
        outcome["end"] = time.monotonic()

    asking = threading.Thread(target=hostile)
    asking.start()
    during = []  # health calls that started and ended while the hostile request was in flight
    with httpx.Client(timeout=hang_limit(2)) as http:
        while asking.is_alive():
            started = time.monotonic()
            assert http.get(f"{base}/health").status_code == 200
            during.append((started, time.monotonic()))
            time.sleep(0.05)
    asking.join()
    refused(outcome["reply"], "messages.1.tool_calls.0.function.arguments",
            "took over 1 s")
    answered = [(s, e) for s, e in during if s > outcome["start"] and e < outcome["end"]]
    assert len(answered) >= 2, (during, outcome)


def test_a_backtracking_pattern_is_stopped_at_its_time_limit(base):
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a|aa)+$"}}}
    reply = post(base, [tool(schema)], with_call(json.dumps({"name": "a" * 60 + "b"})), timeout=hang_limit(3))
    refused(reply, "messages.1.tool_calls.0.function.arguments", "the pattern '^(a|aa)+$'",
            "took over 0.1 s")
    fine = post(base, [tool(schema)], with_call(json.dumps({"name": "a" * 60})))
    assert fine.status_code != 422, fine.text


def test_unique_items_is_one_pass_with_json_schema_equality():
    from rigkit.serve import tool_schemas

    schema = {"type": "array", "uniqueItems": True}
    distinct = [{"a": i, "b": [i, str(i)]} for i in range(6_000)]
    assert tool_schemas.first_error(schema, distinct) is None
    assert tool_schemas.first_error(schema, [*distinct, {"b": [5, "5"], "a": 5}]) is not None  # keys unordered
    assert tool_schemas.first_error(schema, [1, 1.0]) is not None  # one number
    assert tool_schemas.first_error(schema, [1, True]) is None and tool_schemas.first_error(schema, [0, False]) is None
    assert tool_schemas.first_error(schema, [[1, 2], [2, 1]]) is None  # arrays keep their order
