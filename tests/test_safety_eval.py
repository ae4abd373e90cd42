"""Results are exact after any kill: one trace and one result per key, also under concurrency.

A real process runs an evaluation with rigkit.testing's scripted parts and is SIGKILLed at a
write or an fsync of either file (`RIGKIT_FAULT_AT`); the resumed run must leave every
(question, system, run) key exactly once in results.jsonl and once in traces.jsonl.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rigkit.errors import InputError
from rigkit.eval.merge import merge_runs
from rigkit.eval.runner import (
    RESULTS_FILE,
    TRACES_FILE,
    parse_shard,
    read_results,
    result_key,
    run_eval,
    shard_items,
)
from tests.test_eval_runner import _items, _systems

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = "closed_book,rag,rig:always"
RUN = """
import sys
from rigkit.eval.runner import run_eval
from tests.test_eval_runner import _items, _systems
concurrency = int(sys.argv[2])
systems, _ = _systems(sys.argv[3])
run_eval(_items(), systems, sys.argv[1], runs=2, progress=False, concurrency=concurrency,
         worker_systems=lambda: _systems(sys.argv[3])[0])
"""
STEPS = ["eval:traces:written", "eval:traces:fsync", "eval:results:written", "eval:results:fsync"]


def _keys(path: Path) -> list[tuple]:
    if not path.exists():
        return []
    return [result_key(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]


def _killed_run(out: Path, step: str, concurrency: int) -> None:
    env = {**os.environ, "RIGKIT_FAULT_AT": f"{step}@3"}  # the third write: lines exist before it
    done = subprocess.run([sys.executable, "-c", RUN, str(out), str(concurrency), SYSTEMS],
                          cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-1500:]


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("step", STEPS)
def test_resume_after_a_kill_at_any_write_is_exact(tmp_path, step, concurrency):
    out = tmp_path / "run"
    _killed_run(out, step, concurrency)
    before = _keys(out / RESULTS_FILE)
    assert 1 <= len(before) < 18
    systems, _ = _systems(SYSTEMS)
    summary = run_eval(_items(), systems, out, runs=2, progress=False, concurrency=concurrency,
                       worker_systems=lambda: _systems(SYSTEMS)[0])
    results, traces = _keys(out / RESULTS_FILE), _keys(out / TRACES_FILE)
    assert len(results) == len(set(results)) == 3 * 3 * 2  # nothing lost, nothing twice
    assert sorted(traces) == sorted(results)  # one trace per result, no orphan, no repeat
    assert summary.skipped == len(before) and summary.written == 18 - len(before)


def test_concurrent_run_matches_the_serial_one(tmp_path):
    serial, _ = _systems(SYSTEMS)
    run_eval(_items(), serial, tmp_path / "serial", progress=False)
    parallel, _ = _systems(SYSTEMS)
    run_eval(_items(), parallel, tmp_path / "parallel", progress=False, concurrency=4,
             worker_systems=lambda: _systems(SYSTEMS)[0])
    answers = {d: {result_key(r): r["answer"] for r in read_results(tmp_path / d)}
               for d in ("serial", "parallel")}
    assert answers["serial"] == answers["parallel"] and len(answers["serial"]) == 9


def test_shards_split_questions_and_merge_back(tmp_path):
    items = _items()
    shards = [shard_items(items, parse_shard(f"{i}/2")) for i in (1, 2)]
    assert sorted(q.id for s in shards for q in s) == sorted(q.id for q in items)
    assert not {q.id for q in shards[0]} & {q.id for q in shards[1]}
    for i, part in enumerate(shards, start=1):
        systems, _ = _systems(SYSTEMS)
        run_eval(part, systems, tmp_path / f"s{i}", progress=False)
        (tmp_path / f"s{i}" / "meta.json").write_text(json.dumps(
            {"qa": "qa.jsonl", "split": "all", "config": {}, "question_ids": [q.id for q in part],
             "systems": SYSTEMS.split(","), "runs": 1}))
    merged = merge_runs(tmp_path / "all", [tmp_path / "s1", tmp_path / "s2"])
    assert merged.written == 9
    assert sorted(_keys(tmp_path / "all" / TRACES_FILE)) == sorted(_keys(tmp_path / "all" / RESULTS_FILE))
    assert json.loads((tmp_path / "all" / "meta.json").read_text())["question_ids"] == ["q1", "q3", "q2"]


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_bad_shard_is_refused(bad):
    with pytest.raises(InputError, match="--shard"):
        parse_shard(bad)
