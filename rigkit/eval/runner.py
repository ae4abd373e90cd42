"""Run systems over questions and stream one JSON line per question x system x run, resumably.

The results file is the evaluation's only state. Each answer writes its full trace line, then its
result line, each flushed and fsync'ed, so killing the process loses at most the answer in
flight. On start the runner repairs a torn last line of either file (a kill can cut one
mid-write: the partial bytes are dropped, every complete line is kept), reads the (question id,
system, run) keys already in the results and skips them, and rewrites the traces file without
the traces of keys that have no good result (a kill between the two writes leaves one) and
without repeats, so after any kill and resume each key has exactly one trace and one result.
A line that recorded an error is retried on the next start; readers keep the last line per key.
A lock file stops two processes from appending to one folder.

Concurrency: `concurrency` worker threads answer questions, each with its own systems (its own
controller and generator state, `worker_systems()`); only the calling thread writes, so lines
never interleave. Workers share the process's random generators, so sampled (temperature > 0)
answers are reproducible only with `concurrency=1`; greedy ones are the same either way. Sharding: `shard=(i, n)` takes every n-th question from the i-th (1-based), so
n machines split one question file; `rigkit.eval.merge` joins their folders.

Seeds: run r uses seed `base_seed + r` for every answer (the controller reseeds the generator
with it at each question), so a resumed run samples exactly what an uninterrupted one would.
With greedy decoding, extra runs check determinism instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigkit.errors import InputError, RigkitError
from rigkit.eval.metrics import FaithfulnessScorer, QAItem, score_result
from rigkit.eval.systems import System
from rigkit.files import fault_point, iter_jsonl, write_jsonl_atomic
from rigkit.trace import RIGResult

__all__ = ["RESULTS_FILE", "TRACES_FILE", "ResultsFile", "RunSummary", "read_results",
           "read_traces", "result_key", "summarize_result", "run_eval", "shard_items",
           "parse_shard", "locked_folder"]

RESULTS_FILE = "results.jsonl"
TRACES_FILE = "traces.jsonl"
LOCK_FILE = ".lock"
MAX_CONSECUTIVE_ERRORS = 5  # a broken setup should stop the run, not fill the file with errors


def result_key(row: dict[str, Any]) -> tuple[str, str, int]:
    return str(row["id"]), str(row["system"]), int(row["run"])


class ResultsFile:
    """An append-only JSONL file that survives being killed mid-write."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def repair(self) -> int:
        """Drop a torn last line (no trailing newline, or not JSON); returns bytes removed."""
        if not self.path.exists():
            return 0
        with open(self.path, "rb+") as fh:
            data = fh.read()
            if not data or data.endswith(b"\n"):
                return 0
            cut = data.rfind(b"\n") + 1  # 0 when the only line is torn
            tail = data[cut:]
            with contextlib.suppress(ValueError):
                if isinstance(json.loads(tail), dict):  # complete record, newline missing
                    fh.write(b"\n")
                    return 0
            fh.truncate(cut)
            fh.flush()
            os.fsync(fh.fileno())
            return len(tail)

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every parsable line, in file order; a torn line is skipped, never fatal."""
        if not self.path.exists():
            return
        for _, row in iter_jsonl(self.path, skip_bad=True):
            yield row

    def append(self, row: dict[str, Any]) -> None:
        line = json.dumps(row, ensure_ascii=False) + "\n"
        step = f"eval:{self.path.stem}"  # fault points for the kill test: eval:results:written...
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            fault_point(f"{step}:written")
            os.fsync(fh.fileno())
        fault_point(f"{step}:fsync")

    def keep_only(self, wanted: set[tuple[str, str, int]]) -> int:
        """Rewrite the file atomically with the last line of each wanted key; returns lines dropped."""
        rows = list(self.rows())
        latest: dict[tuple[str, str, int], dict[str, Any]] = {}
        for row in rows:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                key = result_key(row)
                if key in wanted:
                    latest.pop(key, None)
                    latest[key] = row
        if len(latest) == len(rows):
            return 0
        write_jsonl_atomic(self.path, latest.values())
        return len(rows) - len(latest)


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """Result lines of a run folder (or file), one per key: the last line written for a key wins."""
    path = Path(path)
    path = path / RESULTS_FILE if path.is_dir() else path
    latest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for row in ResultsFile(path).rows():
        with contextlib.suppress(KeyError, TypeError, ValueError):
            key = result_key(row)
            latest.pop(key, None)  # re-insert so order follows the last write
            latest[key] = row
    return list(latest.values())


def read_traces(path: str | Path) -> list[dict[str, Any]]:
    """Full traces of a run folder, one per key that has a result line (last written wins)."""
    folder = Path(path)
    keys = {result_key(r) for r in read_results(folder)}
    latest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for row in ResultsFile(folder / TRACES_FILE).rows():
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if result_key(row) in keys:
                latest.pop(result_key(row), None)
                latest[result_key(row)] = row
    return list(latest.values())


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """"2/4" -> (2, 4): the second of four shards; None passes through."""
    if text is None:
        return None
    i, sep, n = str(text).partition("/")
    if not sep or not i.strip().isdigit() or not n.strip().isdigit() or not 1 <= int(i) <= int(n):
        raise InputError(f"--shard {text!r}: expected i/n with 1 <= i <= n, e.g. 1/4")
    return int(i), int(n)


def shard_items(items: Sequence[QAItem], shard: tuple[int, int] | None) -> list[QAItem]:
    """Every n-th question from the i-th: shards are disjoint and together hold all questions."""
    if shard is None:
        return list(items)
    i, n = shard
    return [q for k, q in enumerate(items) if k % n == i - 1]


ROW_FIELDS = ("policy", "retrieval_errors", "retrieval_failed")  # lifted from the summary


def summarize_result(result: RIGResult) -> dict[str, Any]:
    """The compact trace kept in a result line (the full trace goes to traces.jsonl)."""
    return {
        "used_retrieval_times": result.used_retrieval_times,
        "citations": list(result.citations),
        "tokens": dict(result.tokens),
        "low_confidence": result.low_confidence,
        "policy": result.policy,
        "retrieval_errors": list(result.errors),
        # every retrieval this answer tried failed: it is not a RIG answer, and is reported apart
        "retrieval_failed": bool(result.errors) and result.used_retrieval_times == 0,
        # passages put before the question (plain RAG, gold passages): what the per-hop table reads
        "upfront": list(result.upfront.added) if result.upfront else [],
        "rounds": [
            {
                "i": r.index,
                "fire": r.decision.retrieve,
                "score": round(float(r.decision.score), 4),
                "decider": r.decision.decider,
                "text": r.segment.text,  # the judged segment: where the decider fired, token-level
                "query": r.query.text if r.query else None,
                "hits": [h.chunk_id for h in r.hits],
                "added": list(r.injection.added) if r.injection else [],
                "action": r.action,
                "kept": r.kept,  # what it left in the answer (rigkit.trace.kept_order)
                "error": r.error,
            }
            for r in result.rounds
        ],
    }


@dataclass
class RunSummary:
    path: Path
    total: int  # question x system x run keys asked for
    skipped: int  # already in the file
    written: int  # lines written by this call
    errors: int  # of those, lines that recorded an error


def _seed_everything(seed: int) -> None:
    """Seed the RNGs a generator may sample from; torch/numpy only if already imported."""
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)


@contextlib.contextmanager
def locked_folder(folder: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no advisory locks on this platform: run unguarded
        yield
        return
    with open(folder / LOCK_FILE, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            raise InputError(f"{folder} is in use by another `rigkit eval`; wait for it or "
                             "choose another --out") from err
        yield


def answer_row(system: System, item: QAItem, run: int, seed: int,
               faithfulness: FaithfulnessScorer | None) -> tuple[dict[str, Any], RIGResult | None]:
    """One answer as its results row (scores, cost, or the error) and its result (None on error)."""
    row: dict[str, Any] = {
        "id": item.id, "type": item.type, "dataset": item.dataset, "system": system.name,
        "run": run, "seed": seed, "layout": system.config.context.layout,
        "question": item.question, "gold": item.golds,
    }
    _seed_everything(seed)
    start = time.perf_counter()
    try:
        result = system.answer(item.question, seed)
    except (KeyboardInterrupt, RigkitError):
        raise
    except Exception as err:  # one failing answer must not end a long evaluation
        row.update(answer=None, latency=time.perf_counter() - start,
                   error=f"{type(err).__name__}: {err}")
        row["traceback"] = traceback.format_exc(limit=6)
        return row, None
    row["latency"] = time.perf_counter() - start
    row["answer"] = result.answer
    row.update(score_result(result, item, faithfulness))
    row["model"] = {k: result.model.get(k) for k in ("spec", "source") if k in result.model}
    row["summary"] = summarize_result(result)
    # what the report counts per answer, at the row's top level beside the scores
    row.update({key: row["summary"][key] for key in ROW_FIELDS})
    row["error"] = None
    return row, result


def _progress(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="answer", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True, smoothing=0.05, desc="eval")


def run_eval(items: Sequence[QAItem], systems: Sequence[System], out_dir: str | Path,
             runs: int = 1, base_seed: int = 0, faithfulness: FaithfulnessScorer | None = None,
             traces: bool = True, progress: bool = True, concurrency: int = 1,
             worker_systems: Callable[[], Sequence[System]] | None = None,
             remote: Any = None) -> RunSummary:
    """Answer every (run, question, system) not yet in `out_dir/results.jsonl`.

    Order is run-major, then question, then system, so a partial evaluation still compares all
    systems on the same questions. With `concurrency` > 1, `worker_systems()` builds each extra
    worker's own systems (same names, own generator state); answers finish in any order.
    `remote` (e.g. `rigkit.eval.distributed.RayWorkers`) answers elsewhere instead: its
    `answers(todo, base_seed)` yields (row, result) pairs and `systems` need only their names.
    """
    if concurrency < 1:
        raise InputError("--concurrency must be at least 1")
    if concurrency > 1 and worker_systems is None:
        raise InputError("concurrent evaluation needs a way to build each worker's systems")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = ResultsFile(out / RESULTS_FILE)
    trace_file = ResultsFile(out / TRACES_FILE)
    with locked_folder(out):
        dropped = results.repair() + trace_file.repair()
        if dropped:
            print(f"rigkit eval: dropped a torn last line ({dropped} bytes) from {out}",
                  file=sys.stderr)
        done = {result_key(r) for r in read_results(results.path) if not r.get("error")}
        trace_file.keep_only(done)  # traces of unfinished answers are redone with them
        plan = [(run, item, system) for run in range(runs) for item in items for system in systems]
        todo = [p for p in plan if (p[1].id, p[2].name, p[0]) not in done]
        summary = RunSummary(results.path, len(plan), len(plan) - len(todo), 0, 0)
        writer = _Writer(results, trace_file if traces else None, summary)
        with _progress(len(plan), summary.skipped, progress) as bar:
            answers = (remote.answers(todo, base_seed) if remote is not None
                       else _answers(todo, base_seed, faithfulness, concurrency, worker_systems))
            for row, result in answers:
                bar.set_postfix_str(f"run {row['run']} {row['system']}", refresh=False)
                writer.write(row, result)
                bar.update(1)
    return summary


class _Writer:
    """The one place lines are written: trace first, then result, then the error streak."""

    def __init__(self, results: ResultsFile, traces: ResultsFile | None, summary: RunSummary):
        self.results, self.traces, self.summary, self.streak = results, traces, summary, 0

    def write(self, row: dict[str, Any], result: RIGResult | None) -> None:
        if result is not None and self.traces is not None:
            self.traces.append({"id": row["id"], "system": row["system"], "run": row["run"],
                                "result": result.to_dict()})
        self.results.append(row)
        self.summary.written += 1
        if not row["error"]:
            self.streak = 0
            return
        self.summary.errors += 1
        self.streak += 1
        print(f"rigkit eval: {row['system']} failed on {row['id']}: {row['error']}", file=sys.stderr)
        if self.streak >= MAX_CONSECUTIVE_ERRORS:
            raise RigkitError(f"{self.streak} answers in a row failed; last: {row['error']}")


def _answers(todo, base_seed, faithfulness, concurrency, worker_systems):
    """(row, result) per planned answer: in plan order in-process, in finishing order with workers."""
    if concurrency == 1:
        for run, item, system in todo:
            yield answer_row(system, item, run, base_seed + run, faithfulness)
        return
    import queue
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    pool: queue.Queue = queue.Queue()
    pool.put(None)  # None: the caller's own systems (worker 0)
    for _ in range(concurrency - 1):
        pool.put({s.name: s for s in worker_systems()})

    def answer(run, item, system):
        own = pool.get()
        try:
            chosen = system if own is None else own[system.name]
            return answer_row(chosen, item, run, base_seed + run, faithfulness)
        finally:
            pool.put(own)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="rigkit-eval") as ex:
        pending = set()
        tasks = iter(todo)
        try:
            for task in tasks:  # keep a bounded window in flight, so a kill wastes little
                pending.add(ex.submit(answer, *task))
                if len(pending) >= 2 * concurrency:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in finished:
                        yield f.result()
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    yield f.result()
        finally:
            for f in pending:
                f.cancel()
