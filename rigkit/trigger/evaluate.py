"""Which trigger signal works best? Classifier vs the hand-set deciders, on the same labels.

On the held-out test questions (recorded in the model file, so never trained on): ROC-AUC, PR-AUC
and accuracy / F1 at each signal's own threshold, for the trained classifier and for the
probability, entropy and keyword deciders' `Decision.score`. Metrics that are undefined on a
one-class test set are reported as None with a note, not as a crash or a misleading 0.5.
`end_effect` then asks whether it matters downstream: EM / F1 and retrievals per question of RIG
with the classifier decider vs the probability decider on the same questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rigkit.deciders.base import DecisionState
from rigkit.errors import InputError
from rigkit.trigger.features import FeatureExtractor
from rigkit.trigger.labelset import LabelledSegment, LabelSet
from rigkit.trigger.model import TriggerModel, assign_splits

__all__ = ["SignalScores", "TriggerReport", "evaluate_trigger", "signal_metrics", "split_rows"]

BASELINE_DECIDERS = ("prob", "entropy", "keyword")


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "segments": len(self.labels),
            "positives": int(sum(self.labels)),
            "signals": self.metrics,
            "notes": self.notes,
        }

    def table(self) -> str:
        """A Markdown table, one row per signal."""
        head = "| signal | ROC-AUC | PR-AUC | accuracy | F1 | threshold |\n| --- | --- | --- | --- | --- | --- |"
        lines = [head]
        for name, m in self.metrics.items():
            cells = [_fmt(m.get(k)) for k in ("roc_auc", "pr_auc", "accuracy", "f1", "threshold")]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        pos = int(sum(self.labels))
        lines.append(
            f"\n{self.split} split: {len(self.labels)} segments, {pos} positive "
            f"(PR-AUC of a random signal = {pos / max(len(self.labels), 1):.3f})"
        )
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


def split_rows(labels: LabelSet, model: TriggerModel | None, split: str = "test") -> list[LabelledSegment]:
    """Rows of the model's held-out split (as recorded at training), else a fresh assignment."""
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
    split: str = "test",
    embedder: Any | None = None,
) -> TriggerReport:
    """Score every signal on the same held-out segments; see the module docstring."""
    if model is not None and model.meta.get("rule") and model.meta["rule"] != labels.rule:
        labels = labels.relabel(model.meta["rule"])
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
    return TriggerReport(y, signals, metrics, notes, split)


def _decider_scores(name: str, rows: list[LabelledSegment]) -> SignalScores:
    """A registered decider's score on stored segments (no generator: no extra model passes)."""
    from rigkit.config import DeciderConfig
    from rigkit.deciders import build_decider

    decider = build_decider(DeciderConfig(name=name), generator=None)
    scores, decisions, threshold = [], [], None
    for row in rows:
        state = DecisionState(question=row.question, round_index=row.index)
        decision = decider.decide(row.segment(), state)
        scores.append(float(decision.score))
        decisions.append(int(decision.retrieve))
        threshold = decision.threshold if decision.threshold is not None else threshold
    return SignalScores(name, scores, decisions, threshold)
