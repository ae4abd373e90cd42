"""Bad input is one line and exit code 2, before any model loads; a bug is one line and exit 1.

Every case runs the real command line in a subprocess. None of them loads a model: each must be
refused before that (the whole test stays fast).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QA = ROOT / "data" / "2wikimultihopqa" / "qa.jsonl"
CLI = "import sys; from rigkit.cli import main; sys.exit(main())"


def rigkit(*args: str | bytes, env: dict | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=ROOT, capture_output=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def _one_line_error(done: subprocess.CompletedProcess, code: int, *words: str) -> str:
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == code, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("yaml_text, words", [
    ("retrieval:\n  top_k: two\n", ["retrieval.top_k", "integer"]),
    ('generator:\n  max_answer_tokens: "lots"\n', ["generator.max_answer_tokens", "integer"]),
    ("decider:\n  threshold: high\n", ["decider.threshold", "number"]),
    ("controller:\n  max_rounds: 2\n bad: [1\n", ["line 3", "malformed YAML"]),
    ("controller:\n  max_rounds: -1\n", ["controller.max_rounds", "at least 0"]),
])
def test_bad_config_is_one_line_naming_file_and_key(tmp_path, yaml_text, words):
    config = tmp_path / "run.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    for args in (["ask", "What?", "--config", str(config)],
                 ["eval", "--qa", str(QA), "--config", str(config), "--out", str(tmp_path / "o")]):
        _one_line_error(rigkit(*args), 2, "run.yaml", *words)


def test_negative_max_rounds_flag_is_refused():
    _one_line_error(rigkit("ask", "What?", "--max-rounds", "-2"), 2, "max_rounds")


def test_missing_index_and_corpus_are_refused_before_loading(tmp_path):
    _one_line_error(rigkit("ask", "What?", "--index", str(tmp_path / "none")), 2, "none")
    _one_line_error(rigkit("ask", "What?", "--corpus", str(tmp_path / "c.jsonl")), 2, "c.jsonl")
    _one_line_error(rigkit("index", "build", "--corpus", str(tmp_path / "c.jsonl"), "--out",
                           str(tmp_path / "i")), 2, "c.jsonl")


def test_invalid_utf8_question_is_one_line():
    done = subprocess.run([sys.executable.encode(), b"-c", CLI.encode(), b"ask", b"caf\xe9 \xff?"],
                          cwd=ROOT, capture_output=True, timeout=60)
    _one_line_error(done, 2, "UTF-8")


def test_a_model_folder_that_is_not_a_model_names_what_is_missing(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    _one_line_error(rigkit("ask", "What?", "--model", str(tmp_path)), 2, "config.json", "weights")


@pytest.mark.parametrize("command", [
    ["eval", "--qa", str(QA), "--systems", "closed_book"],
    ["trigger", "train", "--labels", str(QA)],
    ["index", "build", "--corpus", str(ROOT / "data" / "demo" / "corpus.jsonl")],
])
def test_unwritable_out_is_refused_before_work(tmp_path, command):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _one_line_error(rigkit(*command, "--out", str(blocker / "sub" / "out")), 2, "--out")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        _one_line_error(rigkit(*command, "--out", str(locked / "out")), 2, "not writable")


def test_uncaught_exception_is_one_line_and_debug_shows_it():
    # a command failing with an exception rigkit did not foresee: forced through the guard
    boom = "import sys, rigkit.cli.index as m; m._info = lambda a: 1 / 0; from rigkit.cli import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", boom, "index", "info", "x"], cwd=ROOT,
                          capture_output=True, timeout=60)
    line = _one_line_error(done, 1, "ZeroDivisionError", "--debug")
    assert "division by zero" in line
    debug = subprocess.run([sys.executable, "-c", boom, "--debug", "index", "info", "x"], cwd=ROOT,
                           capture_output=True, timeout=60)
    assert debug.returncode == 1 and b"Traceback" in debug.stderr


@pytest.mark.parametrize("params, words", [
    ("{n: two}", ["decider.params.n", "int"]), ("{window: 3}", ["decider.params.window", "options"]),
])
def test_bad_decider_params_are_refused_before_loading(tmp_path, params, words):
    config = tmp_path / "run.yaml"
    config.write_text(f"decider:\n  name: every_n\n  params: {params}\n", encoding="utf-8")
    _one_line_error(rigkit("ask", "What?", "--config", str(config)), 2, *words)
    _one_line_error(rigkit("eval", "--qa", str(QA), "--config", str(config), "--out",
                           str(tmp_path / "o")), 2, *words)
