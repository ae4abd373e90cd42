"""Plotly figures of an evaluation, pure functions of aggregated stats or result lines.

Imported only by the report (and notebooks): the core never imports plotly.
"""

from __future__ import annotations

from typing import Any

from rigkit.eval.aggregate import ALL_TYPES, GroupStats, row_field
from rigkit.eval.paired import PairedComparison

__all__ = ["accuracy_figure", "latency_figure", "retrievals_figure", "scatter_figure",
           "paired_figure", "support_figure", "retrieval_errors_figure", "has_support_metrics", "has_retrieval_errors",
           "ladder_figure",
           "SUPPORT"]

# Raw EM first and the extracted short answer's EM beside it, never instead of it.
_ACCURACY = (("em", "EM"), ("em_extracted", "EM (extracted)"), ("f1", "F1"), ("cover_em", "Cover EM"))
# Citation and support metrics, named as the result lines name them (see rigkit.eval.metrics).
SUPPORT = (("citation_precision", "Citation precision"),
           ("all_sentences_supported", "All sentences supported (per question)"),
           ("sentence_support_share", "Sentence support share (per sentence)"))


def _go():
    import plotly.graph_objects as go  # imported when a figure is drawn: it takes a while
    from plotly.subplots import make_subplots

    return go, make_subplots


def _error_bars(spreads: list[float | None]) -> dict[str, Any]:
    """Spread across runs as error bars; hidden when there was only one run (no spread)."""
    return {"type": "data", "array": [v or 0.0 for v in spreads],
            "visible": any(v is not None for v in spreads)}


def _systems(groups: list[GroupStats]) -> list[str]:
    return list(dict.fromkeys(g.system for g in groups))


def accuracy_figure(groups: list[GroupStats]) -> Any:
    """Grouped bars: one panel per accuracy metric, x = question type, a colour per system."""
    go, make_subplots = _go()
    types = [ALL_TYPES, *sorted({g.type for g in groups if g.type != ALL_TYPES})]
    fig = make_subplots(rows=1, cols=len(_ACCURACY), subplot_titles=[t for _, t in _ACCURACY],
                        shared_yaxes=True)
    from plotly.colors import qualitative

    palette = qualitative.Plotly  # one colour per system across the panels
    for s_index, system in enumerate(_systems(groups)):
        by_type = {g.type: g for g in groups if g.system == system}
        for col, (key, _) in enumerate(_ACCURACY, start=1):
            xs = [t for t in types if t in by_type]
            fig.add_bar(
                x=xs, y=[by_type[t].mean.get(key) for t in xs], name=system, legendgroup=system,
                showlegend=col == 1, row=1, col=col,
                marker_color=palette[s_index % len(palette)],
                error_y=_error_bars([by_type[t].spread.get(key) for t in xs]),
                customdata=[by_type[t].questions for t in xs],
                hovertemplate="%{x}: %{y:.3f} (%{customdata} questions)",
            )
    fig.update_xaxes(tickangle=-30)  # five type names share a third of the width
    fig.update_layout(barmode="group", height=420, title="Accuracy by system and question type",
                      yaxis_title="score", legend_title="system")
    return fig


def latency_figure(groups: list[GroupStats], stages: list[str]) -> Any:
    """Stacked bars of mean seconds per question by stage; the rest of wall time is 'other'."""
    go, _ = _go()
    fig = go.Figure()
    systems = [g.system for g in groups]
    for stage in stages:
        fig.add_bar(x=systems, y=[g.stages.get(stage, 0.0) for g in groups], name=stage)
    other = [max(0.0, (g.mean.get("latency") or 0.0) - sum(g.stages.values())) for g in groups]
    if any(v > 1e-3 for v in other):
        fig.add_bar(x=systems, y=other, name="other")
    fig.update_layout(barmode="stack", height=420, title="Latency per question by stage (mean)",
                      yaxis_title="seconds", legend_title="stage")
    return fig


