"""`rigkit eval --ray`: questions answered by actors of a real Ray cluster, results written here.

A Ray head is started for the module (`ray start --head`, two CPUs) and stopped after; the
driver joins it by address, as it would join a cluster of many machines. Slow: every actor
loads the default model and MiniLM.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rigkit.eval.runner import RESULTS_FILE, result_key
from tests.conftest import hang_limit
from tests.test_eval_kill import QUESTIONS, ROOT, _command, _indexed_run, _lines

pytestmark = pytest.mark.slow
pytest.importorskip("ray")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """The address of a two-CPU Ray head on this machine, stopped after the module."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent))
    port = _free_port()
    # a loaded machine starts the node agents slowly: give them longer than the default 30 s
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_agent_register_timeout_ms": "180000"}
    started = subprocess.run([ray, "start", "--head", "--port", str(port), "--num-cpus", "2",
                              "--include-dashboard=false", "--disable-usage-stats"],
                             env=env, capture_output=True, text=True, timeout=hang_limit(120))
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)


def _answers(out: Path) -> dict[tuple, str]:
    return {result_key(r): r["answer"] for r in map(json.loads, _lines(out / RESULTS_FILE))}


def test_eval_on_a_ray_cluster_answers_as_a_local_run_and_resumes(tmp_path, ray_head):
    qa, index, local, env = _indexed_run(tmp_path)
    command = [*_command(qa, index, local), "--no-faithfulness"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=hang_limit(300))
    assert done.returncode == 0, done.stderr.decode()[-2000:]

    out = tmp_path / "on-ray"
    on_ray = [*_command(qa, index, out), "--no-faithfulness", "--ray", ray_head, "--concurrency", "2"]
    done = subprocess.run(on_ray, cwd=ROOT, env=env, capture_output=True, timeout=hang_limit(300))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert json.loads(done.stdout)["written"] == QUESTIONS * 2
    assert _answers(out) == _answers(local)  # greedy: the same answers, wherever they ran
    meta = json.loads((out / "meta.json").read_text())
    assert meta["model"]["source"].startswith(f"Ray {ray_head}: 2 workers")
    assert (out / "report.html").exists()

    # a stop after two answers: the same command finishes the rest and repeats nothing
    kept = _lines(out / RESULTS_FILE)[:2]
    (out / RESULTS_FILE).write_bytes(b"".join(kept))
    done = subprocess.run(on_ray, cwd=ROOT, env=env, capture_output=True, timeout=hang_limit(300))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    summary = json.loads(done.stdout)
    assert summary["skipped"] == 2 and summary["written"] == QUESTIONS * 2 - 2
    lines = _lines(out / RESULTS_FILE)
    assert lines[:2] == kept
    keys = [result_key(json.loads(line)) for line in lines]
    assert len(keys) == len(set(keys)) == QUESTIONS * 2 and _answers(out) == _answers(local)


def test_an_unreachable_ray_address_is_one_line(tmp_path):
    qa, index, out, env = _indexed_run(tmp_path)
    command = [*_command(qa, index, out), "--ray", f"127.0.0.1:{_free_port()}"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=hang_limit(180))
    assert done.returncode != 0
    assert "--ray 127.0.0.1:" in done.stderr and "Traceback" not in done.stderr
