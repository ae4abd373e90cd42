"""`rigkit eval` as a real process with the real default model: SIGKILL it mid-run, resume.

Slow: loads SmolLM2-135M and MiniLM twice (~1-2 min on 2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rigkit.eval.runner import RESULTS_FILE, result_key
from tests.conftest import hang_limit

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "2wikimultihopqa" / "qa.jsonl"
QUESTIONS = 3
SYSTEMS = "closed_book,rag"
CLI = "import sys; from rigkit.cli import main; sys.exit(main())"


def _toy_set(folder: Path) -> tuple[Path, Path]:
    """The first questions of the shipped 2Wiki set and a corpus of their own paragraphs."""
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()[:QUESTIONS]]
    qa, corpus = folder / "qa.jsonl", folder / "corpus.jsonl"
    qa.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    paragraphs = {p["pid"]: p for r in rows for p in r["paragraphs"]}
    corpus.write_text("".join(json.dumps({"id": k, "title": p["title"], "text": p["text"]}) + "\n"
                              for k, p in paragraphs.items()), encoding="utf-8")
    return qa, corpus


def _indexed_run(folder: Path) -> tuple[Path, Path, Path, dict[str, str]]:
    """The toy set indexed in `folder`, the run folder, and the environment for the CLI."""
    from rigkit.retrieval import Index

    qa, corpus = _toy_set(folder)
    index = folder / "index"
    Index.build(corpus, index)
    # One torch thread: on a shared 2-core machine two threads per process thrash (5x slower).
    env = {"OMP_NUM_THREADS": "1", **os.environ, "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return qa, index, folder / "run", env


def _command(qa: Path, index: Path, out: Path) -> list[str]:
    return [sys.executable, "-c", CLI, "eval", "--qa", str(qa), "--index", str(index),
            "--systems", SYSTEMS, "--config", str(ROOT / "configs" / "cpu.yaml"),
            "--out", str(out), "--json"]


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True) if path.exists() else []


@pytest.mark.slow
def test_killed_eval_resumes_without_duplicates_or_losses(tmp_path):
    qa, index, out, env = _indexed_run(tmp_path)
    results = out / RESULTS_FILE

    proc = subprocess.Popen(_command(qa, index, out), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first_line_s = hang_limit(30)  # import, two models, first answer
    deadline = time.monotonic() + first_line_s
    try:
        while not _lines(results) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert _lines(results), f"no result line within {first_line_s:.0f} s"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    before = _lines(results)
    complete = [line for line in before if line.endswith(b"\n")]
    assert 1 <= len(complete) < QUESTIONS * 2, "the kill should land mid-run"

    done = subprocess.run(_command(qa, index, out), cwd=ROOT, env=env, capture_output=True,
                          timeout=hang_limit(60))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    summary = json.loads(done.stdout)
    after = _lines(results)
    assert after[: len(complete)] == complete  # nothing written before the kill was lost
    rows = [json.loads(line) for line in after]
    keys = [result_key(r) for r in rows]
    assert len(keys) == len(set(keys)) == QUESTIONS * 2  # no duplicates, nothing missing
    assert summary["skipped"] == len(complete) and summary["written"] == len(rows) - len(complete)
    assert all(r["error"] is None and r["model"]["source"] for r in rows)
    assert (out / "report.html").exists()


@pytest.mark.slow
@pytest.mark.parametrize("step, concurrency", [("eval:traces:fsync", 1), ("eval:results:written", 2)])
def test_kill_at_a_write_step_resumes_exactly(tmp_path, step, concurrency):
    """Killed by the fault hook between a trace and its result (or mid result) with the real model,
    serial and with two workers: the resumed run holds each key once in both files."""
    from rigkit.eval.runner import TRACES_FILE
    qa, index, out, env = _indexed_run(tmp_path)
    command = [*_command(qa, index, out), "--no-faithfulness", "--concurrency", str(concurrency)]
    killed = subprocess.run(command, cwd=ROOT, env={**env, "RIGKIT_FAULT_AT": f"{step}@2"},
                            capture_output=True, timeout=hang_limit(60))
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=hang_limit(60))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    keys = [result_key(json.loads(line)) for line in _lines(out / RESULTS_FILE)]
    traces = [result_key(json.loads(line)) for line in _lines(out / TRACES_FILE)]
    assert len(keys) == len(set(keys)) == QUESTIONS * 2
    assert sorted(traces) == sorted(keys)
