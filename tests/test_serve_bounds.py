"""What a hostile or careless client can send a running `rigkit serve` (a real process over the
scripted model, `tests.scripted_serve`, shared by the module): a history too long to fit is
refused before any model work, every route answers in its own error shape, and nothing is a 500.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import hang_limit, stop_process, wait_until_healthy

httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "How tall is the Eiffel Tower?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """One scripted `rigkit serve` with a small history budget, for the whole module."""
    port, log = _free_port(), tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.scripted_serve", "--port", str(port),
                                 "--set", "context.max_history_tokens=64"],
                                cwd=ROOT, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_healthy(url, proc, hang_limit(10), lambda: log.read_text(errors="replace")[-3000:])
    yield url
    stop_process(proc)


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