def retrievals_figure(rows: list[dict[str, Any]]) -> Any:
    """Histogram of retrievals per answer, one colour per system (integer bins).

    A failed retrieval is not a retrieval, and an answer whose every retrieval failed is not a RIG
    answer: both stay out, as they do of the tables (see `retrieval_errors_figure`)."""
    go, _ = _go()
    fig = go.Figure()
    good = [r for r in rows if not r.get("error") and not row_field(r, "retrieval_failed")]
    for system in dict.fromkeys(r["system"] for r in good):
        values = [int(r.get("retrievals") or 0) for r in good if r["system"] == system]
        fig.add_histogram(x=values, name=system, xbins={"start": -0.5, "size": 1})
    fig.update_layout(barmode="group", height=380, title="Retrievals per question",
                      xaxis_title="retrievals", yaxis_title="answers", xaxis_dtick=1)
    return fig


def scatter_figure(groups: list[GroupStats]) -> Any:
    """F1 against mean retrievals: a large point per system, small ones per question type."""
    go, _ = _go()
    fig = go.Figure()
    overall = [g for g in groups if g.type == ALL_TYPES]
    typed = [g for g in groups if g.type != ALL_TYPES]
    if typed:
        fig.add_scatter(
            x=[g.mean.get("retrievals") for g in typed], y=[g.mean.get("f1") for g in typed],
            mode="markers", name="system x type", marker={"size": 8, "opacity": 0.5},
            text=[f"{g.system} / {g.type}" for g in typed], hovertemplate="%{text}<br>"
            "retrievals %{x:.2f}, F1 %{y:.3f}<extra></extra>")
    fig.add_scatter(
        x=[g.mean.get("retrievals") for g in overall], y=[g.mean.get("f1") for g in overall],
        mode="markers+text", name="system (all questions)", text=[g.system for g in overall],
        textposition="top center", marker={"size": 14},
        error_y=_error_bars([g.spread.get("f1") for g in overall]),
        hovertemplate="%{text}<br>retrievals %{x:.2f}, F1 %{y:.3f}<extra></extra>")
    fig.update_layout(height=420, title="Accuracy (F1) vs retrievals per question",
                      xaxis_title="retrievals per question (mean)", yaxis_title="F1")
    return fig


def paired_figure(comparisons: list[PairedComparison]) -> Any:
    """Each system's per-question difference from the baseline, with its bootstrap interval."""
    go, _ = _go()
    fig = go.Figure()
    for metric in dict.fromkeys(c.metric for c in comparisons):
        rows = [c for c in comparisons if c.metric == metric]
        fig.add_scatter(
            x=[c.difference for c in rows], y=[c.system for c in rows], mode="markers", name=metric,
            error_x={"type": "data", "symmetric": False, "array": [c.high - c.difference for c in rows],
                     "arrayminus": [c.difference - c.low for c in rows]},
            text=[f"{c.wins} wins / {c.losses} losses, p={c.p_value:.3g}" for c in rows],
            hovertemplate="%{y}: %{x:+.3f}<br>%{text}<extra>" + metric + "</extra>")
    fig.add_vline(x=0, line_dash="dot")
    baseline = comparisons[0].baseline if comparisons else ""
    fig.update_layout(height=120 + 40 * len({c.system for c in comparisons}), legend_title="metric",
                      title=f"Difference from {baseline} on the same questions (95% interval)",
                      xaxis_title=f"system - {baseline}")
    return fig


def support_figure(groups: list[GroupStats]) -> Any:
    """Grouped bars per system: citation precision, all sentences supported, sentence support share.

    Only the metrics some system defines are drawn (closed-book answers cite nothing)."""
    go, _ = _go()
    overall = [g for g in groups if g.type == ALL_TYPES]
    fig = go.Figure()
    for key, label in SUPPORT:
        values = [g.mean.get(key) for g in overall]
        if all(v is None for v in values):
            continue
        fig.add_bar(x=[g.system for g in overall], y=values, name=label,
                    error_y=_error_bars([g.spread.get(key) for g in overall]),
                    hovertemplate="%{x}: %{y:.3f}<extra>" + label + "</extra>")
    fig.update_layout(barmode="group", height=400, yaxis_range=[0, 1], yaxis_title="share",
                      title="Citations and support (against the passages in context when written)",
                      legend_title="metric")
    return fig


