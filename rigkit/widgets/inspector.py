"""RetrievalInspector: one query box over a saved index, BM25 / dense / hybrid side by side.

Shows why hybrid retrieval (Reciprocal Rank Fusion of BM25 and dense vectors) helps: the
lexical and semantic rankings disagree, and each hit carries its rank in every retriever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as W

from rigkit.trace import Hit
from rigkit.widgets import render

__all__ = ["RetrievalInspector", "DEFAULT_MODES"]

DEFAULT_MODES = ("bm25", "dense", "hybrid")


class RetrievalInspector(W.VBox):
    """`RetrievalInspector(index)` (anything with `.retriever(mode)`) or a dict name -> Retriever."""

    def __init__(
        self,
        source: Any,
        query: str = "",
        top_k: int = 5,
        modes: Sequence[str] = DEFAULT_MODES,
    ):
        if isinstance(source, Mapping):
            self.retrievers = dict(source)
        else:
            self.retrievers = {mode: source.retriever(mode) for mode in modes}
        self.query_box = W.Text(value=query, placeholder="type a query and press search",
                                description="query", continuous_update=False,
                                layout=W.Layout(width="60%"))
        self.top_k = W.IntSlider(value=top_k, min=1, max=20, description="top k",
                                 continuous_update=False)
        self.search_button = W.Button(description="search")
        self.results = W.HTML()
        for widget, name in ((self.query_box, "query-box"), (self.search_button, "search"),
                             (self.results, "rankings")):
            widget.add_class(f"rigkit-{name}")
        self.search_button.on_click(lambda _: self.search())
        self.query_box.observe(lambda _: self.search(), names="value")
        super().__init__([W.HBox([self.query_box, self.top_k, self.search_button]), self.results])
        self.add_class("rigkit-retrieval-inspector")
        self.rankings: dict[str, list[Hit]] = {}
        if query:
            self.search()

    def search(self, query: str | None = None) -> dict[str, list[Hit]]:
        """Run the query through every retriever and show the rankings side by side."""
        if query is not None and query != self.query_box.value:
            self.query_box.value = query  # the observer runs the search
            return self.rankings
        text = self.query_box.value.strip()
        if not text:
            self.rankings = {}
            self.results.value = ""
            return self.rankings
        self.rankings = {name: r.search(text, self.top_k.value)
                         for name, r in self.retrievers.items()}
        self.results.value = render.rankings_html(self.rankings)
        return self.rankings
