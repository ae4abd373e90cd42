"""`rigkit serve` for real: a subprocess on a free 127.0.0.1 port with the default offline model.

One server per module (the model loads once) with the CPU profile and short answers. Clients are
the official `openai` SDK, httpx, the `mcp` SDK's client, and a second rigkit process whose
`RemoteRetriever` searches this server's index. The last test stops the server with SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import hang_limit, wait_until_healthy

httpx = pytest.importorskip("httpx")
pytest.importorskip("openai")
pytest.importorskip("mcp")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
QUESTION = "Who designed the Eiffel Tower?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(base URL, process) of a running `rigkit serve` with the CPU profile and 24-token answers."""
    folder = tmp_path_factory.mktemp("serve")
    config = (ROOT / "configs" / "cpu.yaml").read_text(encoding="utf-8")
    config = config.replace("max_answer_tokens: 96", "max_answer_tokens: 24")
    (folder / "serve.yaml").write_text(config, encoding="utf-8")
    port = _free_port()
    log = open(folder / "server.log", "w+b")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "rigkit.cli", "serve", "--config", str(folder / "serve.yaml"),
         "--port", str(port), "--max-queue", "4"],
        cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    proc.log_path = folder / "server.log"  # its stderr: the access log among it

    def log_tail() -> str:
        log.seek(0)
        return log.read().decode()[-2000:]

    wait_until_healthy(base, proc, hang_limit(30), log_tail)  # imports, model and index load
    yield base, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
    log.close()


@pytest.fixture(scope="module")
def sdk(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server[0]}/v1", api_key="not-needed", max_retries=0, timeout=300)


# -- (a) the official openai SDK -------------------------------------------------------------------
def test_openai_sdk_server_side_rig_non_streaming(sdk):
    reply = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}])
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.content.strip()
    rig = reply.model_extra["rig"]
    assert rig["answer"] == choice.message.content and rig["rounds"]
    assert reply.usage.completion_tokens == rig["tokens"]["generated"] > 0


