"""QA sets in the shared format, and the one fixed train/dev/test split per set.

A QA file is JSONL, one question a line: `id`, `question`, `answer`, `type`, `supporting_titles`,
`paragraphs` (`pid`, `title`, `text`, `is_supporting`), plus source-specific extras kept as is.
Each set has one split by *question*, stratified by question type with a fixed seed and stored in
`data/<set>/splits.json`, so the trigger classifier never trains on evaluation questions and
every tool agrees on which questions are which. Labels downstream are imbalanced: stratifying
keeps rare types in every part.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from rigkit.errors import CorpusError, InputError
from rigkit.files import atomic_write, iter_jsonl

__all__ = [
    "REQUIRED_FIELDS",
    "load_qa",
    "load_splits",
    "make_splits",
    "write_splits",
    "split_questions",
]

REQUIRED_FIELDS = ("id", "question", "answer")
SPLIT_NAMES = ("train", "dev", "test")


def load_qa(path: str | Path) -> list[dict[str, Any]]:
    """Questions of a QA JSONL file; a bad line is a CorpusError naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: QA file not found")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for lineno, row in iter_jsonl(path):
        missing = [k for k in REQUIRED_FIELDS if k not in row]
        if missing:
            raise CorpusError(f"{path}, line {lineno}: missing field(s) {', '.join(missing)}")
        row["id"] = str(row["id"])
        if row["id"] in seen:
            raise CorpusError(f"{path}, line {lineno}: duplicate id {row['id']!r}")
        seen.add(row["id"])
        row.setdefault("type", "")
        row.setdefault("supporting_titles", [])
        row.setdefault("paragraphs", [])
        rows.append(row)
    return rows


def make_splits(
    rows: list[dict[str, Any]],
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    seed: int = 13,
) -> dict[str, list[str]]:
    """Question ids split train/dev/test, stratified by `type` (largest-remainder per type)."""
    if abs(sum(fractions) - 1.0) > 1e-9:
        raise InputError(f"split fractions must sum to 1, got {fractions}")
    by_type: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        by_type[row.get("type", "")].append(row["id"])
    rng = random.Random(seed)
    parts: dict[str, list[str]] = {name: [] for name in SPLIT_NAMES}
    carry = [0.0, 0.0, 0.0]  # fractional shares carried across types keep totals on target
    for qtype in sorted(by_type):
        ids = sorted(by_type[qtype])
        rng.shuffle(ids)
        want = [len(ids) * f + c for f, c in zip(fractions, carry)]
        counts = [int(w) for w in want]
        for i in sorted(range(3), key=lambda i: want[i] - counts[i], reverse=True)[
            : len(ids) - sum(counts)
        ]:
            counts[i] += 1
        carry = [w - c for w, c in zip(want, counts)]
        start = 0
        for name, count in zip(SPLIT_NAMES, counts):
            parts[name].extend(ids[start : start + count])
            start += count
    return {name: sorted(ids) for name, ids in parts.items()}


def write_splits(set_dir: str | Path, seed: int = 13, fractions=(0.6, 0.2, 0.2)) -> Path:
    """Create `<set_dir>/splits.json` from `<set_dir>/qa.jsonl` (atomic write)."""
    set_dir = Path(set_dir)
    rows = load_qa(set_dir / "qa.jsonl")
    splits = make_splits(rows, fractions, seed)
    payload = {"seed": seed, "fractions": list(fractions), "stratified_by": "type", **splits}
    target = set_dir / "splits.json"
    with atomic_write(target) as out:
        json.dump(payload, out, indent=1)
        out.write("\n")
    return target


def load_splits(set_dir: str | Path) -> dict[str, list[str]]:
    """{"train", "dev", "test"} -> question ids, from `<set_dir>/splits.json`."""
    path = Path(set_dir) / "splits.json"
    if not path.exists():
        raise InputError(
            f"{path} not found; create it with "
            f"`python -c \"from rigkit.datasets import write_splits; write_splits('{set_dir}')\"`"
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name: list(data[name]) for name in SPLIT_NAMES}


def split_questions(
    rows: list[dict[str, Any]], set_dir: str | Path, split: str
) -> list[dict[str, Any]]:
    """The rows of one split (order kept)."""
    if split not in SPLIT_NAMES:
        raise InputError(f"unknown split {split!r}; choose from {SPLIT_NAMES}")
    wanted = set(load_splits(set_dir)[split])
    return [row for row in rows if row["id"] in wanted]
