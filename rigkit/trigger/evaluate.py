"""Which trigger signal works best? Classifier vs the hand-set deciders, on the same labels.

On the held-out test questions (recorded in the model file, so never trained on): ROC-AUC, PR-AUC
and accuracy / F1 at each signal's own threshold, for the trained classifier and for the
probability, entropy and keyword deciders' `Decision.score`. Metrics that are undefined on a
one-class test set are reported as None with a note, not as a crash or a misleading 0.5.
Each AUC comes with a bootstrap 95% interval that resamples *questions* (a question's segments
share one answer and one label rule, so they are not independent draws); every signal is scored
on the same resamples, so their intervals can be compared. `cross_set` trains on one data set's
labels and scores on another's (and the reverse): does a learned trigger generalise?
`end_effect` then asks whether it matters downstream: EM / F1 and retrievals per question of RIG
with the classifier decider vs the probability decider on the same questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rigkit.deciders.base import DecisionState
from rigkit.deciders.trigger_features import FeatureExtractor
from rigkit.errors import InputError
from rigkit.trigger.labelset import LabelledSegment, LabelSet
from rigkit.trigger.model import TriggerModel, assign_splits

__all__ = ["SignalScores", "TriggerReport", "evaluate_trigger", "signal_metrics", "split_rows",
           "ranking_aucs", "bootstrap_intervals", "cross_set", "cross_set_table"]

BASELINE_DECIDERS = ("prob", "entropy", "keyword")
BOOTSTRAP_RESAMPLES = 1000


@dataclass
class SignalScores:
    """One signal's scores and yes/no decisions on the evaluated segments."""

    name: str
    scores: list[float]
    decisions: list[int]
    threshold: float | None = None


