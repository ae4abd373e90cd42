"""Calibrate the hand-set deciders' thresholds on a data set's dev split, judged per question.

A labelled set (`rigkit trigger build-labels`) holds each question's closed-book segments with their
token evidence, whether the closed-book answer was already right (`info.closed_cover`) and whether
the gold paragraphs turned it right (rule r1, `info.gain`). That is enough to replay a decider
offline: a question *retrieves* when the decider's own `decide()` fires on any of its segments.
Per decider and threshold, over the questions of one split:

- retrieval rate: share of all questions that retrieve;
- recall: share of the r1-positive questions ("retrieval turns the answer right") that retrieve;
- over-search: share of the questions answered right closed-book that retrieve anyway.

The threshold is chosen on the dev split only (`CHOICE_RULE`) and reported on test beside the
decider's current default; the question-level ROC-AUC (score = the highest `Decision.score` over the
question's segments) against r1 comes with a question bootstrap interval (`bootstrap_intervals`).
Concessions: r1 and closed-book correctness are cover matches of one greedy answer each; the entropy
decider is replayed on entropy alone (labels store no attention), so its threshold is for
`decider.params.use_attention: false`; the margin decider needs per-token margins, which only sets
built after build-labels stored them carry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rigkit.deciders.base import DecisionState
from rigkit.deciders.calibration import REPLAY_PARAMS
from rigkit.errors import InputError
from rigkit.trigger.evaluate import BOOTSTRAP_RESAMPLES, bootstrap_intervals, ranking_aucs
from rigkit.trigger.labelset import LabelledSegment, LabelSet

__all__ = ["CHOICE_RULE", "CALIBRATED_DECIDERS", "Question", "OperatingPoint", "DeciderCalibration",
           "Calibration", "questions_of", "operating_point", "choose_threshold", "calibrate"]

CALIBRATED_DECIDERS = ("prob", "entropy", "margin")
CHOICE_RULE = ("on the dev split, the grid threshold with the highest recall of helped questions minus "
               "over-search (Youden's J, the closed-book-right questions as negatives); ties go to "
               "fewer retrievals, then to the threshold that fires least")
# The score each decider reports, back in its threshold's unit (the deciders' docstrings define
# score = 1 - p, 1 - exp(-RIND), 1 - margin): only to place the grid where the dev questions lie.
_UNIT_OF_SCORE: dict[str, Callable[[float], float]] = {
    "probability": lambda s: 1.0 - s,
    "probability margin": lambda s: 1.0 - s,
    "nats": lambda s: -math.log1p(-min(s, 1.0 - 1e-12)),
}
_SPLITS = ("dev", "test")
FEW = 10  # fewer dev questions of a class than this: say the choice is rough


@dataclass
class Question:
    """One labelled question: its closed-book segments and the two question-level verdicts."""

    qid: str
    split: str
    helped: bool  # r1: closed-book wrong, right (or much better) with the gold paragraphs
    right: bool  # the closed-book answer already covers the gold answer
    segments: list[LabelledSegment] = field(default_factory=list)


@dataclass
class OperatingPoint:
    """A decider at one threshold on one split's questions (rates None where nothing to count)."""

    threshold: float
    questions: int
    fired: int
    helped: int
    helped_fired: int
    right: int
    right_fired: int

    @property
    def retrieval_rate(self) -> float | None:
        return self.fired / self.questions if self.questions else None

    @property
    def recall(self) -> float | None:
        return self.helped_fired / self.helped if self.helped else None

    @property
    def over_search(self) -> float | None:
        return self.right_fired / self.right if self.right else None

    @property
    def youden(self) -> float | None:
        if self.recall is None or self.over_search is None:
            return None
        return self.recall - self.over_search

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "retrieval_rate": self.retrieval_rate, "recall": self.recall,
                "over_search": self.over_search, "youden": self.youden}


@dataclass
class DeciderCalibration:
    """One decider's grid, AUROC and chosen threshold; `chosen` None when dev cannot choose."""

    name: str
    unit: str
    default: float
    chosen: float | None
    grid: dict[str, list[OperatingPoint]]  # split -> one point per grid threshold
    at_default: dict[str, OperatingPoint]
    at_chosen: dict[str, OperatingPoint]
    auroc: dict[str, dict[str, Any]]  # split -> {"value", "ci", "questions", "helped"}
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit, "default_threshold": self.default, "chosen_threshold": self.chosen,
            "notes": self.notes, "auroc": self.auroc,
            "at_default": {s: p.to_dict() for s, p in self.at_default.items()},
            "at_chosen": {s: p.to_dict() for s, p in self.at_chosen.items()},
            "grid": {s: [p.to_dict() for p in pts] for s, pts in self.grid.items()},
        }


