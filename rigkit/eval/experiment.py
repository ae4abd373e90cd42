"""`evaluate(...)`: the whole evaluation from Python, as `rigkit eval` runs it.

Loads the questions (optionally one split of the data's stored train/dev/test split, so nothing
is tuned and evaluated on the same questions), one generator and one retriever shared by every
system, builds the systems, records what was run in `meta.json`, streams the answers and writes
the report. Re-running with the same folder resumes; a different configuration for an existing
folder is refused rather than mixed into one table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rigkit.config import RunConfig, Setting, apply_settings, load_config
from rigkit.errors import InputError
from rigkit.eval.metrics import FaithfulnessScorer, QAItem
from rigkit.eval.report import META_FILE, read_meta, write_report
from rigkit.eval.runner import RunSummary, locked_folder, parse_shard, run_eval, shard_items
from rigkit.eval.systems import (
    LAYOUTS,
    build_systems,
    load_parts,
    needs_gold,
    needs_model,
    parse_systems,
)
from rigkit.files import atomic_write_text

__all__ = ["SPLITS", "load_questions", "evaluate", "code_commit"]

SPLITS = ("all", "train", "dev", "test")


def load_questions(qa: str | Path, split: str = "all", limit: int | None = None) -> list[QAItem]:
    """The questions of `qa` (a qa.jsonl), restricted to a stored split, first `limit` of them."""
    from rigkit.datasets import load_qa, load_splits

    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    path = Path(qa)
    if not path.exists():
        raise InputError(f"QA file not found: {path}")
    items = [QAItem.from_record(r) for r in load_qa(path)]
    if split != "all":
        wanted = set(load_splits(path.parent)[split])
        items = [q for q in items if q.id in wanted]
    if limit is not None:
        if limit < 1:
            raise InputError("--limit must be a positive number of questions")
        items = items[:limit]
    if not items:
        raise InputError(f"no questions in {path} for split {split!r}")
    return items


def _resolve_config(config: RunConfig | str | Path | None, index: str | Path | None,
                    layout: str | None, model: str | None = None,
                    settings: Sequence[Setting] = ()) -> RunConfig:
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    cfg = apply_settings(cfg, settings)  # --set: over the file, under the flags below
    if model is not None:
        cfg = cfg.override(generator={"model": model})
    if index is not None:
        if not Path(index).exists():
            raise InputError(f"index folder not found: {index} (build one with `rigkit index build`)")
        cfg = cfg.override(retrieval={"index": str(Path(index).resolve())})
    if layout is not None:
        if layout not in LAYOUTS:
            raise InputError(f"--layout must be one of {', '.join(LAYOUTS)}")
        cfg = dataclasses.replace(cfg, context=dataclasses.replace(cfg.context, layout=layout))
    return cfg


def _check_meta(folder: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Merge with an existing meta.json; refuse a different config, data file or split."""
    path = folder / META_FILE
    if not path.exists():
        return meta
    old = read_meta(folder)
    changed = config_changes(old.get("config"), meta.get("config"))
    if changed:
        raise InputError(
            f"{folder} holds an evaluation with a different config ({'; '.join(changed[:4])}); "
            "resume with the same options or choose another --out"
        )
    for key in ("qa", "split", "split_fingerprint", "shard"):
        if old.get(key) != meta.get(key):
            raise InputError(
                f"{folder} holds an evaluation with a different {key}; resume with the same "
                "options or choose another --out"
            )
    meta["created"] = old.get("created", meta["created"])
    meta["systems"] = list(dict.fromkeys([*old.get("systems", []), *meta["systems"]]))
    meta["runs"] = max(int(old.get("runs", 0)), meta["runs"])
    meta["question_ids"] = list(dict.fromkeys([*old.get("question_ids", []),
                                               *meta["question_ids"]]))
    meta["sessions"] = old.get("sessions", [])
    return meta


