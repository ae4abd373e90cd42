"""Shared fixtures. Tests never reach a model hub: the offline packages provide the models."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def default_generator():
    """The real default model (SmolLM2-135M-Instruct), loaded once per test session."""
    from rigkit.generation.loading import load_generator

    return load_generator()


@pytest.fixture(scope="session")
def demo_retriever():
    """The hybrid retriever over the demo corpus (indexed on first use, cached)."""
    from rigkit.config import RetrievalConfig
    from rigkit.retrieval import open_retriever

    return open_retriever(RetrievalConfig())


# Time limits in tests catch hangs, never a slow machine. The whole suite on a 2-core machine at
# load 4-9 ran about 7x slower than on a quiet one; a limit allows three times that.
SLOW_MACHINE_FACTOR = 21


def hang_limit(quiet_seconds: float) -> float:
    """The time limit for a step that takes `quiet_seconds` on a quiet 2-core machine."""
    return quiet_seconds * SLOW_MACHINE_FACTOR


def stop_process(proc, grace: float = 15.0) -> None:
    """Stop a server the tests started: SIGTERM, then SIGKILL after `grace` seconds."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    """A loopback port nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def why_not_started(url: str, proc, limit: float, log_tail, poll: float = 0.5, name: str = "rigkit serve",
                    path: str = "/health") -> str | None:
    """Wait for a started server's `url + path` to answer 200: None once it does, else why not
    (it exited, or did not answer within `limit` seconds), with `log_tail()`, the end of its log."""
    import httpx

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"{name} exited with {proc.returncode}:\n{log_tail()}"
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(poll)  # also after a non-200 answer (a server still loading), not only on errors
    return f"{name} did not start in {limit:.0f} s:\n{log_tail()}"


def wait_until_healthy(base: str, proc, limit: float, log_tail, poll: float = 0.5,
                       name: str = "rigkit serve") -> None:
    """Wait for a started server's /health to answer 200; fail with its log if it exits or hangs."""
    if (problem := why_not_started(base, proc, limit, log_tail, poll, name)) is not None:
        if proc.poll() is None:
            proc.kill()
        pytest.fail(problem)


@contextmanager
def serving_module(module: str, *args: str, log: Path, env: dict[str, str] | None = None,
                   limit: float | None = None) -> Iterator[str]:
    """`python -m <module> <args> --port <free port>` from the repository root, its output in `log`,
    healthy within `limit` (default hang_limit(10)) seconds: yields its URL; stopped on exit."""
    import subprocess
    import sys

    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", module, *args, "--port", str(port)], cwd=ROOT,
                                env=dict(os.environ) if env is None else env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, hang_limit(10) if limit is None else limit,
                           lambda: log.read_text(errors="replace")[-3000:])
        yield url
    finally:
        stop_process(proc)


@contextmanager
def local_http_server(handler, **state) -> Iterator:
    """A ThreadingHTTPServer on a free loopback port serving `handler` from a thread, with `state`
    set as its attributes (the handler reads them as `self.server.<name>`) and `url`; shut on exit."""
    import threading
    from http.server import ThreadingHTTPServer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    for name, value in state.items():
        setattr(httpd, name, value)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def stream_endlessly(handler, events) -> None:
    """Answer `handler`'s request with server-sent `events` (JSON objects) until they run out or the
    client closes the stream; counts what was written in `server.written`, sets `server.ended`."""
    import json
    import time

    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    try:
        for i, event in enumerate(events):
            handler.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            handler.wfile.flush()
            handler.server.written = i + 1
            time.sleep(0.002)
    except OSError:  # the client closed the stream
        pass
    finally:
        handler.server.ended.set()


@dataclass(frozen=True)
class CliRun:
    """What one `rigkit` command left: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str

    def error_line(self, *words: str) -> str:
        """The one `rigkit: error:` line of a command that exited 2 with no traceback; it holds
        each of `words`."""
        assert self.returncode == 2, (self.stdout[-1000:], self.stderr[-2000:])
        assert "Traceback" not in self.stderr, self.stderr[-2000:]
        errors = [line for line in self.stderr.splitlines() if line.startswith("rigkit: error:")]
        assert len(errors) == 1, self.stderr[-2000:]
        for word in words:
            assert word in errors[0], errors[0]
        return errors[0]


@pytest.fixture
def cli(monkeypatch, capsys):
    """`cli("ask", "What?")` runs `rigkit ask What?` in this process, from the repository root.

    A new interpreter per call costs seconds (torch and transformers imports), so only tests about
    the process itself (signals, argv bytes, the exit status) start one. What `main()` changes in
    the process is put back after the test: the environment through monkeypatch, the working
    directory, transformers' progress bars and the handlers on rigkit's logger (a handler holds the
    captured stderr of the test that added it)."""
    from transformers.utils import logging as hf_logging

    from rigkit.cli import main

    monkeypatch.chdir(ROOT)
    # main() sets this with setdefault; set here, monkeypatch removes it again after the test
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    bars = hf_logging.is_progress_bar_enabled()
    logger = logging.getLogger("rigkit")
    handlers, level = list(logger.handlers), logger.level

    def run(*args: str) -> CliRun:
        capsys.readouterr()  # only this command's output
        try:
            code = main(list(args))
        except SystemExit as exit:  # argparse's usage errors exit as the real command would
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        out = capsys.readouterr()
        return CliRun(code, out.out, out.err)

    yield run
    if bars:
        hf_logging.enable_progress_bar()
    logger.handlers[:] = handlers
    logger.setLevel(level)
