"""DeciderComparison: each decider's score per segment for one question, with threshold lines.

The idea being compared is *when* to retrieve: FLARE's token probability, DRAGIN-style entropy,
cue words, a trained classifier. Scores come either from each decider's own run of the question
(`from_results`) or from judging one shared generation (`rigkit.deciders.compare_deciders`,
`from_comparison`); the second isolates the deciders from the way retrieval changes the text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as W

from rigkit.trace import RIGResult
from rigkit.widgets import figures

__all__ = ["DeciderComparison"]


class DeciderComparison(W.VBox):
    """Score-per-segment lines with threshold lines, and a threshold sweep below."""

    def __init__(
        self,
        scores: Mapping[str, Sequence[float]],
        thresholds: Mapping[str, float | None] | None = None,  # on the score scale
        segments: Sequence[str] | None = None,
        title: str = "",
        sweep: bool = True,
    ):
        import plotly.graph_objects as go

        self.scores = {k: list(v) for k, v in scores.items()}
        self.thresholds = dict(thresholds or {})
        self.segments = list(segments or [])
        self.score_plot = go.FigureWidget(
            figures.decider_figure(self.scores, self.thresholds, self.segments)
        )
        children: list[Any] = []
        if title:
            children.append(W.HTML(f"<b>{title}</b>"))
        children.append(self.score_plot)
        self.sweep_plot = None
        if sweep:
            self.sweep_plot = go.FigureWidget(figures.threshold_sweep_figure(self.scores))
            children.append(self.sweep_plot)
        super().__init__(children)
        self.add_class("rigkit-decider-comparison")

    @classmethod
    def from_results(cls, results: Mapping[str, RIGResult], **kwargs: Any) -> DeciderComparison:
        """One run per decider: its scores per round, cut-offs read from the decisions."""
        thresholds = figures.cuts_from_results(results)
        first = next(iter(results.values()), None)
        segments = [r.segment.text for r in first.rounds] if first else []
        kwargs.setdefault("title", first.question if first else "")
        return cls(figures.scores_from_results(results), thresholds, segments, **kwargs)

    @classmethod
    def from_comparison(cls, rows: Sequence[Mapping[str, Any]], **kwargs: Any) -> DeciderComparison:
        """From `rigkit.deciders.compare_deciders(...)` rows: every decider on the same segments."""
        scores, thresholds, segments = figures.scores_from_rows(rows)
        return cls(scores, thresholds, segments, **kwargs)
