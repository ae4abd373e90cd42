"""What a hostile or careless client can send a running `rigkit serve` (a real process over the
scripted model, `tests.scripted_serve`, shared by the module): a history too long to fit is
refused before any model work, every route answers in its own error shape, and nothing is a 500.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import (
    hang_limit,
    local_http_server,
    serving_module,
)

httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.slow  # starts `rigkit serve` processes

QUESTION = "How tall is the Eiffel Tower?"



@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """One scripted `rigkit serve` with a small history budget, for the whole module."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serving_module("tests.scripted_serve", "--set", "context.max_history_tokens=64", log=log) as url:
        yield url


def _pairs(n: int) -> list[list[str]]:
    return [[f"Question {i}?", f"Answer {i}."] for i in range(n)]


# -- 1. the history is bounded before any model call ---------------------------------------------
def test_a_history_of_a_thousand_turns_is_refused_with_413(base):
    r = httpx.post(f"{base}/chat", json={"question": QUESTION, "history": _pairs(1000)}, timeout=hang_limit(2))
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert error["param"] == "history" and error["code"] == "history_too_large"
    assert "1000 earlier turns" in error["message"] and "256" in error["message"]


def test_a_history_of_too_many_bytes_is_refused_with_413(base):
    big = [["Tell me more.", "x" * 100_000]] * 3
    r = httpx.post(f"{base}/chat", json={"question": QUESTION, "history": big}, timeout=hang_limit(2))
    assert r.status_code == 413 and "bytes of earlier turns" in r.json()["error"]["message"], r.text


def test_the_openai_route_and_rpc_refuse_the_same_history(base):
    messages = [{"role": r, "content": t} for q, a in _pairs(300) for r, t in (("user", q), ("assistant", a))]
    r = httpx.post(f"{base}/v1/chat/completions", json={"messages": messages + [{"role": "user", "content": QUESTION}]},
                   timeout=hang_limit(2))
    assert r.status_code == 413 and r.json()["error"]["param"] == "messages", r.text
    call = {"jsonrpc": "2.0", "id": 1, "method": "rig.ask", "params": {"question": QUESTION, "history": _pairs(300)}}
    reply = httpx.post(f"{base}/rpc", json=call, timeout=hang_limit(2)).json()
    assert reply["error"]["code"] == -32602 and reply["error"]["data"] == {"field": "history"}, reply


def test_a_long_history_within_the_bounds_is_summarised_from_its_newest_part(base):
    r = httpx.post(f"{base}/chat", json={"question": QUESTION, "history": _pairs(256)}, timeout=hang_limit(5))
    assert r.status_code == 200, r.text
    fit = r.json()["history"]
    assert fit["summary"] == "We talked about the Eiffel Tower."
    assert 0 < fit["summarized_turns"] < fit["older_turns"] and fit["kept_turns"] >= 1
    assert fit["older_turns"] + fit["kept_turns"] == 256
    health = httpx.get(f"{base}/health", timeout=hang_limit(1)).json()
    assert health["running"] == 0


# -- 3. bodies that once gave a 500 or FastAPI's bare `detail` ----------------------------------
JSON = {"content-type": "application/json"}
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("body, words", [
    (b'{"jsonrpc": "2.0", "id": NaN, "method": "rig.models"}', "NaN is not a JSON number"),
    (b'{"jsonrpc": "2.0", "id": Infinity, "method": "rig.models"}', "Infinity is not a JSON number"),
    (DEEP, "nested too deeply"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "rig.search", "params": {"query": "x", "filters": '
     + b"[" * 5000 + b"]" * 5000 + b"}}", "nested too deeply"),
])
def test_rpc_answers_nan_ids_and_deep_nesting_with_a_parse_error(base, body, words):
    r = httpx.post(f"{base}/rpc", content=body, headers=JSON, timeout=hang_limit(2))
    assert r.status_code == 200, r.text
    assert r.json()["error"]["code"] == -32700 and words in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("body", [b'{"question": ' + DEEP + b"}", b'{"question": "\xff\xfe tall?"}'])
def test_chat_answers_unreadable_bodies_in_rigkits_error_shape(base, body):
    r = httpx.post(f"{base}/chat", content=body, headers=JSON, timeout=hang_limit(2))
    assert r.status_code == 400 and "detail" not in r.json(), r.text
    assert r.json()["error"]["code"] == "invalid_body" and "not UTF-8, or nested too deeply" in r.json()["error"]["message"]


def test_an_unknown_route_is_a_404_in_rigkits_error_shape(base):
    r = httpx.get(f"{base}/v1/nothing", timeout=hang_limit(2))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text


# -- 12. a query of control characters only -----------------------------------------------------
@pytest.mark.parametrize("route, body", [
    ("/retrieve", {"queries": ["\x00\x00\x00"]}),
    ("/chat", {"question": "\x00\x01\x7f"}),
])
def test_a_query_of_nul_characters_is_empty(base, route, body):
    r = httpx.post(f"{base}{route}", json=body, timeout=hang_limit(2))
    assert r.status_code == 422 and "is empty" in r.json()["error"]["message"], r.text


# -- 2. a model server that fails or misses its deadline: 502 / 504 in each route's own shape -----
@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """`rigkit serve --backend openai` over a model server that misbehaves as `.fault` says
    (`tests.test_backend_faults.Misbehaving`); -> (rigkit's URL, the model server)."""
    from tests.test_backend_faults import Misbehaving

    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with local_http_server(Misbehaving, fault="", seen=[], client_left=None) as models:
        sets = ["generator.backend=openai", f"generator.base_url={models.url}/v1", "generator.request_timeout=6",
                "generator.max_retries=0", "decider.name=never"]
        with serving_module("rigkit.cli", "serve", "--no-mcp", "--retriever", f"{models.url}/retrieve",
                            *[a for s in sets for a in ("--set", s)], log=log) as url:
            yield url, models


@pytest.mark.parametrize("fault, status, code", [("fail", 502, "upstream_error"), ("silent", 504, "upstream_timeout")])
def test_a_failing_model_server_is_a_502_or_504_in_each_routes_shape(upstream, fault, status, code):
    url, models = upstream
    models.fault = fault
    chat = httpx.post(f"{url}/chat", json={"question": QUESTION}, timeout=hang_limit(5))
    assert chat.status_code == status and chat.json()["error"]["code"] == code, chat.text
    assert models.url in chat.json()["error"]["message"] and "Traceback" not in chat.text
    body = {"messages": [{"role": "user", "content": QUESTION}]}
    openai = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=hang_limit(5))
    assert openai.status_code == status and openai.json()["error"]["type"] == "server_error", openai.text
    call = {"jsonrpc": "2.0", "id": 7, "method": "rig.ask", "params": {"question": QUESTION}}
    rpc = httpx.post(f"{url}/rpc", json=call, timeout=hang_limit(5)).json()
    assert rpc["id"] == 7 and rpc["error"]["code"] == -32603 and rpc["error"]["data"]["status"] == status, rpc
    with httpx.stream("POST", f"{url}/chat", json={"question": QUESTION, "stream": True}, timeout=hang_limit(5)) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-2] == "event: error" and json.loads(lines[-1][5:])["code"] == code, lines[-4:]


def test_a_model_server_429_is_a_502_saying_429(upstream):
    url, models = upstream
    models.fault = "busy-long"
    r = httpx.post(f"{url}/chat", json={"question": QUESTION}, timeout=hang_limit(5))
    assert r.status_code == 502 and "answered 429" in r.json()["error"]["message"], r.text
