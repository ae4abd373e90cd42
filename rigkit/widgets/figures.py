"""Plotly figures built from trace data: the token budget, decider scores, threshold sweeps.

Pure functions returning `plotly.graph_objects.Figure`; widgets wrap them in a `FigureWidget`
(which needs `anywidget`), static reports write them with `include_plotlyjs=True` so the page
works offline. plotly is imported inside each function: rigkit's core never imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rigkit.trace import Decision, RIGResult, RoundTrace

__all__ = [
    "BUDGET_PARTS",
    "budget_figure",
    "decider_figure",
    "threshold_sweep_figure",
    "scores_from_results",
    "scores_from_rows",
    "cuts_from_results",
    "retrieval_counts",
    "score_cut",
]

BUDGET_PARTS = ("system", "question", "passages", "draft", "free")
_COLORS = {
    "system": "#94a3b8", "question": "#a78bfa", "passages": "#34d399", "draft": "#60a5fa",
    "free": "#f1f5f9", "pre-filled": "#f97316", "cached": "#22c55e",
}


def _go() -> Any:
    import plotly.graph_objects as go  # imported when a figure is drawn: it takes a while

    return go


def budget_figure(trace: RoundTrace, height: int = 190) -> Any:
    """Stacked bar of the context (system, question, passages, draft, free) against the limit,
    and a second bar of this round's prompt tokens: pre-filled vs served from the KV cache."""
    go = _go()
    b = trace.budget
    values = {"system": b.system, "question": b.question, "passages": b.passages,
              "draft": b.draft, "free": b.free}
    fig = go.Figure()
    for part in BUDGET_PARTS:
        fig.add_bar(
            name=part, y=["context"], x=[values[part]], orientation="h",
            marker_color=_COLORS[part], marker_line_color="#cbd5e1", marker_line_width=1,
            hovertemplate=f"{part}: %{{x}} tokens<extra></extra>",
        )
    for part, value in (("pre-filled", trace.tokens_prefilled), ("cached", trace.tokens_reused or 0)):
        fig.add_bar(
            name=part, y=["this round's prompt"], x=[value], orientation="h",
            marker_color=_COLORS[part], hovertemplate=f"{part}: %{{x}} tokens<extra></extra>",
        )
    if b.limit:
        fig.add_vline(x=b.limit, line_dash="dash", line_color="#111",
                      annotation_text=f"limit {b.limit}", annotation_position="top")
    fig.update_layout(
        barmode="stack", height=height, margin=dict(l=10, r=10, t=30, b=10),
        legend=dict(orientation="h", y=-0.25), xaxis_title=None, template="plotly_white",
    )
    return fig


def score_cut(decision: Decision) -> float | None:
    """Where the decision's threshold falls on its [0, 1] score scale, or None if unknown.

    `Decision.threshold` is in the decider's own unit (`Decision.unit`: a token probability,
    nats, a token count); each decider records the same cut on the score scale in
    `Decision.score_threshold`. Older traces may state it in `evidence["score_threshold"]`; a
    threshold with no stated unit that already lies in [0, 1] is taken as a cut on the score.
    """
    if decision.score_threshold is not None:
        return float(decision.score_threshold)
    stated = decision.evidence.get("score_threshold") if decision.evidence else None
    if stated is not None:
        return float(stated)
    t = decision.threshold
    if t is None or decision.unit not in ("", "score"):
        return None
    return t if 0.0 <= t <= 1.0 else None


def _first_cut(decisions: Iterable[Decision]) -> float | None:
    return next((c for c in map(score_cut, decisions) if c is not None), None)


def scores_from_results(results: Mapping[str, RIGResult]) -> dict[str, list[float]]:
    """Decider name -> its score per round, read from each decider's run of one question."""
    return {name: [r.decision.score for r in res.rounds] for name, res in results.items()}


def scores_from_rows(
    rows: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, list[float]], dict[str, float | None], list[str]]:
    """(scores, score cut-offs, segment texts) from `compare_deciders` rows."""
    decisions: dict[str, list[Decision]] = {}
    for row in rows:
        for name, decision in row["decisions"].items():
            decisions.setdefault(name, []).append(decision)
    scores = {name: [d.score for d in ds] for name, ds in decisions.items()}
    cuts = {name: _first_cut(ds) for name, ds in decisions.items()}
    return scores, cuts, [row.get("text", "") for row in rows]


def cuts_from_results(results: Mapping[str, RIGResult]) -> dict[str, float | None]:
    """Decider name -> its threshold on the score scale, read from its run's decisions."""
    return {name: _first_cut(r.decision for r in res.rounds) for name, res in results.items()}


def decider_figure(
    scores: Mapping[str, Sequence[float]],
    thresholds: Mapping[str, float | None] | None = None,
    segments: Sequence[str] | None = None,
    height: int = 360,
) -> Any:
    """Each decider's score per segment (lines), with its threshold as a dashed line.

    `thresholds` are cut-offs on the score scale (see `score_cut`), not raw decider units.
    """
    go = _go()
    import plotly.express as px

    palette = px.colors.qualitative.Plotly
    thresholds = thresholds or {}
    fig = go.Figure()
    for i, (name, values) in enumerate(scores.items()):
        color = palette[i % len(palette)]
        labels = [(segments[j] if segments and j < len(segments) else "")[:80]
                  for j in range(len(values))]
        fig.add_scatter(
            x=list(range(len(values))), y=list(values), mode="lines+markers", name=name,
            line_color=color, customdata=labels,
            hovertemplate=f"{name}: %{{y:.3f}}<br>segment %{{x}}: %{{customdata}}<extra></extra>",
        )
        threshold = thresholds.get(name)
        if threshold is not None:
            fig.add_hline(y=threshold, line_dash="dash", line_color=color,
                          annotation_text=f"{name} cut-off {threshold:.2f}",
                          annotation_position="top left")
    fig.update_layout(
        height=height, template="plotly_white", xaxis_title="segment", yaxis_title="score",
        yaxis_range=[-0.02, 1.05], margin=dict(l=10, r=10, t=30, b=10),
    )
    return fig


def retrieval_counts(scores: Sequence[float], thresholds: Sequence[float]) -> list[int]:
    """How many segments would trigger retrieval at each cut-off (score >= cut-off)."""
    return [sum(1 for s in scores if s >= t) for t in thresholds]


def threshold_sweep_figure(
    scores: Mapping[str, Sequence[float]], thresholds: Sequence[float] | None = None,
    height: int = 320,
) -> Any:
    """Triggered segments vs a cut-off on the score scale, per decider: where would each fire?

    A first-order view from one generation's scores: a real re-run changes later segments once
    retrieval happens, which the RoundStepper's threshold picker shows.
    """
    go = _go()
    grid = list(thresholds) if thresholds is not None else [i / 20 for i in range(21)]
    fig = go.Figure()
    for name, values in scores.items():
        fig.add_scatter(x=grid, y=retrieval_counts(values, grid), mode="lines+markers", name=name,
                        line_shape="hv")
    fig.update_layout(
        height=height, template="plotly_white", xaxis_title="cut-off on the score",
        yaxis_title="segments that trigger retrieval", margin=dict(l=10, r=10, t=30, b=10),
    )
    return fig
