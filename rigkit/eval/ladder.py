"""A model-size ladder: the same systems over several models, one table and one figure.

Each rung is a model spec: a bare model (`smollm2-135m-instruct`, a hub id, a local path,
`BASE+ADAPTER`) or `key=value` pairs separated by commas, every key a `generator` setting
(`model`, `backend`, `base_url`, `tokenizer`, ...) except two of the ladder's own: `label` (the
rung's name; default: the model) and `size` (parameters in billions, the x axis; default: read
from the model name, "135m" or "0.6b"). So a served model is one spec, whichever backend
serves it:

    model=qwen3:0.6b,backend=ollama,size=0.6

Each rung is an ordinary `rigkit eval` run in `OUT/<label>/` (resumable; its own report), and
`OUT/ladder.json` lists the rungs, so the ladder's report rebuilds from the result lines alone.
Per rung and system the table gives the type-aware score and Cover EM, short-answer EM on the open
questions, retrievals per question and the paired difference from `rag` on the same questions
(bootstrap interval, McNemar). The model-free floor (`question_only`, `echo`: no model, so one row
each, rung "(no model)") is scored on the rungs' questions and leads the table, unless a rung ran
them itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rigkit.errors import InputError
from rigkit.eval.floor import floor_rows, missing_floor
from rigkit.files import atomic_write_text

__all__ = ["LADDER_FILE", "Rung", "parse_rung", "run_ladder", "ladder_rows", "ladder_table",
           "write_ladder_report", "is_ladder"]

LADDER_FILE = "ladder.json"
_SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([mb])(?![a-z])", re.IGNORECASE)
_OWN = ("label", "size")


@dataclass(frozen=True)
class Rung:
    """One model of the ladder: its label, size (billions of parameters) and generator settings."""

    label: str
    size: float | None
    settings: dict[str, str] = field(default_factory=dict)  # generator key -> value

    @property
    def folder(self) -> str:
        return re.sub(r"[^A-Za-z0-9._+-]+", "_", self.label)

    def set_args(self) -> list[str]:
        return [f"generator.{k}={v}" for k, v in self.settings.items()]


def size_from_name(name: str) -> float | None:
    """Billions of parameters named in a model name ("smollm2-135m" -> 0.135), or None."""
    found = _SIZE.findall(Path(name).name if "/" in name and not name.startswith("http") else name)
    if not found:
        return None
    number, unit = found[-1]
    return float(number) / (1000 if unit.lower() == "m" else 1)


def parse_rung(spec: str) -> Rung:
    """One `--model` spec; InputError names what is wrong."""
    text = spec.strip()
    if not text:
        raise InputError("--model: an empty model spec")
    if "=" not in text:
        return Rung(text, size_from_name(text.split("+")[0]), {"model": text})
    pairs: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InputError(f"--model {spec!r}: expected key=value pairs separated by commas, e.g. "
                             "model=qwen3:0.6b,backend=ollama,size=0.6")
        pairs[key.strip()] = value.strip()
    if "model" not in pairs:
        raise InputError(f"--model {spec!r}: name the model (model=...)")
    size = pairs.get("size")
    try:
        size_value = float(size) if size is not None else size_from_name(pairs["model"].split("+")[0])
    except ValueError:
        raise InputError(f"--model {spec!r}: size must be a number of billions of parameters") from None
    settings = {k: v for k, v in pairs.items() if k not in _OWN}
    return Rung(pairs.get("label", pairs["model"]), size_value, settings)


def parse_rungs(specs: Sequence[str]) -> list[Rung]:
    rungs = [parse_rung(s) for s in specs]
    if len(rungs) < 1:
        raise InputError("a ladder needs at least one --model")
    folders = [r.folder for r in rungs]
    if len(set(folders)) != len(folders):
        raise InputError("two --model specs share a label: give each its own (label=...)")
    return rungs


def is_ladder(folder: str | Path) -> bool:
    return (Path(folder) / LADDER_FILE).exists()


def run_ladder(qa: str | Path, out: str | Path, specs: Sequence[str], systems: str = "closed_book,rag,rig:prob",
               *, settings: Sequence[str] = (), **evaluate_kwargs: Any) -> Path:
    """Evaluate `systems` once per model spec into `out/<label>/`; returns the ladder report path."""
    from rigkit.eval.experiment import evaluate

    rungs = parse_rungs(specs)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    data = _read_data(folder) if is_ladder(folder) else {}
    kept = [r for r in _rungs(data) if r.folder not in {n.folder for n in rungs}]
    # a later run adding systems to the same rungs keeps the earlier ones in the record
    earlier = [s for s in str(data.get("systems", "")).split(",") if s]
    every = ",".join(dict.fromkeys([*earlier, *(s.strip() for s in systems.split(",") if s.strip())]))
    atomic_write_text(folder / LADDER_FILE, json.dumps(
        {"qa": str(qa), "systems": every, "rungs": [asdict(r) for r in [*kept, *rungs]]}, indent=1))
    for rung in rungs:
        evaluate(qa, folder / rung.folder, systems, settings=[*settings, *rung.set_args()], **evaluate_kwargs)
    return write_ladder_report(folder)


def _read_data(folder: Path) -> dict[str, Any]:
    return json.loads((folder / LADDER_FILE).read_text(encoding="utf-8"))


def _rungs(data: dict[str, Any]) -> list[Rung]:
    return [Rung(r["label"], r.get("size"), dict(r.get("settings") or {})) for r in data.get("rungs", [])]


@dataclass(frozen=True)
class LadderRow:
    """One system on one rung."""

    rung: str
    size: float | None
    system: str
    questions: int
    score: Any  # Share of the type-aware score
    cover_em: float | None
    retrievals: float | None
    difference: Any  # PairedComparison against rag, or None
    em_open: float | None = None  # short-answer EM on the open questions
    open_questions: int = 0


NO_MODEL = "(no model)"  # the rung of the model-free floor rows


def ladder_rows(folder: str | Path, baseline: str = "rag", data: dict[str, Any] | None = None) -> list[LadderRow]:
    """Every (rung, system) of a ladder folder, from its rungs' result lines (`data`: its ladder
    file, already read)."""
    from rigkit.eval.answers import with_open_scores
    from rigkit.eval.decisions import with_type_aware
    from rigkit.eval.paired import compare_systems, per_question, share_interval
    from rigkit.eval.report import load_run
    from rigkit.eval.runner import RESULTS_FILE

    out: list[LadderRow] = []
    every: list[dict[str, Any]] = []

    def add(rung: str, size: float | None, rows: list[dict[str, Any]]) -> None:
        rows = with_open_scores(with_type_aware(rows))
        scores, cover = per_question(rows, "type_aware"), per_question(rows, "cover_em")
        retrievals, em_open = per_question(rows, "retrievals"), per_question(rows, "em_open")
        paired = {c.system: c for c in compare_systems(rows, baseline, ("type_aware",))}
        for system in dict.fromkeys(r["system"] for r in rows):
            mine = list(scores.get(system, {}).values())
            out.append(LadderRow(rung, size, system, len(mine), share_interval(mine) if mine else None,
                                 _mean(cover.get(system)), _mean(retrievals.get(system)), paired.get(system),
                                 _mean(em_open.get(system)), len(em_open.get(system) or {})))

    for rung in _rungs(data if data is not None else _read_data(Path(folder))):
        path = Path(folder) / rung.folder
        if not (path / RESULTS_FILE).exists():
            continue
        _, rows = load_run(path)
        every += rows
        add(rung.label, rung.size, rows)
    missing = missing_floor(every)
    if every and missing:
        rungs = len(out)
        add(NO_MODEL, None, floor_rows(every, missing))
        out = out[rungs:] + out[:rungs]  # the floor leads
    return out


def _mean(values: dict[str, float] | None) -> float | None:
    return sum(values.values()) / len(values) if values else None


def ladder_table(rows: Sequence[LadderRow], baseline: str = "rag") -> tuple[list[str], list[list[str]]]:
    header = ["Model", "Size (B)", "System", "Questions", "Type-aware [95%]", "Cover EM", "EM open (short)",
              "Retrievals/q", f"Type-aware − {baseline} [95%]", "Wins / losses, p"]
    body = []
    for r in rows:
        c = r.difference
        body.append([r.rung, "–" if r.size is None else f"{r.size:g}", r.system, str(r.questions),
                     "–" if r.score is None else str(r.score),
                     "–" if r.cover_em is None else f"{r.cover_em:.3f}",
                     "–" if r.em_open is None else f"{r.em_open:.3f} ({r.open_questions})",
                     "–" if r.retrievals is None else f"{r.retrievals:.2f}",
                     "" if c is None else f"{c.difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}]",
                     "" if c is None else f"{c.wins} / {c.losses}, p={c.p_value:.2g}"])
    return header, body


def write_ladder_report(folder: str | Path, baseline: str = "rag", out: str | Path | None = None) -> Path:
    """`ladder.md` (the table) and `ladder.html` (table and figure) in `out` (default: the ladder
    folder); returns the HTML path."""
    from rigkit.eval.figures import ladder_figure
    from rigkit.eval.report import html_table, markdown_table

    folder = Path(folder)
    data = _read_data(folder)
    rows = ladder_rows(folder, baseline, data)
    if not rows:
        raise InputError(f"{folder}: no rung has answers yet")
    target_dir = Path(out) if out is not None else folder
    target_dir.mkdir(parents=True, exist_ok=True)
    table = ladder_table(rows, baseline)
    where = "" if target_dir.resolve() == folder.resolve() else f" under `{folder}`"
    intro = (f"Model-size ladder: `{data.get('qa')}`, systems `{data.get('systems')}`; each rung's own report "
             f"is in its folder{where}. Type-aware: Cover EM with yes/no and two-option questions scored as such. "
             f"EM open: short-answer EM on the open questions (their count in brackets). `{NO_MODEL}`: the floor "
             "without a model (`question_only`: the first option named, or yes; `echo`: the question), on the "
             "rungs' questions; a system beats another only if it also beats `question_only`.")
    atomic_write_text(target_dir / "ladder.md", f"# rigkit ladder\n\n{intro}\n\n{markdown_table(table)}\n")
    fig = ladder_figure([r for r in rows if r.rung != NO_MODEL], baseline)  # no size: not on the size axis
    html = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>rigkit ladder</title></head><body>"
            f"<h1>rigkit ladder</h1><p>{intro.replace('`', '')}</p>{html_table(table)}"
            f"{fig.to_html(full_html=False, include_plotlyjs=True, default_width='100%')}</body></html>")
    target = target_dir / "ladder.html"
    atomic_write_text(target, html)
    return target
