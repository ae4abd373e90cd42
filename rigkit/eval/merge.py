"""Join the folders of a sharded evaluation (`rigkit eval --shard i/n`, `rigkit eval-merge`).

Only shards that belong together are merged: two or more distinct shards of one evaluation (the
same QA file, split, limit, config, runs, systems and model; disjoint questions; every shard of
the split present). The first difference is an error that names it, because a merged report
over mismatched shards reads as one evaluation ("6 questions, 2 systems") when it is not. An
evaluation already in the output folder is replaced only when asked; lines of a shard that cannot
be read (torn by a kill, or corrupt) are left out and listed, never dropped without a word.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigkit.errors import InputError
from rigkit.eval.runner import (
    RESULTS_FILE,
    TRACES_FILE,
    RunSummary,
    locked_folder,
    parse_shard,
    result_key,
)
from rigkit.files import write_jsonl_atomic

__all__ = ["MergeSummary", "merge_runs"]


@dataclass
class MergeSummary(RunSummary):
    dropped: list[str] = field(default_factory=list)  # "<file>: lines 3, 7": unreadable, not merged
    missing: int = 0  # answers the shards' questions x systems x runs call for that no shard holds


# what every shard of one evaluation shares (meta.json keys); "shard count" is compared apart
_SAME_IN_EVERY_SHARD = ("qa", "split", "split_fingerprint", "limit", "config", "runs", "systems", "model")


def merge_runs(out_dir: str | Path, shard_dirs: Sequence[str | Path], force: bool = False) -> MergeSummary:
    """Join shard folders of one evaluation into `out_dir`: results, traces, meta (no report).

    The shards must be two or more distinct shards of one evaluation (the same QA file, split,
    limit, config, runs, systems and model, disjoint questions, no shard missing); the first
    difference found is an `InputError` naming it. An evaluation already in `out_dir` is replaced
    only with `force`. Unreadable (torn or corrupt) lines are left out and listed in `dropped`.
    Written atomically, so a killed merge leaves `out_dir` as it was."""
    from rigkit.eval.report import META_FILE
    from rigkit.files import atomic_write_text

    folders = [Path(d) for d in shard_dirs]
    out = Path(out_dir)
    metas = _check_shards(folders, out, force, META_FILE)
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    traces: dict[tuple[str, str, int], dict[str, Any]] = {}
    dropped: list[str] = []
    for folder in folders:
        for name, into in ((RESULTS_FILE, rows), (TRACES_FILE, traces)):
            found, bad = _readable_rows(folder / name)
            into.update(found)
            if bad:
                dropped.append(f"{folder / name}: line{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}")
    out.mkdir(parents=True, exist_ok=True)
    with locked_folder(out):
        write_jsonl_atomic(out / TRACES_FILE, [traces[k] for k in rows if k in traces])
        write_jsonl_atomic(out / RESULTS_FILE, rows.values())
        meta = dict(metas[0])
        meta.update(shard=None, merged_from=[str(d) for d in folders],
                    question_ids=list(dict.fromkeys(q for m in metas for q in m.get("question_ids", []))),
                    systems=list(dict.fromkeys(s for m in metas for s in m.get("systems", []))),
                    runs=max(int(m.get("runs", 1)) for m in metas),
                    # shards may have run at once on several machines: each keeps its own sessions
                    sessions=[{**s, "shard": m.get("shard")} for m in metas for s in m.get("sessions", [])])
        atomic_write_text(out / META_FILE, json.dumps(meta, indent=1, ensure_ascii=False))
    expected = len(meta["question_ids"]) * len(meta["systems"]) * int(meta["runs"])
    errors = sum(1 for r in rows.values() if r.get("error"))
    return MergeSummary(out / RESULTS_FILE, len(rows), 0, len(rows), errors, dropped=dropped,
                        missing=max(0, expected - len(rows)))


def _check_shards(folders: list[Path], out: Path, force: bool, meta_file: str) -> list[dict[str, Any]]:
    """The shards' meta.json contents, once they are known to belong together (else InputError)."""
    from rigkit.eval.report import read_meta

    if len(folders) < 2:
        raise InputError("rigkit eval-merge: name two or more shard folders (one folder is already "
                         "an evaluation: `rigkit report` it)")
    resolved = [f.resolve() for f in folders]
    for i, path in enumerate(resolved):
        if path in resolved[:i]:
            raise InputError(f"rigkit eval-merge: {folders[i]} is named twice")
        if path == out.resolve():
            raise InputError(f"rigkit eval-merge: --out {out} is one of the shards; merge into a new folder")
    if not force and ((out / RESULTS_FILE).exists() or (out / meta_file).exists()):
        raise InputError(f"--out {out} already holds an evaluation; pass --force to replace it, "
                         "or choose another folder")
    metas = []
    for folder in folders:
        if not (folder / RESULTS_FILE).exists() or not (folder / meta_file).exists():
            raise InputError(f"{folder} is not a `rigkit eval` folder (no {RESULTS_FILE} / {meta_file})")
        metas.append(read_meta(folder))
    first = folders[0]
    for folder, meta in zip(folders[1:], metas[1:]):
        for key in _SAME_IN_EVERY_SHARD:
            a, b = metas[0].get(key), meta.get(key)
            if key == "systems":
                a, b = sorted(a or []), sorted(b or [])
            if a != b:
                shown = "" if key == "config" else f" ({_short(a)} against {_short(b)})"
                raise InputError(f"{first} and {folder} were run with different {key}{shown}; "
                                 "merge only shards of one evaluation")
    _check_shard_numbers(folders, metas)
    seen: dict[str, Path] = {}
    for folder, meta in zip(folders, metas):
        for qid in meta.get("question_ids", []):
            if qid in seen:
                raise InputError(f"question {qid!r} is in both {seen[qid]} and {folder}: the shards hold "
                                 "different question sets (or one shard twice)")
            seen[qid] = folder
    return metas


