"""`rigkit serve` stops on SIGTERM whatever its clients do: drain up to a deadline, then cut.

Each test starts a real `rigkit serve` process (`tests.scripted_serve`: the real command, uvicorn
and its signal handling, over a scripted model and a fixed index, so it starts in seconds) and
stops it. Clients hold an MCP GET stream open, keep an answer in flight, or send a body slowly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import hang_limit

httpx = pytest.importorskip("httpx")
pytest.importorskip("mcp")

slow = pytest.mark.slow  # starts a `rigkit serve` process

ROOT = Path(__file__).resolve().parent.parent
FAR = "600"  # a drain deadline no test waits for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve(tmp_path):
    """`serve(*args, token_seconds=0)` starts a scripted `rigkit serve`; -> (port, process)."""
    started: list[subprocess.Popen] = []

    def start(*args: str, token_seconds: float = 0.0) -> tuple[int, subprocess.Popen]:
        port = _free_port()
        env = {**os.environ, "RIGKIT_TEST_TOKEN_SECONDS": str(token_seconds)}
        log = open(tmp_path / f"serve-{port}.log", "w+b")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen([sys.executable, "-m", "tests.scripted_serve", "--port", str(port), *args],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        started.append(proc)
        deadline = time.monotonic() + hang_limit(10)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"rigkit serve exited with {proc.returncode}:\n{_log(tmp_path, port)}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return port, proc
            except httpx.HTTPError:
                time.sleep(0.2)
        pytest.fail("rigkit serve did not start")

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _log(folder: Path, port: int) -> str:
    return (folder / f"serve-{port}.log").read_text(encoding="utf-8", errors="replace")[-3000:]


def _exit_status(proc: subprocess.Popen, seconds: float) -> int:
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rigkit serve still running {seconds:.0f} s after SIGTERM")


def _slow_body(port: int) -> socket.socket:
    """A connection whose POST announced 100 bytes of body and sent one."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"POST /chat HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{" % port)
    return conn


def _read_all(conn: socket.socket) -> bytes:
    conn.settimeout(hang_limit(1))
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


@slow
def test_sigterm_closes_an_open_mcp_stream_and_finishes_the_answer_in_flight(serve):
    port, proc = serve("--shutdown-timeout", FAR, token_seconds=0.2)
    base = f"http://127.0.0.1:{port}"
    stream: dict[str, object] = {}

    def hold_mcp_stream() -> None:  # an MCP client's GET stream for server-sent notifications
        try:
            with httpx.stream("GET", f"{base}/mcp", headers={"Accept": "text/event-stream"},
                              timeout=hang_limit(5)) as r:
                stream["status"] = r.status_code
                for _ in r.iter_bytes():
                    pass
            stream["ended"] = True
        except httpx.HTTPError as err:
            stream["error"] = err

    answer: dict[str, object] = {}

    def ask() -> None:  # a streamed answer: the stream runs on to its end
        with httpx.stream("POST", f"{base}/chat", json={"question": "How tall is the Eiffel Tower?", "stream": True},
                          timeout=hang_limit(5)) as r:
            answer["status"], answer["events"] = r.status_code, list(r.iter_lines())

    listener, asker = threading.Thread(target=hold_mcp_stream), threading.Thread(target=ask)
    listener.start()
    while "status" not in stream and listener.is_alive():
        time.sleep(0.05)
    asker.start()
    while httpx.get(f"{base}/health").json()["queue"] == 0 and asker.is_alive():
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    # the stream never ends by itself, yet the server exits long before its 600 s deadline
    assert _exit_status(proc, hang_limit(3)) in (0, -signal.SIGTERM)
    listener.join(hang_limit(1))
    asker.join(hang_limit(1))
    assert stream.get("status") == 200 and stream.get("ended"), stream
    results = [json.loads(line[5:]) for line, previous in zip(answer["events"][1:], answer["events"])
               if previous == "event: result" and line.startswith("data:")]
    assert answer["status"] == 200 and "330 metres" in results[0]["answer"], answer


@slow
def test_sigterm_cuts_a_slow_body_at_the_deadline_with_a_503(serve):
    port, proc = serve("--shutdown-timeout", "1")
    conn = _slow_body(port)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert _exit_status(proc, hang_limit(2)) in (0, -signal.SIGTERM)
    head, _, body = _read_all(conn).partition(b"\r\n\r\n")
    conn.close()
    assert head.startswith(b"HTTP/1.1 503")
    assert json.loads(body)["error"]["code"] == "shutting_down"


@slow
def test_a_second_sigterm_exits_at_once(serve):
    port, proc = serve("--shutdown-timeout", FAR)
    conn = _slow_body(port)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert proc.poll() is None  # the first signal drains: the request may still finish
    proc.send_signal(signal.SIGTERM)
    _exit_status(proc, hang_limit(1))
    conn.close()


def test_the_shutdown_timeout_must_be_a_number_of_seconds(cli):
    run = cli("serve", "--shutdown-timeout", "-1")
    assert run.returncode == 2 and "--shutdown-timeout" in run.stderr


@slow
def test_a_stream_cut_at_the_deadline_ends_with_an_error_event_clients_see(serve):
    """OpenAI's SDK raises on the cut stream instead of reading an empty answer; `/chat`'s
    stream ends with an `error` event instead of just stopping."""
    openai = pytest.importorskip("openai")
    port, proc = serve("--shutdown-timeout", "1", "--workers", "2", token_seconds=0.5)
    base = f"http://127.0.0.1:{port}"
    outcome: dict[str, object] = {}

    def sdk() -> None:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=hang_limit(5), max_retries=0)
        try:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="smollm2-135m-instruct", messages=[{"role": "user", "content": "How tall is the Eiffel Tower?"}],
                stream=True) if c.choices)
            outcome["sdk"] = ("answer", text)
        except openai.APIError as err:
            outcome["sdk"] = ("error", str(err))

    def chat() -> None:
        with httpx.stream("POST", f"{base}/chat", json={"question": "How tall is the Eiffel Tower?", "stream": True},
                          timeout=hang_limit(5)) as r:
            outcome["chat"] = [line for line in r.iter_lines() if line]

    threads = [threading.Thread(target=sdk), threading.Thread(target=chat)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + hang_limit(5)
    while httpx.get(f"{base}/health", timeout=hang_limit(1)).json()["running"] < 2 and all(
            t.is_alive() for t in threads):
        assert time.monotonic() < deadline, "the two streams never ran together"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert _exit_status(proc, hang_limit(2)) in (0, -signal.SIGTERM)
    for thread in threads:
        thread.join(hang_limit(1))
    kind, text = outcome["sdk"]
    assert kind == "error" and "shut down before this answer finished" in text, outcome["sdk"]
    events = outcome["chat"]
    assert events[-2] == "event: error" and json.loads(events[-1][5:])["code"] == "shutting_down", events[-4:]
