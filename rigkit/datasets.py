"""QA sets in the shared format, and the one fixed train/dev/test split per set.

A QA file is JSONL, one question a line: `id`, `question`, `answer`, `type`, `supporting_titles`,
`paragraphs` (`pid`, `title`, `text`, `is_supporting`), plus source-specific extras kept as is.
Each set has one split by *question*, stratified by question type with a fixed seed and stored in
`data/<set>/splits.json`, so the trigger classifier never trains on evaluation questions and
every tool agrees on which questions are which. Labels downstream are imbalanced: stratifying
keeps rare types in every part.

Split version 2 keeps linked questions together: two questions that share a MuSiQue
decomposition step (its `id`: the same sub-question over the same paragraph, and so often the
same answer), a supporting paragraph (`pid`, or title), or a non-yes/no answer are one group, and
a group never straddles two splits (`question_links`, `split_leaks`). Version 1 (no `version`
field) split single questions, and let 19 of 40 MuSiQue test questions share a step with a train
question. `splits.json` records its version and a fingerprint of its ids (`split_info`), and an
evaluation records both, so results of different splits are never compared as one.
"""

from __future__ import annotations

import hashlib
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
    "split_info",
    "question_links",
    "split_leaks",
    "SPLIT_VERSION",
]

REQUIRED_FIELDS = ("id", "question", "answer")
SPLIT_NAMES = ("train", "dev", "test")
SPLIT_VERSION = 2  # 2: questions that share a step, paragraph or answer stay in one split


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


def question_links(row: dict[str, Any]) -> list[str]:
    """What ties a question to others: its decomposition steps, supporting paragraphs and answer."""
    from rigkit.text import normalize_words

    links = [f"step:{step['id']}" for step in row.get("question_decomposition") or []
             if isinstance(step, dict) and step.get("id") is not None]
    links += [f"pid:{p['pid']}" for p in row.get("paragraphs") or []
              if isinstance(p, dict) and p.get("is_supporting") and p.get("pid")]
    links += [f"title:{t}" for t in row.get("supporting_titles") or []]
    answer = " ".join(w for w in normalize_words(str(row.get("answer", ""))).split() if w not in ("a", "an", "the"))
    if answer and answer not in ("yes", "no"):  # every yes/no question would be one group
        links.append(f"answer:{answer}")
    return links


def _groups(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Questions joined by any shared link (connected components, union-find), in file order."""
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, row in enumerate(rows):
        for link in question_links(row):
            j = first.setdefault(link, i)
            parent[root(i)] = root(j)
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[root(i)].append(row)
    return list(groups.values())


def split_leaks(rows: list[dict[str, Any]], splits: dict[str, list[str]]) -> dict[str, set[str]]:
    """Links (`question_links`) found in more than one split -> the splits that hold them."""
    where = {qid: name for name in SPLIT_NAMES for qid in splits.get(name, [])}
    found: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        if row["id"] in where:
            for link in question_links(row):
                found[link].add(where[row["id"]])
    return {link: names for link, names in found.items() if len(names) > 1}


def make_splits(
    rows: list[dict[str, Any]],
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    seed: int = 13,
) -> dict[str, list[str]]:
    """Question ids split train/dev/test by linked group, near `fractions` within each type.

    Groups are shuffled with `seed`, then placed largest first, each in the split whose question
    types lag furthest behind their targets (a group of one type goes where that type lags)."""
    if abs(sum(fractions) - 1.0) > 1e-9:
        raise InputError(f"split fractions must sum to 1, got {fractions}")
    groups = _groups(rows)
    random.Random(seed).shuffle(groups)
    groups.sort(key=len, reverse=True)  # stable: equal sizes keep the shuffled order
    per_type: dict[str, int] = defaultdict(int)
    for row in rows:
        per_type[row.get("type", "")] += 1
    have = {name: defaultdict(int) for name in SPLIT_NAMES}
    total = dict.fromkeys(SPLIT_NAMES, 0)
    parts: dict[str, list[str]] = {name: [] for name in SPLIT_NAMES}

    def lag(name: str, group: list[dict[str, Any]]) -> tuple[float, float]:
        f = fractions[SPLIT_NAMES.index(name)]
        by_type = sum(per_type[r.get("type", "")] * f - have[name][r.get("type", "")] for r in group)
        return by_type, len(rows) * f - total[name]

    for group in groups:
        name = max(SPLIT_NAMES, key=lambda n: lag(n, group))
        for row in group:
            have[name][row.get("type", "")] += 1
            parts[name].append(row["id"])
        total[name] += len(group)
    return {name: sorted(ids) for name, ids in parts.items()}


def fingerprint(splits: dict[str, list[str]]) -> str:
    """A short hash of which ids sit in which split (order and file layout do not matter)."""
    text = json.dumps({name: sorted(splits[name]) for name in SPLIT_NAMES}, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def write_splits(set_dir: str | Path, seed: int = 13, fractions=(0.6, 0.2, 0.2)) -> Path:
    """Create `<set_dir>/splits.json` from `<set_dir>/qa.jsonl` (atomic write)."""
    set_dir = Path(set_dir)
    rows = load_qa(set_dir / "qa.jsonl")
    splits = make_splits(rows, fractions, seed)
    payload = {"version": SPLIT_VERSION, "fingerprint": fingerprint(splits), "seed": seed,
               "fractions": list(fractions), "stratified_by": "type",
               "grouped_by": "shared decomposition step, supporting paragraph or answer", **splits}
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


def split_info(set_dir: str | Path) -> dict[str, Any]:
    """{"version", "fingerprint"} of `<set_dir>/splits.json` (version 1: made before the field)."""
    path = Path(set_dir) / "splits.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    ids = {name: list(data[name]) for name in SPLIT_NAMES}
    return {"version": int(data.get("version", 1)), "fingerprint": fingerprint(ids)}


def split_questions(
    rows: list[dict[str, Any]], set_dir: str | Path, split: str
) -> list[dict[str, Any]]:
    """The rows of one split (order kept)."""
    if split not in SPLIT_NAMES:
        raise InputError(f"unknown split {split!r}; choose from {SPLIT_NAMES}")
    wanted = set(load_splits(set_dir)[split])
    return [row for row in rows if row["id"] in wanted]