def _check_shard_numbers(folders: list[Path], metas: list[dict[str, Any]]) -> None:
    """Every shard i/n of one n, each once, none missing (folders run without --shard are skipped)."""
    numbered = [(f, parse_shard(m["shard"])) for f, m in zip(folders, metas) if m.get("shard")]
    if not numbered:
        return
    if len(numbered) != len(folders):
        plain = next(f for f, m in zip(folders, metas) if not m.get("shard"))
        raise InputError(f"{plain} was run without --shard; merge only shards of one evaluation")
    counts = {n for _, (_, n) in numbered}
    if len(counts) > 1:
        raise InputError(f"the shards split the questions {' and '.join(map(str, sorted(counts)))} ways; "
                         "merge only shards of one evaluation")
    n = counts.pop()
    owner: dict[int, Path] = {}
    for folder, (i, _) in numbered:
        if i in owner:
            raise InputError(f"{owner[i]} and {folder} are both shard {i}/{n}")
        owner[i] = folder
    missing = [f"{i}/{n}" for i in range(1, n + 1) if i not in owner]
    if missing:
        raise InputError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing: "
                         "run it and merge all of them")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def _readable_rows(path: Path) -> tuple[dict[tuple[str, str, int], dict[str, Any]], list[int]]:
    """The last line per key of a JSONL file, and the numbers of lines that are not a keyed object."""
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    bad: list[int] = []
    if not path.exists():
        return rows, bad
    text = path.read_text(encoding="utf-8", errors="replace")
    for lineno, line in enumerate(text.split("\n"), start=1):  # "\n" only, as iter_jsonl splits
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            key = result_key(row)
        except (ValueError, KeyError, TypeError):  # torn, not JSON, not an object, no key
            bad.append(lineno)
            continue
        rows.pop(key, None)  # re-insert so order follows the last write
        rows[key] = row
    return rows, bad
