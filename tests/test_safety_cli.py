"""Bad input is one line and exit code 2, before any model loads; a bug is one line and exit 1.

The command line runs in this process (the `cli` fixture, as `rigkit ARGS` from the repository
root). None of the cases loads a model: each must be refused before that (the whole test stays
fast). The checks about the process itself (argv bytes that are not UTF-8, the exit status of the
installed `rigkit` script) start a real one and are marked slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CliRun, hang_limit

ROOT = Path(__file__).resolve().parents[1]
QA = ROOT / "data" / "2wikimultihopqa" / "qa.jsonl"
CLI = "import sys; from rigkit.cli import main; sys.exit(main())"


def _one_line_error(done: CliRun, code: int, *words: str) -> str:
    err = done.stderr
    assert done.returncode == code, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _process(args: list[str | bytes]) -> CliRun:
    """A real process, for what only a process shows (argv bytes, the exit status)."""
    done = subprocess.run(args, cwd=ROOT, capture_output=True, timeout=hang_limit(5),
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return CliRun(done.returncode, done.stdout.decode("utf-8", "replace"),
                  done.stderr.decode("utf-8", "replace"))


@pytest.mark.parametrize("yaml_text, words", [
    ("retrieval:\n  top_k: two\n", ["retrieval.top_k", "integer"]),
    ('generator:\n  max_answer_tokens: "lots"\n', ["generator.max_answer_tokens", "integer"]),
    ("decider:\n  threshold: high\n", ["decider.threshold", "number"]),
    ("controller:\n  max_rounds: 2\n bad: [1\n", ["line 3", "malformed YAML"]),
    ("controller:\n  max_rounds: -1\n", ["controller.max_rounds", "at least 0"]),
])
def test_bad_config_is_one_line_naming_file_and_key(cli, tmp_path, yaml_text, words):
    config = tmp_path / "run.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    for args in (["ask", "What?", "--config", str(config)],
                 ["eval", "--qa", str(QA), "--config", str(config), "--out", str(tmp_path / "o")]):
        _one_line_error(cli(*args), 2, "run.yaml", *words)


def test_negative_max_rounds_flag_is_refused(cli):
    _one_line_error(cli("ask", "What?", "--max-rounds", "-2"), 2, "max_rounds")


def test_missing_index_and_corpus_are_refused_before_loading(cli, tmp_path):
    _one_line_error(cli("ask", "What?", "--index", str(tmp_path / "none")), 2, "none")
    _one_line_error(cli("ask", "What?", "--corpus", str(tmp_path / "c.jsonl")), 2, "c.jsonl")
    _one_line_error(cli("index", "build", "--corpus", str(tmp_path / "c.jsonl"), "--out",
                        str(tmp_path / "i")), 2, "c.jsonl")


def test_invalid_utf8_question_is_one_line(cli):
    # the bytes b"caf\xe9 \xff?" as Python hands them to main() (argv decoded with surrogateescape)
    _one_line_error(cli("ask", "caf\udce9 \udcff?"), 2, "UTF-8")


@pytest.mark.slow
def test_invalid_utf8_argv_bytes_are_one_line_in_a_real_process():
    done = _process([sys.executable.encode(), b"-c", CLI.encode(), b"ask", b"caf\xe9 \xff?"])
    _one_line_error(done, 2, "UTF-8")


@pytest.mark.slow
def test_the_installed_script_exits_with_the_code_main_returns():
    script = Path(sys.executable).parent / "rigkit"
    if not script.exists():
        pytest.skip(f"no console script at {script} (install the package with pip install -e .)")
    _one_line_error(_process([str(script), "ask", "What?", "--max-rounds", "-2"]), 2, "max_rounds")


def test_a_model_folder_that_is_not_a_model_names_what_is_missing(cli, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    _one_line_error(cli("ask", "What?", "--model", str(tmp_path)), 2, "config.json", "weights")


@pytest.mark.parametrize("command", [
    ["eval", "--qa", str(QA), "--systems", "closed_book"],
    ["trigger", "train", "--labels", str(QA)],
    ["index", "build", "--corpus", str(ROOT / "data" / "demo" / "corpus.jsonl")],
])
def test_unwritable_out_is_refused_before_work(cli, tmp_path, command):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _one_line_error(cli(*command, "--out", str(blocker / "sub" / "out")), 2, "--out")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        _one_line_error(cli(*command, "--out", str(locked / "out")), 2, "not writable")


def test_uncaught_exception_is_one_line_and_debug_shows_it(cli, monkeypatch):
    # a command failing with an exception rigkit did not foresee: forced through the guard
    monkeypatch.setattr("rigkit.cli.index._info", lambda args: 1 / 0)
    line = _one_line_error(cli("index", "info", "x"), 1, "ZeroDivisionError", "--debug")
    assert "division by zero" in line
    debug = cli("--debug", "index", "info", "x")
    assert debug.returncode == 1 and "Traceback" in debug.stderr


@pytest.mark.parametrize("params, words", [
    ("{n: two}", ["decider.params.n", "int"]), ("{window: 3}", ["decider.params.window", "options"]),
])
def test_bad_decider_params_are_refused_before_loading(cli, tmp_path, params, words):
    config = tmp_path / "run.yaml"
    config.write_text(f"decider:\n  name: every_n\n  params: {params}\n", encoding="utf-8")
    _one_line_error(cli("ask", "What?", "--config", str(config)), 2, *words)
    _one_line_error(cli("eval", "--qa", str(QA), "--config", str(config), "--out",
                        str(tmp_path / "o")), 2, *words)
