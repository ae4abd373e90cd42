"""Shared fixtures. Tests never reach a model hub: the offline packages provide the models."""

from __future__ import annotations

import logging
import os
import time
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


def wait_until_healthy(base: str, proc, limit: float, log_tail, poll: float = 0.5,
                       name: str = "rigkit serve") -> None:
    """Wait for a started server's /health to answer 200; fail with its log if it exits or hangs.

    `log_tail()` returns the end of the server's log for the failure message."""
    import httpx

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{name} exited with {proc.returncode}:\n{log_tail()}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll)  # also after a non-200 answer (a server still loading), not only on errors
    proc.kill()
    pytest.fail(f"{name} did not start in {limit:.0f} s:\n{log_tail()}")


@dataclass(frozen=True)
class CliRun:
    """What one `rigkit` command left: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


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
