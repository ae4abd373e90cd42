"""A run folder as the report reads it: its results and meta.json, and other run folders over the
same questions joined in for comparison."""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rigkit.config import RunConfig
from rigkit.errors import InputError
from rigkit.eval.runner import RESULTS_FILE, read_results

__all__ = ["META_FILE", "load_compared", "load_run", "read_meta", "restrict_to_split", "split_label"]

META_FILE = "meta.json"


def load_run(run_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(meta, result lines) of a run folder; raises InputError if it holds no results."""
    folder = Path(run_dir)
    if not (folder / RESULTS_FILE).exists():
        raise InputError(f"{folder} holds no {RESULTS_FILE}: run `rigkit eval --out {folder}` first")
    meta = read_meta(folder) if (folder / META_FILE).exists() else {}
    return meta, read_results(folder)


def read_meta(folder: str | Path) -> dict[str, Any]:
    """A run folder's meta.json; a damaged one is one InputError naming the file and the line."""
    path = Path(folder) / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: not valid JSON ({err.msg}); the run's meta.json is damaged: "
                         "restore it, or delete it and run `rigkit eval` into the folder again") from None
    except (UnicodeDecodeError, OSError) as err:
        raise InputError(f"{path}: cannot be read ({type(err).__name__})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: holds {type(meta).__name__}, not the object a run's meta.json is")
    return meta


def load_compared(run_dir: str | Path, compare: Sequence[str] = (),
                  split: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`load_run(run_dir)` with the systems of other run folders over the same questions added
    as `system [label]`, so one report pairs, e.g., `rag [rerank]` against the first run's `rag`.

    Each of `compare` is `DIR` or `DIR=LABEL` (label: the folder name); `meta["compared"]`
    records every folder and the config keys in which it differs from the first. With `split`,
    every folder is first restricted to that stored split's questions (`restrict_to_split`)."""
    meta, rows = _load(run_dir, split)
    compared = []
    for spec in compare:
        folder, _, label = spec.partition("=")
        other_meta, other_rows = _load(folder, split)
        label = label or Path(folder).name
        for key in ("qa", "split", "limit"):
            same = (_same_file if key == "qa" else operator.eq)(other_meta.get(key), meta.get(key))
            if not same:
                raise InputError(f"{folder} is not over the same questions as {run_dir}: {key} "
                                 f"{other_meta.get(key)!r} vs {meta.get(key)!r}")
        if split_label(other_meta) != split_label(meta):
            raise InputError(f"{folder} used another version of the {meta.get('split')} split than {run_dir} "
                             f"({split_label(other_meta)} vs {split_label(meta)}): their questions differ, "
                             "so they cannot be paired; re-run one on the other's split")
        rows += [{**r, "system": f"{r['system']} [{label}]"} for r in other_rows]
        defaults = RunConfig().to_dict()  # a key a run's config lacks is one added since: its default
        compared.append({"dir": str(folder), "label": label, "sessions": other_meta.get("sessions", []),
                         "changed": _changed_keys(_merged(defaults, meta.get("config", {})),
                                                  _merged(defaults, other_meta.get("config", {})))})
    if compared:
        meta = {**meta, "compared": compared}
    return meta, rows


def _load(folder: str | Path, split: str | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    meta, rows = load_run(folder)
    return restrict_to_split(meta, rows, split, folder) if split else (meta, rows)


def restrict_to_split(meta: dict[str, Any], rows: list[dict[str, Any]], split: str,
                      where: str | Path = "the run") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A run's (meta, rows) on the questions of one stored split (`splits.json` beside its QA file).

    A run over every question is cut to the split's questions, and its meta then reads as a run of
    that split in the file's current version (`restricted_from: "all"`); a run of that split is
    kept as it is (its own version stands, so pairing checks it); a run of another split, or cut
    by `--limit`, is an InputError."""
    from rigkit.datasets import SPLIT_NAMES, load_splits, split_info

    if split not in SPLIT_NAMES:
        raise InputError(f"--split {split}: choose from {', '.join(SPLIT_NAMES)}")
    ran = meta.get("split", "all")
    if ran == split:
        return meta, rows
    if ran != "all":
        raise InputError(f"--split {split}: {where} ran on the {ran} split, not on every question")
    if meta.get("limit"):
        raise InputError(f"--split {split}: {where} ran on the first {meta['limit']} questions only (--limit), "
                         "so it does not hold the split's questions")
    if not meta.get("qa"):
        raise InputError(f"--split {split}: {where}'s meta.json names no QA file, so its splits.json is unknown")
    folder = Path(meta["qa"]).parent
    if not (folder / "splits.json").exists():
        raise InputError(f"--split {split}: no {folder / 'splits.json'} beside {where}'s QA file "
                         "(run the report from the folder `rigkit eval` ran in)")
    wanted = set(load_splits(folder)[split])
    kept = [r for r in rows if r["id"] in wanted]
    info = split_info(folder)
    return {**meta, "split": split, "split_version": info["version"], "split_fingerprint": info["fingerprint"],
            "restricted_from": "all"}, kept


def split_label(meta: dict[str, Any]) -> str:
    """Which stored split a run used: "all questions", or "version N (fingerprint)"; a run recorded
    before splits had versions used version 1, where linked questions could straddle splits."""
    if meta.get("split", "all") == "all":
        return "all questions"
    if meta.get("split_version") is None:
        return "version 1 (no fingerprint recorded; linked questions could straddle splits)"
    return f"version {meta['split_version']} ({meta.get('split_fingerprint')})"


def _same_file(a: str | None, b: str | None) -> bool:
    """Two recorded paths of one file (one relative to where the run started, one absolute)."""
    return a == b or (a is not None and b is not None and Path(a).resolve() == Path(b).resolve())


def _merged(defaults: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    merged = {**defaults, **config}
    for key, value in defaults.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            merged[key] = _merged(value, config[key])
    return merged


def _changed_keys(first: dict[str, Any], other: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`section.key: value` for every config value of `other` that differs from `first`."""
    changed: dict[str, Any] = {}
    for key in sorted(set(first) | set(other)):
        a, b = first.get(key), other.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changed.update(_changed_keys(a, b, f"{prefix}{key}."))
        elif a != b:
            changed[f"{prefix}{key}"] = b
    return changed
