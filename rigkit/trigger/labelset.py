"""Labelled segment sets: the training data of the retrieval-trigger classifier.

A labelled set is a JSONL file whose first line is a metadata header (`{"_meta": {...}}`: the
generator spec that wrote the segments, the labelling rule, the QA file's content hash) followed by
one `LabelledSegment` a line. Files without that header are read as *bring-your-own* labels: a CSV
or JSONL table with at least `text` and `label` columns (optionally `question`, `qid`, `split`;
JSONL rows may add `tokens`, `logprobs`, `entropies`, `margins` from their generator), the seed
use case being a vertical domain (law, medicine) where a team labels its own segments.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rigkit.errors import InputError
from rigkit.files import atomic_write_text, iter_jsonl
from rigkit.trace import Segment

__all__ = ["LABELS_FORMAT", "LabelledSegment", "LabelSet", "load_labels"]

LABELS_FORMAT = 1
_TRUE = {"1", "true", "yes", "y", "t", "retrieve", "pos", "positive"}
_FALSE = {"0", "false", "no", "n", "f", "none", "neg", "negative"}


@dataclass
class LabelledSegment:
    """One generated (or user-written) segment with its label and the evidence features need.

    `tokens` / `logprobs` / `entropies` are parallel per-token lists (empty for bring-your-own
    rows); `margins` too (top-1 minus top-2 probability, for the margin decider) where the
    generator gave them and the set was built after they were stored, else empty; `hidden` is the generator's mean-pooled last-layer state of the segment, (hidden_dim,).
    `rules` holds every rule's verdict so a set can be re-labelled by another rule without
    re-running the model; `label` is the verdict of the set's chosen rule.
    """

    qid: str
    question: str
    text: str
    label: int
    index: int = 0
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    hidden: list[float] | None = None
    rules: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    margins: list[float] = field(default_factory=list)  # last: older files have no such field

    def segment(self) -> Segment:
        """The row as a trace `Segment`, so deciders can score it exactly as in a run."""
        return Segment(
            text=self.text,
            tokens=list(self.tokens),
            token_ids=list(range(len(self.tokens))),
            logprobs=list(self.logprobs),
            entropies=list(self.entropies),
            margins=list(self.margins),
        )

    @property
    def has_token_evidence(self) -> bool:
        return bool(self.logprobs) or not self.text.strip()


@dataclass
class LabelSet:
    """Rows plus the metadata that made them (generator, rule, data version)."""

    rows: list[LabelledSegment]
    meta: dict[str, Any] = field(default_factory=dict)
    path: str | None = None  # where it was loaded from (to find its data set's splits.json)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def rule(self) -> str:
        return str(self.meta.get("rule", "user"))

    @property
    def positives(self) -> int:
        return sum(r.label for r in self.rows)

    def relabel(self, rule: str) -> LabelSet:
        """A copy whose `label` is another stored rule's verdict (no model needed)."""
        if rule == self.rule:
            return self
        missing = [i for i, r in enumerate(self.rows) if rule not in r.rules]
        if missing:
            known = sorted({k for r in self.rows for k in r.rules}) or ["none"]
            raise InputError(f"labels have no verdicts of rule {rule!r}; stored rules: {known}")
        rows = [LabelledSegment(**{**asdict(r), "label": int(r.rules[rule])}) for r in self.rows]
        return LabelSet(rows, {**self.meta, "rule": rule}, self.path)

    def save(self, path: str | Path) -> Path:
        """Write header + rows atomically (a temp file in the same folder, then `os.replace`)."""
        lines = [json.dumps({"_meta": {**self.meta, "format": LABELS_FORMAT}}, ensure_ascii=False)]
        lines += [json.dumps(_row_to_json(r), ensure_ascii=False) for r in self.rows]
        return atomic_write_text(path, "\n".join(lines) + "\n")


def _row_to_json(row: LabelledSegment) -> dict[str, Any]:
    data = asdict(row)
    # 6 significant digits keep a 576-wide hidden state ~4 kB a row without changing predictions.
    for key in ("logprobs", "entropies", "margins"):
        data[key] = [float(f"{x:.6g}") for x in data[key]]
    if data["hidden"] is not None:
        data["hidden"] = [float(f"{x:.6g}") for x in data["hidden"]]
    return data


def load_labels(path: str | Path) -> LabelSet:
    """Read a rigkit labelled set, or a bring-your-own CSV / JSONL table of `text,label`."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"labels file not found: {path}")
    if path.suffix.lower() in (".csv", ".tsv"):
        return _load_table(path, list(_csv_records(path)))
    try:
        records = list(iter_jsonl(path, error=InputError))
    except InputError as err:
        raise InputError(f"{err}; a CSV table needs a .csv or .tsv name") from None
    if records and "_meta" in records[0][1]:
        return _load_rigkit(path, records)
    return _load_table(path, [(i, {str(k).lower(): v for k, v in rec.items()}) for i, rec in records])


def _load_rigkit(path: Path, records: list[tuple[int, dict[str, Any]]]) -> LabelSet:
    meta = records[0][1]["_meta"]
    if int(meta.get("format", 1)) > LABELS_FORMAT:
        raise InputError(f"{path}: labels format {meta['format']} is newer than this rigkit")
    rows: list[LabelledSegment] = []
    for lineno, record in records[1:]:
        try:
            rows.append(LabelledSegment(**record))
        except TypeError as err:
            raise InputError(f"{path}:{lineno}: not a labelled segment ({err})") from None
    return LabelSet(rows, meta, str(path))


def _load_table(path: Path, records: list[tuple[int, dict[str, Any]]]) -> LabelSet:
    """Bring-your-own labels: each row is a segment; rows without `qid` are their own group."""
    if not records:
        raise InputError(f"{path}: no rows")
    rows = []
    for lineno, rec in records:
        if "text" not in rec or "label" not in rec:
            raise InputError(f"{path}:{lineno}: needs columns 'text' and 'label', got {sorted(rec)}")
        label = _parse_label(rec["label"], f"{path}:{lineno}")
        qid = str(rec.get("qid") or rec.get("question_id") or f"row{lineno}")
        rows.append(
            LabelledSegment(
                qid=qid,
                question=str(rec.get("question") or ""),
                text=str(rec["text"]),
                label=label,
                rules={"user": label},
                info={"split": rec["split"]} if rec.get("split") else {},
                # JSONL rows may carry the generator's token evidence (probability features)
                tokens=list(rec.get("tokens") or []),
                logprobs=[float(x) for x in rec.get("logprobs") or []],
                entropies=[float(x) for x in rec.get("entropies") or []],
                margins=[float(x) for x in rec.get("margins") or []],
            )
        )
    meta = {"rule": "user", "source": str(path), "generator": None, "data_hash": _file_hash(path)}
    return LabelSet(rows, meta, str(path))


def _csv_records(path: Path):
    """(line number, row with lower-case column names) of a CSV or TSV table."""
    with path.open(encoding="utf-8", newline="") as fh:
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        for i, rec in enumerate(csv.DictReader(fh, delimiter=delimiter), start=2):
            yield i, {k.strip().lower(): v for k, v in rec.items() if k}


def _parse_label(value: Any, where: str) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        if value in (0, 1):
            return int(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return 1
    if text in _FALSE:
        return 0
    raise InputError(f"{where}: label {value!r} is not 0/1, true/false or yes/no")


def _file_hash(path: Path) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]