def config_changes(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    """The settings two recorded configs differ in, as "key: old -> new" lines. A setting the
    older record lacks was added to rigkit after that run, which ran with its behaviour then: the
    setting's default, so it is compared as the default."""
    if old is None or new is None:
        return [] if old == new else ["config: missing"]
    changes: list[str] = []

    def walk(before: Any, after: Any, default: Any, path: str) -> None:
        if isinstance(before, dict) and isinstance(after, dict):
            default = default if isinstance(default, dict) else {}
            for key in dict.fromkeys([*before, *after]):
                missing = key not in before and key in default
                walk(default[key] if missing else before.get(key), after.get(key),
                     default.get(key), f"{path}{key}.")
        elif before != after:
            changes.append(f"{path.rstrip('.')}: {before!r} -> {after!r}")

    walk(old, new, RunConfig().to_dict(), "")
    return changes


def code_commit() -> str | None:
    """The git commit the answering rules (this rigkit's code) come from, "+dirty" when its files
    differ from that commit; None outside a git checkout (an installed wheel)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no",
                                "--", "rigkit"], capture_output=True, text=True, timeout=10,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def _split_record(qa: str | Path, split: str) -> dict[str, Any]:
    """The stored split's version and fingerprint (None for every question, or without a file)."""
    from rigkit.datasets import split_info

    folder = Path(qa).parent
    if split == "all" or not (folder / "splits.json").exists():
        return {"split_version": None, "split_fingerprint": None}
    info = split_info(folder)
    return {"split_version": info["version"], "split_fingerprint": info["fingerprint"]}


def _record_session(folder: Path, meta: dict[str, Any], started: tuple[str, float], summary: RunSummary,
                    workers: int | None) -> None:
    """Complete this call's session in meta.json (`_open_session`): what a run took on this
    machine, resumes included."""
    finished = datetime.now(timezone.utc)
    meta["updated"] = finished.isoformat(timespec="seconds")
    session = meta["sessions"][-1] if meta.get("sessions") and meta["sessions"][-1].get("finished") is None \
        else _open_session(meta, started)
    session.update({"finished": meta["updated"], "seconds": round(time.perf_counter() - started[1], 1),
                    "answers": summary.written, "workers": workers})
    atomic_write_text(folder / META_FILE, json.dumps(meta, indent=1, ensure_ascii=False))


def _open_session(meta: dict[str, Any], started: tuple[str, float]) -> dict[str, Any]:
    """A session entry written before the first answer, so a run killed mid-way still records the
    commit its answers' rules come from (a test split runs once, on frozen rules)."""
    session = {"started": started[0], "finished": None, "cpus": os.cpu_count(), "commit": code_commit()}
    meta["sessions"] = [*meta.get("sessions", []), session]
    return session


def evaluate(
    qa: str | Path,
    out: str | Path,
    systems: str | Sequence[str] = "closed_book,rag,rig:prob",
    *,
    index: str | Path | None = None,
    config: RunConfig | str | Path | None = None,
    runs: int = 1,
    limit: int | None = None,
    layout: str | None = None,
    split: str = "all",
    model: str | None = None,
    generator: Any = None,
    retriever: Any = None,
    faithfulness: bool = True,
    traces: bool = True,
    progress: bool = True,
    report: bool = True,
    concurrency: int | None = None,
    shard: str | tuple[int, int] | None = None,
    generator_factory: Any = None,
    settings: Sequence[Setting] = (),
    ray: str | None = None,
) -> RunSummary:
    """Run `systems` on the questions of `qa` into `out` (resumable) and write the report.

    `concurrency`: worker threads, each with its own generator (None: 1 in-process, 8 when the
    generator is a served model; `generator_factory()` makes a worker's generator when
    `generator` is passed in). `ray`: a Ray cluster's address ("local" for this machine) whose
    `concurrency` actors (None: one per CPU) answer instead, each loading its own parts; this
    process loads none. `shard="i/n"`: only every n-th question from the i-th; join the shards'
    folders with `merge_runs`.

    `generator` / `retriever` may be passed in (e.g. rigkit.testing's scripted parts); otherwise
    they are loaded from the config (`--config`, then `settings`: `section.key=value` as `--set`
    takes them), with `index` overriding `retrieval.index` and `model` (a short name, hub id or
    local path) overriding `generator.model`.
    """
    if runs < 1:
        raise InputError("--runs must be at least 1")
    specs = parse_systems(systems)
    cfg = _resolve_config(config, index, layout, model, settings)
    shard = parse_shard(shard) if isinstance(shard, str) else shard
    items = shard_items(load_questions(qa, split, limit), shard)
    if not items:
        raise InputError(f"shard {shard[0]}/{shard[1]} holds no questions; use fewer shards")
    if split != "test" and any(s.decider == "classifier" for s in specs):
        print("rigkit eval: warning: a classifier decider evaluated outside the test split may "
              "have been trained on these questions", file=sys.stderr)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    with locked_folder(folder):  # another eval on the folder is refused here, before meta.json is touched
        pass
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = (now, time.perf_counter())
    meta = _check_meta(folder, {
        "created": now, "updated": now, "qa": str(Path(qa)), "split": split, **_split_record(qa, split),
        "limit": limit,
        "index": str(index) if index is not None else cfg.retrieval.index,
        "config_file": None if isinstance(config, RunConfig) or config is None else str(config),
        "config": cfg.to_dict(), "systems": [s.name for s in specs], "runs": runs,
        "shard": f"{shard[0]}/{shard[1]}" if shard else None,
        "question_ids": [q.id for q in items], "dataset": items[0].dataset,
        "command": sys.argv if sys.argv and sys.argv[0].endswith("rigkit") else None,
    })
    _open_session(meta, started)
    gold = None
    if needs_gold(specs):
        from rigkit.eval.gold import load_gold
        from rigkit.eval.oracle import by_question

        if ray is not None:
            raise InputError("rig:oracle and rag:gold run in this process only, not on Ray")
        wanted = {q.id for q in items}
        gold = by_question({k: v for k, v in load_gold(qa).items() if k in wanted})
    if ray is not None and needs_model(specs):
        return _evaluate_on_ray(ray, items, specs, cfg, folder, meta, started, runs=runs, faithfulness=faithfulness,
                                traces=traces, progress=progress, workers=concurrency, report=report)
    generator, retriever = load_parts(cfg, specs, generator, retriever)
    meta["model"] = ({"spec": generator.spec or cfg.generator.model, "source": generator.source}
                     if generator is not None else {"spec": None, "source": "no model"})
    atomic_write_text(folder / META_FILE, json.dumps(meta, indent=1, ensure_ascii=False))
    built = build_systems(specs, cfg, generator, retriever, gold=gold)
    scorer = FaithfulnessScorer() if faithfulness else None
    if not needs_model(specs):
        concurrency = 1  # nothing to wait on: answers take microseconds
    elif concurrency is None:
        from rigkit.build import default_concurrency

        concurrency = default_concurrency(cfg.generator)

    def worker_systems():  # each worker its own generator: its own KV cache or HTTP session
        from rigkit.build import build_generator

        own = generator_factory() if generator_factory else build_generator(cfg.generator)
        return build_systems(specs, cfg, own, retriever, gold=gold)

    summary = run_eval(items, built, folder, runs=runs, base_seed=cfg.generator.seed,
                       faithfulness=scorer, traces=traces, progress=progress,
                       concurrency=concurrency, worker_systems=worker_systems)
    _record_session(folder, meta, started, summary, concurrency)
    if report:
        write_report(folder)
    return summary


def _evaluate_on_ray(address: str, items: list[QAItem], specs: list, cfg: RunConfig, folder: Path,
                     meta: dict[str, Any], started: tuple[str, float], *, runs: int, faithfulness: bool, traces: bool, progress: bool,
                     workers: int | None, report: bool) -> RunSummary:
    """`evaluate` with Ray actors answering; this process only plans and writes."""
    from rigkit.eval.distributed import RayWorkers

    cfg = _absolute_paths(cfg)  # actors may run in another working directory
    pool = RayWorkers(address, specs, cfg, workers, faithfulness)
    try:
        meta["model"] = {"spec": cfg.generator.model,
                         "source": f"Ray {address}: {pool.workers} workers, each its own {cfg.generator.backend} generator"}
        atomic_write_text(folder / META_FILE, json.dumps(meta, indent=1, ensure_ascii=False))
        summary = run_eval(items, specs, folder, runs=runs, base_seed=cfg.generator.seed, traces=traces,
                           progress=progress, remote=pool)
        _record_session(folder, meta, started, summary, pool.workers)
    finally:
        pool.close()
    if report:
        write_report(folder)
    return summary


def _absolute_paths(cfg: RunConfig) -> RunConfig:
    """Index and corpus paths that exist here, made absolute (URLs and names are left as they are)."""
    changes: dict = {key: str(Path(value).resolve()) for key in ("index", "corpus")
                     if (value := getattr(cfg.retrieval, key)) and Path(value).exists()}
    if any(Path(s.index).exists() for s in cfg.retrieval.sources):
        changes["sources"] = [{"name": s.name, "index": str(Path(s.index).resolve()) if Path(s.index).exists()
                               else s.index, "route": s.route} for s in cfg.retrieval.sources]
    model = cfg.generator.model
    generator = {"model": str(Path(model).resolve())} if model and Path(model).exists() else {}
    return cfg.override(retrieval=changes, generator=generator) if changes or generator else cfg
