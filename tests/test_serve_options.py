"""`rigkit serve` refuses, in one line and before anything loads, settings with no useful effect
and a retriever that is the server itself (each search would wait on itself). The real command
in a process (`tests.scripted_serve`), which must exit by itself: a server that starts serving
instead is a failure.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import hang_limit

pytestmark = pytest.mark.slow  # starts `rigkit serve` processes

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _refused(*args: str) -> str:
    """The one error line of a `rigkit serve` that must exit 2 at start."""
    try:
        done = subprocess.run([sys.executable, "-m", "tests.scripted_serve", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=hang_limit(3))
    except subprocess.TimeoutExpired:
        pytest.fail(f"rigkit serve {' '.join(args)} started serving instead of refusing")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "loading" not in done.stderr, done.stderr  # refused before the model and index load
    errors = [line for line in done.stderr.splitlines() if line.startswith("rigkit: error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    return errors[0]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_server_that_is_its_own_retriever_is_refused_at_start(host):
    port = _free_port()
    line = _refused("--port", str(port), "--retriever", f"http://{host}:{port}/retrieve")
    assert "is this server itself" in line and str(port) in line


@pytest.mark.parametrize("args, words", [
    (["--max-body-bytes", "-1"], "--max-body-bytes -1"),
    (["--tool-result-tokens", "-5"], "--tool-result-tokens -5"),
    (["--allow-host", "http://x/"], "not a URL"),
    (["--max-queue", "-1"], "--max-queue -1"),
    (["--port", "70000"], "0-65535"),
])
def test_serve_settings_without_a_useful_effect_are_refused_before_loading(args, words):
    assert words in _refused(*args)
