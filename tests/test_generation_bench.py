"""The generator benchmark scripts run (quick mode, real default model) so they never rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_gpu_check_quick_runs_on_cpu():
    out = _run("bench/gpu_check.py", "smollm2-135m-instruct", "--quick", "--device", "cpu")
    assert "same tokens with cache on and off: True" in out
    assert "tokens/s" in out and "peak memory" in out


def test_attention_cache_bench_checks_both_paths_agree():
    out = _run("bench/attention_cache.py", "--quick")
    assert "ratio before/after" in out