def test_openai_sdk_server_side_rig_streaming_with_usage(sdk):
    stream = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                         stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text.strip() and finish in (["stop"], ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    rig = next(c.model_extra["rig"] for c in chunks if c.choices and c.choices[0].finish_reason)
    assert re.sub(r"\s*\[\[citation:[^\]]+\]\]", "", rig["answer"]) == text  # the same answer, uncited


def test_openai_sdk_client_side_tool_loop_to_completion(sdk):
    tools = [{"type": "function", "function": {
        "name": "search", "description": "Search the encyclopedia",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
    messages = [{"role": "user", "content": "When was the Eiffel Tower built?"}]
    searched = []
    for _ in range(4):
        reply = sdk.chat.completions.create(model=MODEL, messages=messages, tools=tools,
                                            # room left after the first sentence: passages
                                            # that come back are read, not merely injected
                                            extra_body={"turns": 1, "options": {"decider": "always", "max_tokens": 64}})
        choice = reply.choices[0]
        if choice.finish_reason != "tool_calls":
            break
        messages.append(choice.message.model_dump(exclude_none=True))
        for call in choice.message.tool_calls:
            searched.append(json.loads(call.function.arguments)["query"])
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": "The Eiffel Tower was built from 1887 to 1889 for the World's Fair."})
    assert len(searched) == 1 and searched[0].strip()  # `turns: 1` allowed exactly one tool round
    assert choice.finish_reason in ("stop", "length") and choice.message.content.strip()
    assert reply.model_extra["rig"]["used_retrieval_times"] == 1
    rounds = reply.model_extra["rig"]["rounds"]
    assert len(rounds) >= 2  # the model went on after the tool's passages: they were read


# -- (b) JSON-RPC, (c) /retrieve and RemoteRetriever -----------------------------------------------
def test_json_rpc_single_and_batch(server):
    url = f"{server[0]}/rpc"
    single = httpx.post(url, json={"jsonrpc": "2.0", "id": 7, "method": "rig.search",
                                   "params": {"query": "Eiffel Tower", "topk": 2}}, timeout=60).json()
    assert single["id"] == 7 and len(single["result"]) == 2
    batch = httpx.post(url, json=[
        {"jsonrpc": "2.0", "id": 1, "method": "rig.models"},
        {"jsonrpc": "2.0", "id": 2, "method": "rig.ask", "params": {"question": QUESTION, "options": {"max_tokens": 8}}},
        {"jsonrpc": "2.0", "id": 3, "method": "rig.unknown"},
    ], timeout=300).json()
    by_id = {r["id"]: r for r in batch}
    assert by_id[1]["result"] == [MODEL]
    assert by_id[2]["result"]["answer"].strip() and "used_retrieval_times" in by_id[2]["result"]
    assert by_id[3]["error"]["code"] == -32601


def test_retrieve_from_a_plain_http_client(server):
    body = httpx.post(f"{server[0]}/retrieve", json={"queries": ["Eiffel Tower", "Gustave Eiffel"], "topk": 3},
                      timeout=60).json()
    assert [len(hits) for hits in body["result"]] == [3, 3]
    assert all({"id", "title", "text", "score"} <= set(h) for h in body["result"][0])


def test_remote_retriever_in_a_second_rigkit_process_over_mcp_stdio(server):
    """`rigkit mcp --retriever URL`: the second process has no index; its search is this server's."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    expected = httpx.post(f"{server[0]}/retrieve", json={"queries": ["Eiffel Tower"], "topk": 2}).json()["result"][0]
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=_env(),
                                   args=["-m", "rigkit.cli", "mcp", "--retriever", f"{server[0]}/retrieve"])

    async def call() -> dict:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("search", {"query": "Eiffel Tower", "top_k": 2})
            assert not result.isError
            return result.structuredContent

    found = anyio.run(call)
    assert [h["id"] for h in found["result"]] == [h["id"] for h in expected]


# -- (d) an MCP client session over streamable HTTP ----------------------------------------------
def test_mcp_session_lists_and_calls_search(server):
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def session_run() -> tuple[list[str], list]:
        async with streamablehttp_client(f"{server[0]}/mcp") as (read, write, _), ClientSession(read, write) as s:
            await s.initialize()
            names = [t.name for t in (await s.list_tools()).tools]
            result = await s.call_tool("search", {"query": "Gustave Eiffel", "top_k": 2})
            assert not result.isError
            return names, json.loads(result.content[0].text) if result.content else []

    names, first = anyio.run(session_run)
    assert sorted(names) == ["ask", "search"]
    assert first["title"] and first["text"]
    evil = httpx.post(f"{server[0]}/mcp", headers={"Origin": "http://evil.example", "Accept": "application/json"},
                      json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert evil.status_code in (400, 403)


# -- (e) bad input against the real server ---------------------------------------------------------
def test_bad_input_on_the_real_server(server):
    base = server[0]
    raw = {"content-type": "application/json"}
    assert httpx.post(f"{base}/chat", content=b'{"question": ', headers=raw).status_code == 400
    wrong = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": 5}]})
    assert wrong.status_code == 422 and wrong.json()["error"]["param"] == "messages.0.content"
    assert httpx.post(f"{base}/chat", json={"question": ""}).status_code == 422
    assert httpx.post(f"{base}/chat", content=b"x" * 2_000_001, headers=raw).status_code == 413
    unknown = httpx.post(f"{base}/v1/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user", "content": "q"}]})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert httpx.post(f"{base}/rpc", content=b"{", headers=raw).json()["error"]["code"] == -32700


def test_edge_values_on_the_real_server_are_4xx_not_500(server):
    """What once reached the model and answered 500: a lone surrogate, a seed past 2^64, NaN,
    text that is empty once invisible characters are gone, a NUL byte."""
    base = server[0]
    raw = {"content-type": "application/json"}
    bodies = [b'{"question": "\\ud800 who?"}',
              b'{"question": "' + QUESTION.encode() + b'", "options": {"seed": 36893488147419103232}}',
              b'{"question": "' + QUESTION.encode() + b'", "options": {"temperature": NaN}}',
              '{"question": "\u200b\u2060\ufeff"}'.encode()]
    for body in bodies:
        answer = httpx.post(f"{base}/chat", content=body, headers=raw, timeout=300)
        assert 400 <= answer.status_code < 500, (body, answer.status_code, answer.text)
    nul = httpx.post(f"{base}/chat", json={"question": "who\u0000?", "options": {"max_tokens": 4, "decider": "never"}},
                     timeout=300)
    assert nul.status_code in (200, 422), nul.text


def test_a_rebound_host_and_a_foreign_origin_are_refused_on_every_route(server):
    """DNS rebinding (the page's own name now points here) and a page's cross-origin fetch."""
    base = server[0]
    port = base.rsplit(":", 1)[1]
    calls = [("GET", "/v1/models", None), ("GET", "/openapi.json", None), ("GET", "/metrics", None),
             ("POST", "/retrieve", {"queries": ["Eiffel Tower"]}),
             ("POST", "/chat", {"question": QUESTION, "options": {"max_tokens": 4, "decider": "never"}}),
             ("POST", "/rpc", {"jsonrpc": "2.0", "id": 1, "method": "rig.models"}),
             ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})]
    mcp = {"Accept": "application/json, text/event-stream"}
    for method, path, body in calls:
        extra = mcp if path == "/mcp" else {}
        rebound = httpx.request(method, base + path, json=body, headers={"Host": f"evil.example:{port}", **extra})
        assert rebound.status_code == 421, (path, rebound.text)
        foreign = httpx.request(method, base + path, json=body, headers={"Origin": "http://evil.example", **extra})
        assert foreign.status_code == 403, (path, foreign.text)
        own = httpx.request(method, base + path, json=body, headers={"Origin": base, **extra}, timeout=300)
        assert own.status_code == 200, (path, own.text)
    form = httpx.post(f"{base}/rpc", content=b'{"jsonrpc": "2.0", "id": 1, "method": "rig.models"}',
                      headers={"content-type": "text/plain"})
    assert form.status_code == 415


def test_the_real_server_logs_each_request_and_serves_metrics(server):
    from prometheus_client.parser import text_string_to_metric_families

    base, proc = server
    reply = httpx.post(f"{base}/chat", json={"question": QUESTION, "options": {"max_tokens": 12}},
                       headers={"X-Request-ID": "watch-1"}, timeout=300)
    result = reply.json()
    assert reply.headers["x-request-id"] == "watch-1" == result["request_id"]
    deadline = time.monotonic() + hang_limit(5)
    while not (lines := [x for x in proc.log_path.read_text().splitlines() if "request_id=watch-1 " in x]):
        assert time.monotonic() < deadline, proc.log_path.read_text()[-2000:]
        time.sleep(0.05)
    [line] = lines
    assert ("method=POST route=/chat status=200 " in line
            and f"retrievals={result['used_retrieval_times']} prompt_tokens={result['tokens']['prompt']} "
                f"generated_tokens={result['tokens']['generated']}" in line)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{base}/metrics").text)}
    chat = [s for s in families["rigkit_requests"].samples
            if s.labels == {"method": "POST", "route": "/chat", "status": "200"}]
    assert chat and chat[0].value >= 1
    assert families["rigkit_request_duration_seconds"].type == "histogram"
    assert sum(s.value for s in families["rigkit_tokens"].samples if s.labels["kind"] == "generated") > 0
    assert {"rigkit_retrievals", "rigkit_cache_tokens", "rigkit_queue_depth"} <= set(families)


# -- (f) load, disconnects and shutdown -------------------------------------------------------------
def test_load_every_request_is_answered_or_refused_with_retry_after(server):
    base = server[0]

    def client(i: int) -> list[tuple[int, str]]:
        outcomes = []
        with httpx.Client(timeout=300) as http:
            for j in range(3):
                r = http.post(f"{base}/chat", json={"question": f"Question {i}-{j}: who designed the Eiffel Tower?",
                                                    "options": {"max_tokens": 4, "decider": "never"}})
                outcomes.append((r.status_code, r.headers.get("retry-after", "") if r.status_code == 429
                                 else r.json().get("answer", "")))
        return outcomes

    with ThreadPoolExecutor(16) as pool:
        results = [o for per_client in pool.map(client, range(16)) for o in per_client]
    assert len(results) == 48
    statuses = {status for status, _ in results}
    assert statuses <= {200, 429} and 200 in statuses and 429 in statuses
    assert all(detail.strip() for status, detail in results if status == 200)  # a complete answer each
    assert all(int(detail) >= 1 for status, detail in results if status == 429)
    health = httpx.get(f"{base}/health").json()
    assert health["queue"] == 0 and health["status"] == "ok"


def test_a_disconnected_stream_stops_its_generation(server):
    base = server[0]
    before = httpx.get(f"{base}/health").json()["cancelled"]
    with httpx.Client(timeout=300) as http, http.stream(
            "POST", f"{base}/chat", json={"question": QUESTION, "stream": True,
                                          "options": {"max_tokens": 200, "decider": "never"}}) as r:
        for line in r.iter_lines():
            if line.startswith("event: token"):
                break  # the first token arrived: hang up
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        health = httpx.get(f"{base}/health").json()
        if health["cancelled"] > before and health["queue"] == 0:
            break
        time.sleep(0.2)
    assert health["cancelled"] == before + 1 and health["queue"] == 0


def test_sigterm_finishes_in_flight_and_refuses_new(server):
    base, proc = server
    outcome = {}

    def ask() -> None:
        r = httpx.post(f"{base}/chat", json={"question": QUESTION, "options": {"max_tokens": 12}}, timeout=300)
        outcome["status"], outcome["answer"] = r.status_code, r.json().get("answer", "")

    thread = threading.Thread(target=ask)
    thread.start()
    while httpx.get(f"{base}/health").json()["queue"] == 0 and thread.is_alive():
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(httpx.HTTPError):  # the listening socket is closed: new clients are refused
        httpx.post(f"{base}/chat", json={"question": QUESTION}, timeout=10).raise_for_status()
    thread.join(300)
    assert outcome["status"] == 200 and outcome["answer"].strip()
    # uvicorn re-raises the signal once it has drained, so the exit status is SIGTERM's
    assert proc.wait(60) in (0, -signal.SIGTERM)