def retrieval_errors_figure(groups: list[GroupStats]) -> Any:
    """Bars per system: rounds whose retrieval failed, and answers whose every retrieval failed."""
    go, _ = _go()
    overall = [g for g in groups if g.type == ALL_TYPES]
    systems = [g.system for g in overall]
    fig = go.Figure()
    fig.add_bar(x=systems, y=[g.retrieval_error_rounds for g in overall], name="rounds with retrieval errors")
    fig.add_bar(x=systems, y=[g.retrieval_failed for g in overall],
                name="answers with every retrieval failed (left out of the tables)")
    fig.update_layout(barmode="group", height=380, title="Retrieval errors (all runs)",
                      yaxis_title="count", legend_title="")
    return fig


def has_support_metrics(groups: list[GroupStats]) -> bool:
    """Whether any system defines a citation / support metric (a figure would not be empty)."""
    return any(g.mean.get(key) is not None for g in groups for key, _ in SUPPORT)


def has_retrieval_errors(groups: list[GroupStats]) -> bool:
    return any(g.retrieval_error_rounds or g.retrieval_failed for g in groups if g.type == ALL_TYPES)


def ladder_figure(rows: list[Any], baseline: str = "rag") -> Any:
    """The model-size ladder: type-aware score, retrievals per question and the paired difference
    from `baseline` against model size (billions of parameters), one line per system."""
    go, make_subplots = _go()
    fig = make_subplots(rows=1, cols=3, subplot_titles=["Type-aware score", "Retrievals per question",
                                                        f"Type-aware − {baseline} (95% interval)"])
    from plotly.colors import qualitative

    palette = qualitative.Plotly
    for i, system in enumerate(dict.fromkeys(r.system for r in rows)):
        mine = sorted((r for r in rows if r.system == system), key=lambda r: (r.size or 0, r.rung))
        xs, labels = [r.size for r in mine], [r.rung for r in mine]
        style = {"mode": "lines+markers", "name": system, "legendgroup": system,
                 "marker_color": palette[i % len(palette)], "text": labels}
        fig.add_scatter(x=xs, y=[r.score.value if r.score else None for r in mine], row=1, col=1,
                        error_y={"type": "data", "symmetric": False,
                                 "array": [r.score.high - r.score.value if r.score else 0 for r in mine],
                                 "arrayminus": [r.score.value - r.score.low if r.score else 0 for r in mine]},
                        hovertemplate="%{text}: %{y:.3f}<extra>" + system + "</extra>", **style)
        fig.add_scatter(x=xs, y=[r.retrievals for r in mine], row=1, col=2, showlegend=False,
                        hovertemplate="%{text}: %{y:.2f}<extra>" + system + "</extra>", **style)
        paired = [r for r in mine if r.difference is not None]
        if paired:
            fig.add_scatter(x=[r.size for r in paired], y=[r.difference.difference for r in paired], row=1, col=3,
                            showlegend=False, error_y={
                                "type": "data", "symmetric": False,
                                "array": [r.difference.high - r.difference.difference for r in paired],
                                "arrayminus": [r.difference.difference - r.difference.low for r in paired]},
                            hovertemplate="%{text}: %{y:+.3f}<extra>" + system + "</extra>",
                            **{**style, "text": [r.rung for r in paired]})
    fig.add_hline(y=0, line_dash="dot", row=1, col=3)
    fig.update_xaxes(type="log", title_text="parameters (billions)")
    fig.update_layout(height=420, title="Model-size ladder")
    return fig
