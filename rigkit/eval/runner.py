"""Run systems over questions and stream one JSON line per question x system x run, resumably.

The results file is the evaluation's only state. Each line is appended, flushed and fsync'ed as
soon as its answer is scored, so killing the process loses at most the answer in flight. On
start the runner repairs a torn last line (a kill can cut one mid-write: the partial bytes are
dropped, every complete line is kept), reads the (question id, system, run) keys already there
and skips them. A line that recorded an error is retried on the next start; readers keep the last
line per key. A lock file stops two processes from appending to one folder.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigkit.errors import InputError, RigkitError
from rigkit.eval.metrics import FaithfulnessScorer, QAItem, score_result
from rigkit.eval.systems import System
from rigkit.trace import RIGResult

__all__ = ["RESULTS_FILE", "TRACES_FILE", "ResultsFile", "RunSummary", "read_results",
           "result_key", "summarize_result", "run_eval"]

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
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                with contextlib.suppress(ValueError):
                    row = json.loads(line)
                    if isinstance(row, dict):
                        yield row

    def append(self, row: dict[str, Any]) -> None:
        line = json.dumps(row, ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())


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


def summarize_result(result: RIGResult) -> dict[str, Any]:
    """The compact trace kept in a result line (the full trace goes to traces.jsonl)."""
    return {
        "used_retrieval_times": result.used_retrieval_times,
        "citations": list(result.citations),
        "tokens": dict(result.tokens),
        "low_confidence": result.low_confidence,
        "rounds": [
            {
                "i": r.index,
                "fire": r.decision.retrieve,
                "score": round(float(r.decision.score), 4),
                "decider": r.decision.decider,
                "query": r.query.text if r.query else None,
                "hits": [h.chunk_id for h in r.hits],
                "added": list(r.injection.added) if r.injection else [],
                "action": r.action,
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
def _locked(folder: Path) -> Iterator[None]:
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


def _answer_row(system: System, item: QAItem, run: int, seed: int,
                faithfulness: FaithfulnessScorer | None) -> tuple[dict[str, Any], RIGResult | None]:
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
    row["error"] = None
    return row, result


def _progress(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="answer", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True, smoothing=0.05, desc="eval")


def run_eval(items: Sequence[QAItem], systems: Sequence[System], out_dir: str | Path,
             runs: int = 1, base_seed: int = 0, faithfulness: FaithfulnessScorer | None = None,
             traces: bool = True, progress: bool = True) -> RunSummary:
    """Answer every (run, question, system) not yet in `out_dir/results.jsonl`.

    Order is run-major, then question, then system, so a partial evaluation still compares all
    systems on the same questions.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = ResultsFile(out / RESULTS_FILE)
    trace_file = ResultsFile(out / TRACES_FILE)
    with _locked(out):
        dropped = results.repair() + trace_file.repair()
        if dropped:
            print(f"rigkit eval: dropped a torn last line ({dropped} bytes) from {out}",
                  file=sys.stderr)
        done = {result_key(r) for r in read_results(results.path) if not r.get("error")}
        plan = [(run, item, system) for run in range(runs) for item in items for system in systems]
        todo = [p for p in plan if (p[1].id, p[2].name, p[0]) not in done]
        summary = RunSummary(results.path, len(plan), len(plan) - len(todo), 0, 0)
        streak = 0
        with _progress(len(plan), summary.skipped, progress) as bar:
            for run, item, system in todo:
                bar.set_postfix_str(f"run {run} {system.name}", refresh=False)
                row, result = _answer_row(system, item, run, base_seed + run, faithfulness)
                if result is not None and traces:
                    trace_file.append({"id": item.id, "system": system.name, "run": run,
                                       "result": result.to_dict()})
                results.append(row)
                summary.written += 1
                bar.update(1)
                if row["error"]:
                    summary.errors += 1
                    streak += 1
                    print(f"rigkit eval: {system.name} failed on {item.id}: {row['error']}",
                          file=sys.stderr)
                    if streak >= MAX_CONSECUTIVE_ERRORS:
                        raise RigkitError(f"{streak} answers in a row failed; last: {row['error']}")
                else:
                    streak = 0
    return summary
