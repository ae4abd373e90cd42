"""Evaluation on a Ray cluster: each question x system x run is a task for one of N actors.

Each actor builds its own systems from the run's config where it runs (its own generator: a
served model's URL or an in-process model; its own retriever: a retrieval server, Milvus, or an
index folder its node can read), so nothing heavy crosses the network but questions and
results. The driver (`rigkit eval --ray ADDRESS`) loads no model: it sends tasks, keeps a
bounded window in flight, and writes every finished answer through the runner's one writer,
so resuming after a stop and merging shards work exactly as for a local run.

Every node needs rigkit installed (the same version) and, for an index folder, the folder at the
same path; a served model or a retrieval server needs no files on the nodes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from rigkit.config import RunConfig
from rigkit.errors import InputError, RigkitError
from rigkit.eval.metrics import QAItem

__all__ = ["RayWorkers"]

IN_FLIGHT_PER_WORKER = 2  # a task waiting behind the running one keeps each actor busy
FORWARDED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM")


class RayWorkers:
    """`workers` Ray actors answering with the systems of `specs` under `config`.

    `address`: a running cluster ("auto", "HOST:PORT", "ray://HOST:10001"), or "local" for a
    cluster of this machine alone. `workers` None: one per CPU the cluster has."""

    def __init__(self, address: str, specs: Sequence[Any], config: RunConfig, workers: int | None = None,
                 faithfulness: bool = True):
        try:
            import ray
        except ImportError as err:
            raise InputError(f"--ray needs Ray: pip install 'rigkit[ray]' ({err})") from err
        self.ray = ray
        _check_reachable(address)
        # the actors see this process's offline and cache settings, wherever they start
        env = {k: v for k, v in os.environ.items() if k in FORWARDED_ENV or k.startswith("RIGKIT_")}
        try:
            ray.init(address=None if address == "local" else address, ignore_reinit_error=True,
                     log_to_driver=False, runtime_env={"env_vars": env} if env else None,
                     **({"include_dashboard": False} if address == "local" else {}))
        except (ConnectionError, ValueError, RuntimeError) as err:
            raise InputError(f"--ray {address}: cannot join the Ray cluster ({err})") from err
        self.workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        actor = ray.remote(num_cpus=1)(_Answerer)
        self.actors = [actor.remote(list(specs), config.to_dict(), faithfulness) for _ in range(self.workers)]

    def answers(self, todo: Sequence[tuple[int, QAItem, Any]], base_seed: int) -> Iterator[tuple[dict, Any]]:
        """(row, result) per planned (run, item, system), in finishing order."""
        ray, free, pending = self.ray, list(self.actors) * IN_FLIGHT_PER_WORKER, {}
        tasks = iter(todo)
        try:
            while True:
                while free:
                    task = next(tasks, None)
                    if task is None:
                        break
                    run, item, system = task
                    actor = free.pop()
                    pending[actor.answer.remote(run, item, system.name, base_seed + run)] = actor
                if not pending:
                    return
                [ready], _ = ray.wait(list(pending), num_returns=1)
                free.append(pending.pop(ready))
                yield _result(ray, ready)
        finally:
            for ref in pending:
                ray.cancel(ref, force=False)

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)


def _check_reachable(address: str) -> None:
    """A HOST:PORT that refuses connections is an error now: `ray.init` would retry for minutes."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", "local", "ray://...": Ray resolves and reports these itself
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as err:
        raise InputError(f"--ray {address}: no Ray cluster answers there ({err})") from err


def _result(ray: Any, ref: Any) -> tuple[dict, Any]:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        cause = err.as_instanceof_cause()
        raise cause if isinstance(cause, RigkitError) else RigkitError(f"a Ray worker failed: {err}") from err
    except ray.exceptions.RayError as err:  # a node or an actor lost: what was written is kept
        raise RigkitError(f"a Ray worker was lost ({type(err).__name__}: {err}); run the same command "
                          "again to resume") from err


class _Answerer:
    """One Ray actor: the run's systems over its own generator and retriever."""

    def __init__(self, specs: list, config: dict, faithfulness: bool):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from rigkit.eval.metrics import FaithfulnessScorer
        from rigkit.eval.systems import build_systems, load_parts

        cfg = RunConfig.from_dict(config)
        generator, retriever = load_parts(cfg, specs)
        self.systems = {s.name: s for s in build_systems(specs, cfg, generator, retriever)}
        self.scorer = FaithfulnessScorer() if faithfulness else None

    def answer(self, run: int, item: QAItem, system: str, seed: int) -> tuple[dict, Any]:
        from rigkit.eval.runner import answer_row

        return answer_row(self.systems[system], item, run, seed, self.scorer)
