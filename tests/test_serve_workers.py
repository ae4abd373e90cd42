"""Several RIG loops at once: the worker pool, the per-worker generators, and `rigkit serve --workers`.

The pool's logic is tested on its own (jobs start in order, one per free worker; the bound and
the drain hold with several workers); the service gives each worker its own generator; and a
real `rigkit serve` process (`tests.scripted_serve`, a scripted model that writes one word at a
time) shows several answers in flight at once with `--workers`, one with the default.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rigkit.config import GeneratorConfig, RunConfig
from rigkit.serve.service import RigService
from rigkit.serve.worker import Busy, CancelledJob, Draining, ModelWorker
from rigkit.testing import DictRetriever
from tests.conftest import hang_limit
from tests.scripted_serve import ANSWER, HITS, SlowScript

httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parent.parent


def _wait_for(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + hang_limit(seconds)
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached")
        time.sleep(0.005)


# -- the pool ------------------------------------------------------------------------------------
def test_each_worker_runs_one_job_and_the_rest_wait_in_order():
    worker = ModelWorker(max_queue=4, workers=2)
    release = threading.Event()
    started: list[int] = []

    def job_fn(n):
        def fn(job):
            started.append(n)
            release.wait(5)
            return job.slot
        return fn

    jobs = [worker.submit(job_fn(n)) for n in range(4)]
    _wait_for(lambda: worker.running == 2)
    assert sorted(started) == [0, 1] and worker.depth == 4  # two run, two wait
    release.set()
    slots = [j.future.result(timeout=5) for j in jobs]
    worker.close(timeout=5)
    assert sorted(started[:2]) == [0, 1] and sorted(started[2:]) == [2, 3]  # arrival order
    assert set(slots) == {0, 1} and slots[0] != slots[1]  # the first two ran side by side
    assert worker.completed == 4


def test_the_bound_counts_waiting_jobs_once_every_worker_is_busy():
    worker = ModelWorker(max_queue=1, workers=2)
    release = threading.Event()
    first = worker.submit(lambda job: release.wait(5))
    second = worker.submit(lambda job: release.wait(5))
    _wait_for(lambda: worker.running == 2)
    waiting = worker.submit(lambda job: "third")  # every worker busy: it waits
    with pytest.raises(Busy) as busy:
        worker.submit(lambda job: "fourth")
    # one waiting job, two workers: a slot is likely free within one mean job time
    assert busy.value.retry_after == worker.retry_after() >= 1
    worker.cancel(waiting)
    assert isinstance(waiting.future.exception(timeout=1), CancelledJob)
    worker.drain()
    with pytest.raises(Draining):
        worker.submit(lambda job: "refused")
    release.set()
    worker.close(timeout=5)
    assert first.future.result(timeout=1) and second.future.result(timeout=1)


def test_stop_cancels_every_running_job():
    worker = ModelWorker(max_queue=2, workers=2)
    seen: list[bool] = []

    def until_cancelled(job):
        seen.append(job.cancelled.wait(5))
        return "stopped"

    jobs = [worker.submit(until_cancelled) for _ in range(2)]
    _wait_for(lambda: worker.running == 2)
    worker.stop(timeout=5)
    assert seen == [True, True] and [j.future.result(timeout=1) for j in jobs] == ["stopped"] * 2


def test_worker_counts_are_checked():
    with pytest.raises(ValueError, match="workers"):
        ModelWorker(workers=0)


# -- the service ---------------------------------------------------------------------------------
class GatedScript(SlowScript):
    """The scripted answer, after every generator in the test has been asked at once."""

    def __init__(self, gate: threading.Barrier):
        super().__init__(pause=0.0)
        self.gate = gate

    def next_segment(self, prompt, stop, max_new_tokens, on_token=None):
        self.gate.wait(5)  # breaks (and the run fails) unless every worker is in here together
        return super().next_segment(prompt, stop, max_new_tokens, on_token)


def test_each_worker_answers_with_its_own_generator_at_the_same_time():
    gate = threading.Barrier(3)
    made: list[GatedScript] = []

    def factory():
        made.append(GatedScript(gate))
        return made[-1]

    config = RunConfig.from_dict({"decider": {"name": "never"}})
    service = RigService(config, generator=factory(), generator_factory=factory, workers=3,
                         retriever=DictRetriever({}, default=HITS))
    jobs = [service.worker.submit(lambda job, n=n: service.ask(job, f"question {n}")) for n in range(3)]
    answers = [j.future.result(timeout=hang_limit(10)).answer for j in jobs]
    service.worker.close(timeout=5)
    assert answers == [ANSWER] * 3
    assert len(made) == 3 and len({id(g) for g in made}) == 3
    assert {service.generator_of(slot) for slot in range(3)} == set(made)


def test_the_default_is_one_worker_in_process_and_several_for_a_served_model():
    from rigkit.build import default_concurrency

    assert default_concurrency(GeneratorConfig()) == 1
    assert default_concurrency(GeneratorConfig(backend="openai")) > 1
    with pytest.raises(ValueError, match="generator_factory"):
        RigService(RunConfig(), generator=SlowScript(0.0), workers=2, retriever=DictRetriever({}))


# -- a real server -------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _most_running_at_once(*args: str, clients: int) -> tuple[int, list[str], dict]:
    """Start a scripted `rigkit serve *args`, send `clients` questions at once; -> the most
    answers /health saw in flight together, the answers, and the last /health."""
    port = _free_port()
    env = {**os.environ, "RIGKIT_TEST_TOKEN_SECONDS": "0.05"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.scripted_serve", "--port", str(port), *args],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: proc.poll() is not None or _healthy(base), seconds=30)
        assert proc.poll() is None, "rigkit serve exited"
        most, done = 0, threading.Event()

        def watch():
            nonlocal most
            while not done.is_set():
                most = max(most, httpx.get(f"{base}/health", timeout=5).json()["running"])
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        with ThreadPoolExecutor(clients) as pool:
            replies = list(pool.map(lambda n: httpx.post(f"{base}/chat", json={"question": f"q{n}"},
                                                         timeout=hang_limit(60)), range(clients)))
        done.set()
        watcher.join()
        health = httpx.get(f"{base}/health", timeout=5).json()
        return most, [r.json()["answer"] for r in replies], health
    finally:
        proc.kill()
        proc.wait(30)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow  # starts `rigkit serve` processes
def test_rigkit_serve_workers_answers_several_clients_at_once():
    most, answers, health = _most_running_at_once("--workers", "3", clients=3)
    assert most == 3 and health["workers"] == 3
    assert answers == [ANSWER] * 3 and health["completed"] == 3
    most, answers, health = _most_running_at_once(clients=3)  # the scripted model is in-process: one
    assert most == 1 and health["workers"] == 1 and answers == [ANSWER] * 3