@dataclass
class Calibration:
    """Every calibrated decider, the deciders the labels cannot replay, and what made them."""

    meta: dict[str, Any]
    deciders: list[DeciderCalibration]
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why not calibratable
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.meta, "rule": CHOICE_RULE,
                "deciders": {d.name: d.to_dict() for d in self.deciders},
                "not_calibratable": self.skipped, "notes": self.notes}

    def table(self) -> str:
        """Per decider: the dev grid (where the choice is made), then dev / test at default and chosen."""
        out = [f"labels {self.meta['labels']} ({self.meta['generator']}); splits "
               f"{self.meta['split_source']}; questions: "
               + ", ".join(f"{s} {self.meta['questions'][s]}" for s in _SPLITS)]
        out.append(f"rule: {CHOICE_RULE}")
        for d in self.deciders:
            out += ["", f"## {d.name} (threshold in {d.unit}; default {d.default:g})",
                    "| threshold | retrieval rate | recall of helped | over-search | J |",
                    "| --- | --- | --- | --- | --- |"]
            for p in d.grid["dev"]:
                mark = "".join(f" ({w})" for w, t in (("default", d.default), ("chosen", d.chosen))
                               if p.threshold == t)
                out.append(f"| {p.threshold:g}{mark} | {_rate(p.fired, p.questions)} | "
                           f"{_rate(p.helped_fired, p.helped)} | {_rate(p.right_fired, p.right)} | "
                           f"{_num(p.youden)} |")
        out += ["", "| decider | split | ROC-AUC [95% CI] | threshold | retrieval rate | "
                "recall of helped | over-search |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for d in self.deciders:
            for split in _SPLITS:
                auc = d.auroc[split]
                cell = _num(auc["value"]) + (f" [{auc['ci'][0]:.2f}, {auc['ci'][1]:.2f}]" if auc["ci"] else "")
                points = [("default", d.at_default[split]), ("chosen", d.at_chosen.get(split))]
                for which, p in (wp for wp in points if wp[1] is not None):
                    out.append(f"| {d.name} | {split} | {cell} | {p.threshold:g} ({which}) | "
                               f"{_rate(p.fired, p.questions)} | {_rate(p.helped_fired, p.helped)} | "
                               f"{_rate(p.right_fired, p.right)} |")
                    cell = ""
        out.append("\nintervals: percentile bootstrap over questions "
                   f"({self.meta['bootstrap']['resamples']} resamples, seed {self.meta['bootstrap']['seed']})")
        out += [f"note: {n}" for n in self.notes]
        for d in self.deciders:
            out += [f"note ({d.name}): {n}" for n in d.notes]
            if d.chosen is not None:
                out.append(f"use {d.name}: {use_flags(d.name, d.chosen)}")
        out += [f"not calibratable ({name}): {why}" for name, why in self.skipped.items()]
        return "\n".join(out)


def use_flags(name: str, threshold: float) -> str:
    """The settings that run decider `name` at `threshold` (`rigkit ask`, `rigkit eval` rig:NAME)."""
    flags = f"--set decider.name={name} --set decider.threshold={threshold:g}"
    for key, value in REPLAY_PARAMS.get(name, {}).items():  # what the replay ran it under
        flags += f" --set decider.params.{key}={json.dumps(value)}"
    return flags


def _rate(k: int, n: int) -> str:
    return f"{k / n:.2f} ({k}/{n})" if n else "n/a (0)"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def questions_of(labels: LabelSet) -> tuple[list[Question], str]:
    """The labelled questions with their split (the data set's splits.json where recorded), and
    where the split came from. One clear error when the rows cannot be replayed or judged."""
    from rigkit.trigger.model import assign_splits

    source = labels.path or "labels"
    if not labels.rows:
        raise InputError(f"{source}: no labelled segments")
    if not any(r.logprobs for r in labels.rows):
        raise InputError(f"{source}: rows carry no token log-probabilities (bring-your-own text): "
                         "calibration replays deciders on labels from `rigkit trigger build-labels`")
    lacking = next((r for r in labels.rows if "closed_cover" not in r.info
                    or ("gain" not in r.info and "r1" not in r.rules)), None)
    if lacking is not None:
        raise InputError(f"{source}: question {lacking.qid!r} has no closed_cover / r1 verdict; calibration "
                         "needs labels from `rigkit trigger build-labels`")
    split_of, split_source = assign_splits(labels)
    by_qid: dict[str, Question] = {}
    for row in labels.rows:
        q = by_qid.setdefault(row.qid, Question(row.qid, split_of[row.qid], False,
                                                float(row.info["closed_cover"]) == 1.0))
        # r1 is a question-level verdict (info.gain); without it, any segment's r1 verdict
        q.helped = q.helped or bool(row.info["gain"] if "gain" in row.info else row.rules["r1"])
        q.segments.append(row)
    return list(by_qid.values()), split_source


def operating_point(threshold: float, questions: Sequence[Question], fires: dict[str, bool]) -> OperatingPoint:
    """Count, over `questions`, how many retrieve (`fires[qid]`), overall and per verdict."""
    helped = [q for q in questions if q.helped]
    right = [q for q in questions if q.right]
    return OperatingPoint(threshold, len(questions), sum(fires[q.qid] for q in questions),
                          len(helped), sum(fires[q.qid] for q in helped),
                          len(right), sum(fires[q.qid] for q in right))


def choose_threshold(points: Sequence[OperatingPoint]) -> OperatingPoint | None:
    """`CHOICE_RULE` over dev points given least-firing threshold first; None when J is undefined
    (dev has no helped or no closed-book-right question)."""
    scored = [(i, p) for i, p in enumerate(points) if p.youden is not None]
    if not scored:
        return None
    best = max(scored, key=lambda ip: (round(ip[1].youden, 12), -ip[1].fired, -ip[0]))
    return best[1]


def calibrate(
    labels: LabelSet,
    deciders: Sequence[str] = CALIBRATED_DECIDERS,
    grid: int = 21,
    bootstrap: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Calibration:
    """Choose each decider's threshold on dev and report it on test; see the module docstring.

    `grid`: thresholds tried, placed at evenly spaced quantiles of the dev questions' values in the
    decider's unit (plus its default); `bootstrap`: question resamples for the AUROC intervals."""
    if grid < 2:
        raise InputError(f"--grid {grid}: try at least 2 thresholds")
    labelled, split_source = questions_of(labels)
    parts = {s: [q for q in labelled if q.split == s] for s in _SPLITS}
    questions = parts["dev"] + parts["test"]  # train questions are the classifier's, not used here
    if not parts["dev"]:
        raise InputError("no labelled question falls in the dev split: nothing to choose a threshold on")
    results, scores, skipped = [], {}, {}
    for name in deciders:
        why = _not_calibratable(name, labels)
        if why:
            skipped[name] = why
            continue
        result, scores[name] = _calibrate_one(name, questions, parts, grid)
        results.append(result)
    meta = _meta(labels, split_source, parts)
    meta["bootstrap"] = {"resamples": bootstrap, "unit": "question", "level": 0.95, "seed": seed,
                         "valid": {s: _add_aurocs(results, scores, parts[s], s, bootstrap, seed) for s in _SPLITS}}
    helped, right = meta["helped"]["dev"], meta["right_closed_book"]["dev"]
    notes = []
    if min(helped, right) < FEW:
        notes.append(f"dev holds {helped} helped and {right} closed-book-right questions: each one moves "
                     "recall or over-search by a large step, so the choice is rough")
    return Calibration(meta, results, skipped, notes)


def _not_calibratable(name: str, labels: LabelSet) -> str:
    from rigkit.deciders import DECIDERS, check_decider_name

    cls = DECIDERS[check_decider_name(name)]
    unit = getattr(cls, "unit", "")
    if getattr(cls, "default_threshold", None) is None or unit not in _UNIT_OF_SCORE:
        return f"decider {name!r} has no threshold on a token-evidence scale to replay from labels"
    if name == "margin" and any(len(r.margins) != len(r.tokens) for r in labels.rows if r.tokens):
        return ("the labels store no per-token top-1 minus top-2 margins (sets built before build-labels "
                "kept them); label again with `rigkit trigger build-labels` on the in-process backend")
    return ""


def _build(name: str, threshold: float | None):
    """Decider `name` at `threshold` (None: its default) through the registry, as a run builds it."""
    import dataclasses

    from rigkit.build import build_decider
    from rigkit.config import RunConfig

    section = RunConfig().with_decider(name).decider
    return build_decider(dataclasses.replace(section, threshold=threshold, params=dict(REPLAY_PARAMS.get(name, {}))))


def _replay(decider, q: Question) -> tuple[bool, float]:
    """(does any segment fire, highest score): the decider's own decide() on the stored segments."""
    fired, score = False, 0.0
    for row in q.segments:
        d = decider.decide(row.segment(), DecisionState(question=row.question, round_index=row.index))
        fired, score = fired or d.retrieve, max(score, float(d.score))
    return fired, score


def _calibrate_one(name: str, questions: list[Question], parts: dict[str, list[Question]],
                   size: int) -> tuple[DeciderCalibration, dict[str, float]]:
    """The decider's dev grid and choice, and every question's score (for the AUROC)."""
    base = _build(name, None)
    default, unit = float(base.threshold), base.unit
    scores = {q.qid: _replay(base, q)[1] for q in questions}
    values = [_UNIT_OF_SCORE[unit](scores[q.qid]) for q in parts["dev"]]
    thresholds = sorted({float(f"{v:.3g}") for v in np.quantile(values, np.linspace(0, 1, size))} | {default})
    deciders = {t: _build(name, t) for t in thresholds}
    # least-firing first: the score a question must pass falls as the decider fires more
    thresholds.sort(key=lambda t: -deciders[t].score_threshold)
    fires = {t: {q.qid: _replay(deciders[t], q)[0] for q in questions} for t in thresholds}
    grid = {s: [operating_point(t, parts[s], fires[t]) for t in thresholds] for s in _SPLITS}
    best = choose_threshold(grid["dev"])
    chosen = best.threshold if best is not None else None
    notes = [] if name != "entropy" else [
        "replayed on entropy alone (labels store no attention): the threshold is for "
        "decider.params.use_attention=false"]
    if best is None:
        notes.append("dev has no helped or no closed-book-right question: J is undefined, no threshold chosen")
    at_default = {s: grid[s][thresholds.index(default)] for s in _SPLITS}
    at_chosen = {s: grid[s][thresholds.index(chosen)] for s in _SPLITS} if chosen is not None else {}
    return DeciderCalibration(name, unit, default, chosen, grid, at_default, at_chosen, {}, notes), scores


def _add_aurocs(results: list[DeciderCalibration], scores: dict[str, dict[str, float]],
                qs: list[Question], split: str, resamples: int, seed: int) -> int:
    """Question-level ROC-AUC of each decider's score against r1 on one split, every decider on
    the same question resamples; returns how many resamples held both classes."""
    y = np.array([int(q.helped) for q in qs])
    per_decider = {d.name: [scores[d.name][q.qid] for q in qs] for d in results}
    both = len(set(y.tolist())) == 2
    cis, valid = {}, 0
    if both and resamples:
        cis, valid = bootstrap_intervals(y, per_decider, [q.qid for q in qs], resamples, seed)
    for d in results:
        value = ranking_aucs(y, np.asarray(per_decider[d.name], dtype=float))[0] if both else None
        d.auroc[split] = {"value": value, "ci": cis.get(d.name, {}).get("roc_auc_ci"),
                          "questions": len(qs), "helped": int(y.sum())}
    return valid


def _meta(labels: LabelSet, split_source: str, parts: dict[str, list[Question]]) -> dict[str, Any]:
    from rigkit.datasets import split_info
    from rigkit.trigger.model import resolve_set_dir

    m = labels.meta
    set_dir = resolve_set_dir(m["set_dir"], labels.path) if m.get("set_dir") else None
    return {
        "labels": labels.path, "data_hash": m.get("data_hash"),
        "generator": m.get("generator"), "generator_source": m.get("generator_source"),
        "generator_weights": m.get("generator_weights"),
        "max_answer_tokens": (m.get("generator_config") or {}).get("max_answer_tokens"),
        "split_source": split_source, "splits": split_info(set_dir) if set_dir else None,
        "questions": {s: len(qs) for s, qs in parts.items()},
        "helped": {s: sum(q.helped for q in qs) for s, qs in parts.items()},
        "right_closed_book": {s: sum(q.right for q in qs) for s, qs in parts.items()},
    }