@dataclass
class TriggerReport:
    """Per-signal metrics on the same labels, plus the curves' raw material."""

    labels: list[int]
    signals: list[SignalScores]
    metrics: dict[str, dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    split: str = "test"
    questions: int = 0
    bootstrap: dict[str, Any] = field(default_factory=dict)  # resamples, unit, level, seed, valid

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "segments": len(self.labels),
            "positives": int(sum(self.labels)),
            "questions": self.questions,
            "signals": self.metrics,
            "bootstrap": self.bootstrap,
            "notes": self.notes,
        }

    def table(self) -> str:
        """A Markdown table, one row per signal; AUCs with their bootstrap 95% interval."""
        head = ("| signal | ROC-AUC [95% CI] | PR-AUC [95% CI] | accuracy | F1 | threshold |\n"
                "| --- | --- | --- | --- | --- | --- |")
        lines = [head]
        for name, m in self.metrics.items():
            cells = [_with_ci(m, "roc_auc"), _with_ci(m, "pr_auc")]
            cells += [_fmt(m.get(k)) for k in ("accuracy", "f1", "threshold")]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        pos = int(sum(self.labels))
        lines.append(
            f"\n{self.split} split: {len(self.labels)} segments of {self.questions} questions, {pos} "
            f"positive (PR-AUC of a random signal = {pos / max(len(self.labels), 1):.3f})"
        )
        if self.bootstrap.get("resamples"):
            b = self.bootstrap
            lines.append(f"intervals: percentile bootstrap over questions, {b['valid']} of "
                         f"{b['resamples']} resamples with both classes (seed {b['seed']})")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def figure(self):
        """A plotly figure: ROC curves (left) and precision-recall curves (right)."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
        from sklearn.metrics import precision_recall_curve, roc_curve

        fig = make_subplots(rows=1, cols=2, subplot_titles=("ROC", "Precision-recall"))
        y = np.array(self.labels)
        if len(set(y.tolist())) < 2:
            fig.update_layout(title="curves undefined: the evaluated labels have one class")
            return fig
        for sig in self.signals:
            m = self.metrics[sig.name]
            fpr, tpr, _ = roc_curve(y, sig.scores)
            prec, rec, _ = precision_recall_curve(y, sig.scores)
            fig.add_trace(go.Scatter(x=fpr, y=tpr, name=f"{sig.name} (AUC {_fmt(m['roc_auc'])})",
                                     legendgroup=sig.name, mode="lines"), row=1, col=1)
            fig.add_trace(go.Scatter(x=rec, y=prec, name=f"{sig.name} (AP {_fmt(m['pr_auc'])})",
                                     legendgroup=sig.name, mode="lines"), row=1, col=2)
        fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], name="chance", mode="lines",
                                 line={"dash": "dot", "color": "grey"}), row=1, col=1)
        fig.update_xaxes(title_text="false positive rate", row=1, col=1)
        fig.update_yaxes(title_text="true positive rate", row=1, col=1)
        fig.update_xaxes(title_text="recall", row=1, col=2)
        fig.update_yaxes(title_text="precision", row=1, col=2)
        fig.update_layout(title=f"Retrieval-trigger signals on the {self.split} split "
                                f"({len(y)} segments, {int(y.sum())} positive)", height=420)
        return fig


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _with_ci(metrics: dict[str, Any], key: str) -> str:
    ci = metrics.get(f"{key}_ci")
    cell = _fmt(metrics.get(key))
    return f"{cell} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else cell


def ranking_aucs(y: np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    """(ROC-AUC, average precision) exactly as sklearn's `roc_auc_score` and
    `average_precision_score` compute them (ties share a threshold), without their input checks:
    the bootstrap calls this thousands of times. `y` must hold both classes."""
    order = np.argsort(-scores, kind="mergesort")
    ranked, hits = scores[order], y[order]
    cut = np.r_[np.flatnonzero(np.diff(ranked)), len(hits) - 1]  # last index of each distinct score
    tps = np.cumsum(hits)[cut].astype(float)
    fps = cut + 1 - tps
    tpr, fpr = np.r_[0.0, tps / tps[-1]], np.r_[0.0, fps / fps[-1]]
    roc = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    ap = float(np.sum(np.diff(tpr) * tps / (tps + fps)))
    return roc, ap


def bootstrap_intervals(
    labels: Sequence[int],
    scores: dict[str, Sequence[float]],
    groups: Sequence[str],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[dict[str, dict[str, list[float] | None]], int]:
    """Percentile intervals of ROC-AUC and PR-AUC per signal, resampling whole groups (questions).

    Every signal is scored on the same resamples; a resample that draws one class only has no AUC
    and is skipped. Returns ({signal: {"roc_auc_ci": [lo, hi] | None, "pr_auc_ci": ...}}, number
    of resamples used); intervals are None when fewer than 20 resamples were usable."""
    y = np.asarray(labels, dtype=int)
    names = sorted(set(groups))
    members = {g: [] for g in names}
    for i, g in enumerate(groups):
        members[g].append(i)
    index = [np.asarray(members[g]) for g in names]
    rng = np.random.default_rng(seed)
    values: dict[str, dict[str, list[float]]] = {k: {"roc_auc": [], "pr_auc": []} for k in scores}
    arrays = {k: np.asarray(v, dtype=float) for k, v in scores.items()}
    valid = 0
    for _ in range(resamples if names else 0):
        rows = np.concatenate([index[i] for i in rng.integers(0, len(names), len(names))])
        yb = y[rows]
        if yb.min() == yb.max():
            continue
        valid += 1
        for k, s in arrays.items():
            roc, ap = ranking_aucs(yb, s[rows])
            values[k]["roc_auc"].append(roc)
            values[k]["pr_auc"].append(ap)
    tail = 100 * (1 - level) / 2
    out = {}
    for k, v in values.items():
        out[k] = {f"{m}_ci": ([float(x) for x in np.percentile(v[m], [tail, 100 - tail])]
                              if valid >= 20 else None) for m in ("roc_auc", "pr_auc")}
    return out, valid


def signal_metrics(labels: Sequence[int], scores: Sequence[float], decisions: Sequence[int]) -> dict:
    """ROC-AUC / PR-AUC (None on one class), accuracy and F1 of the decisions."""
    from sklearn.metrics import accuracy_score, average_precision_score, f1_score, roc_auc_score

    y = np.asarray(labels, dtype=int)
    s = np.asarray(scores, dtype=float)
    both = len(set(y.tolist())) == 2
    return {
        "roc_auc": float(roc_auc_score(y, s)) if both else None,
        "pr_auc": float(average_precision_score(y, s)) if both else None,
        "accuracy": float(accuracy_score(y, decisions)) if len(y) else None,
        "f1": float(f1_score(y, decisions, zero_division=0)) if len(y) else None,
        "retrieve_rate": float(np.mean(decisions)) if len(y) else None,
    }


def resolve_split(labels: LabelSet, model: TriggerModel | None, split: str | None) -> str:
    """The split to score: `None` means "all" for labels the model never trained on, else "test".

    "all" is refused when any labelled question was among the model's training or dev questions:
    scoring a model on what it was fitted or tuned on says nothing."""
    seen = set()
    if model is not None:
        recorded = model.meta.get("split_qids") or {}
        seen = set(recorded.get("train", [])) | set(recorded.get("dev", []))
    overlap = seen & {r.qid for r in labels.rows}
    if split is None:
        return "test" if overlap or model is None else "all"
    if split == "all" and overlap:
        raise InputError(f"--split all: {len(overlap)} of these labelled questions were used to "
                         "train or tune the model; score its test split instead")
    return split


def split_rows(labels: LabelSet, model: TriggerModel | None, split: str = "test") -> list[LabelledSegment]:
    """Rows of the model's held-out split (as recorded at training), else a fresh assignment."""
    if split == "all":
        return list(labels.rows)
    recorded = (model.meta.get("split_qids") or {}).get(split) if model is not None else None
    if recorded is not None:
        keep = set(recorded)
    else:
        split_of, _ = assign_splits(labels)
        keep = {q for q, s in split_of.items() if s == split}
    return [r for r in labels.rows if r.qid in keep]


