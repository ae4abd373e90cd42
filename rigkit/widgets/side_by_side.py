"""RunComparison: runs of one question side by side in a notebook (RAG vs RIG, decider A vs B,
model A vs B), aligned by round, the final answers' word differences marked.

A thin view over `rigkit.widgets.page.comparison_html`; `save()` writes the same view as one
self-contained HTML file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import ipywidgets as W

from rigkit.trace import RIGResult
from rigkit.widgets import page

__all__ = ["RunComparison"]


class RunComparison(W.HTML):
    """A column per run (the first is the baseline of the answer diff), a row per round."""

    def __init__(self, results: Mapping[str, RIGResult], lecture: bool = False):
        if not results:
            raise ValueError("RunComparison needs at least one run")
        self.results = dict(results)
        self.lecture = lecture
        super().__init__(page.comparison_html(self.results, lecture=lecture))
        self.add_class("rigkit-run-comparison")

    def to_html(self) -> str:
        """The comparison as a whole HTML document."""
        return page.comparison_page(self.results, lecture=self.lecture)

    def save(self, path: str | Path) -> Path:
        """Write `to_html()` to `path` atomically."""
        from rigkit.files import atomic_write_text

        return atomic_write_text(path, self.to_html())