def evaluate_trigger(
    labels: LabelSet,
    model: TriggerModel | None = None,
    deciders: Sequence[str] = BASELINE_DECIDERS,
    split: str | None = "test",
    embedder: Any | None = None,
    bootstrap: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> TriggerReport:
    """Score every signal on the same held-out segments; see the module docstring.

    `bootstrap`: resamples of questions for the AUCs' 95% intervals (0: none)."""
    if model is not None and model.meta.get("rule") and model.meta["rule"] != labels.rule:
        labels = labels.relabel(model.meta["rule"])
    split = resolve_split(labels, model, split)
    rows = split_rows(labels, model, split)
    if not rows:
        raise InputError(f"no labelled segments fall in the {split} split: label more questions")
    y = [r.label for r in rows]
    signals, notes = [], []
    if model is not None:
        scores = model.score_rows(rows, FeatureExtractor(model.spec, embedder)).tolist()
        decisions = [int(s >= model.threshold) for s in scores]
        signals.append(SignalScores("classifier", scores, decisions, model.threshold))
    missing_evidence = any(not r.has_token_evidence for r in rows)
    for name in deciders:
        if missing_evidence:
            notes.append(f"{name}: skipped, rows have no token probabilities (bring-your-own text)")
            continue
        signals.append(_decider_scores(name, rows))
    if len(set(y)) < 2:
        notes.append(f"the {split} split has one class only: ROC-AUC and PR-AUC are undefined")
    metrics = {}
    for sig in signals:
        metrics[sig.name] = {**signal_metrics(y, sig.scores, sig.decisions), "threshold": sig.threshold}
    qids = [r.qid for r in rows]
    info: dict[str, Any] = {"resamples": bootstrap, "unit": "question", "level": 0.95, "seed": seed, "valid": 0}
    if bootstrap and len(set(y)) == 2:
        intervals, info["valid"] = bootstrap_intervals(y, {s.name: s.scores for s in signals}, qids,
                                                       bootstrap, seed)
        for name, ci in intervals.items():
            metrics[name].update(ci)
        if info["valid"] < 20:
            notes.append(f"only {info['valid']} bootstrap resamples held both classes: no intervals")
    else:
        for m in metrics.values():
            m.update(roc_auc_ci=None, pr_auc_ci=None)
    return TriggerReport(y, signals, metrics, notes, split, len(set(qids)), info)


def cross_set(
    first: LabelSet,
    second: LabelSet,
    features: tuple[str, ...] = ("probability", "embedding"),
    model: str = "logreg",
    rule: str | None = None,
    deciders: Sequence[str] = BASELINE_DECIDERS,
    bootstrap: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    embedder: Any | None = None,
) -> dict[str, Any]:
    """Train on each set's train split (threshold on its dev), score on its own test split and on
    every question of the other set; both directions. Returns {"A->A": report, "A->B": ...} as
    dicts, keyed by the sets' names, plus the models' recorded metadata."""
    from rigkit.trigger.model import train_trigger

    sets = {_set_name(first, "A"): first, _set_name(second, "B"): second}
    if len(sets) < 2:
        raise InputError("cross-set evaluation needs labels of two different data sets")
    shared = {r.qid for r in first.rows} & {r.qid for r in second.rows}
    if shared:
        raise InputError(f"the two labelled sets share {len(shared)} question ids: not two data sets")
    out: dict[str, Any] = {"rule": rule, "features": list(features), "runs": {}}
    for train_name, train_labels in sets.items():
        try:
            trained = train_trigger(train_labels, features=features, model=model, rule=rule, seed=seed,
                                    embedder=embedder)
        except InputError as err:
            raise InputError(f"training on {train_name}: {err}") from err
        for test_name, test_labels in sets.items():
            split = "test" if test_name == train_name else "all"
            report = evaluate_trigger(test_labels, trained, deciders=deciders, split=split,
                                      embedder=embedder, bootstrap=bootstrap, seed=seed)
            out["runs"][f"{train_name} -> {test_name}"] = {
                "train": train_name, "scored": test_name, **report.to_dict(),
                "threshold": trained.threshold, "counts": trained.meta.get("counts")}
    return out


def _set_name(labels: LabelSet, fallback: str) -> str:
    source = labels.meta.get("set_dir") or labels.meta.get("qa") or ""
    return Path(source).name if source else fallback


def cross_set_table(result: dict[str, Any]) -> str:
    """One Markdown row per (trained on, scored on, signal)."""
    lines = ["| trained on | scored on | split | signal | ROC-AUC [95% CI] | PR-AUC [95% CI] | F1 | segments (pos) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in result["runs"].values():
        for name, m in run["signals"].items():
            lines.append(f"| {run['train']} | {run['scored']} | {run['split']} | {name} | "
                         f"{_with_ci(m, 'roc_auc')} | {_with_ci(m, 'pr_auc')} | {_fmt(m.get('f1'))} | "
                         f"{run['segments']} ({run['positives']}) |")
    return "\n".join(lines)


def _decider_scores(name: str, rows: list[LabelledSegment]) -> SignalScores:
    """A registered decider's score on stored segments (no generator: no extra model passes)."""
    from rigkit.build import build_decider
    from rigkit.config import DeciderConfig

    decider = build_decider(DeciderConfig(name=name))
    scores, decisions, threshold = [], [], None
    for row in rows:
        state = DecisionState(question=row.question, round_index=row.index)
        decision = decider.decide(row.segment(), state)
        scores.append(float(decision.score))
        decisions.append(int(decision.retrieve))
        threshold = decision.threshold if decision.threshold is not None else threshold
    return SignalScores(name, scores, decisions, threshold)
