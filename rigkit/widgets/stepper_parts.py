"""The RoundStepper's widgets: its controls, and the panes that show one round.

Pure view: no controller here. The stepper wires the controls' clicks to its actions and hands
the panes the rounds to show.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as W

from rigkit.controller import RoundCallback
from rigkit.markers import MarkerProtocol
from rigkit.trace import RIGResult, RoundTrace
from rigkit.widgets import figures, render, summary

__all__ = ["RoundPanes", "StepperControls", "WritingPane"]


class StepperControls(W.VBox):
    """Previous / next / round slider, the decider and threshold pickers, re-run, a status line."""

    def __init__(self, decider_names: Sequence[str]):
        self.prev_button = W.Button(description="◀ previous", tooltip="previous round")
        self.next_button = W.Button(description="next ▶", tooltip="next round (runs it when live)")
        # 1-based, like the "Round i of n" header
        self.slider = W.IntSlider(value=1, min=1, max=1, description="round",
                                  continuous_update=False)
        self.decider_picker = W.Dropdown(options=list(decider_names), description="decider",
                                         layout=W.Layout(width="200px"))
        # free text: thresholds are in each decider's own unit (probability, nats, tokens)
        self.threshold_picker = W.Text(value="", placeholder="decider default",
                                       description="threshold", layout=W.Layout(width="220px"))
        self.rerun_button = W.Button(description="re-run", tooltip="re-run with this decider")
        self.lecture_switch = W.ToggleButton(description="lecture", tooltip="large type for a projector",
                                             layout=W.Layout(width="auto"))
        self.status = W.HTML()
        for widget, cls in ((self.prev_button, "prev"), (self.next_button, "next"),
                            (self.slider, "slider"), (self.decider_picker, "decider"),
                            (self.threshold_picker, "threshold"), (self.rerun_button, "rerun"),
                            (self.lecture_switch, "lecture-switch"), (self.status, "status")):
            widget.add_class(f"rigkit-{cls}")
        # a threshold means nothing in another decider's unit: switching resets it to the default
        self.decider_picker.observe(lambda ch: self.default_threshold(ch["new"]), names="value")
        super().__init__([
            W.HBox([self.prev_button, self.next_button, self.slider, self.lecture_switch]),
            W.HBox([self.decider_picker, self.threshold_picker, self.rerun_button, self.status]),
        ])

    def busy(self, busy: bool) -> None:
        for button in (self.next_button, self.prev_button, self.rerun_button):
            button.disabled = busy
        if busy:
            self.say("running the next round…")

    def say(self, text: str, error: bool = False) -> None:
        color = "#b91c1c" if error else "#555"
        self.status.value = f'<span style="color:{color};">{render.esc(text)}</span>'

    def show(self, index: int, n: int, finished: bool, can_rerun: bool) -> None:
        """Round `index` of `n` shown: the slider follows, buttons enabled where they act."""
        with self.slider.hold_trait_notifications():
            self.slider.max = max(1, n)
            self.slider.value = index + 1
        self.prev_button.disabled = index <= 0
        self.next_button.disabled = finished and index >= n - 1
        self.rerun_button.disabled = not can_rerun
        self.decider_picker.disabled = self.threshold_picker.disabled = not can_rerun

    def default_threshold(self, name: str | None) -> None:
        """The threshold picker shows `name`'s default in its unit ("0.3 probability" reads 0.3)."""
        from rigkit.deciders import DECIDERS, default_threshold

        value, unit = default_threshold(name) if name in DECIDERS else (None, "")
        self.threshold_picker.value = "" if value is None else f"{value:g}"
        self.threshold_picker.description = f"threshold ({unit})" if unit else "threshold"

    def sync(self, trace: RoundTrace) -> None:
        """The pickers show the decider and threshold of the round shown."""
        name = trace.decision.decider
        if name and name in self.decider_picker.options:
            self.decider_picker.value = name
        threshold = trace.decision.threshold
        self.threshold_picker.value = "" if threshold is None else f"{threshold:g}"


class RoundPanes:
    """One HTML pane per stage of a round, the answer, and the token-budget plot."""

    def __init__(self) -> None:
        import plotly.graph_objects as go

        def pane(name: str, width: str | None = None) -> W.HTML:
            widget = W.HTML(layout=W.Layout(width=width) if width else W.Layout())
            widget.add_class(f"rigkit-{name}")
            return widget

        self.header = pane("header")
        self.draft_pane = pane("draft")
        self.decision_pane = pane("decision", "50%")
        self.query_pane = pane("query", "50%")
        self.hits_pane = pane("hits")
        self.budget_pane = pane("budget")
        self.timings_pane = pane("timings")
        self.answer_pane = pane("answer")
        self.writing_pane = pane("writing")
        self.writer = WritingPane(self.writing_pane)
        self.budget_plot = go.FigureWidget(figures.budget_figure(RoundTrace(0, *_empty_round())))
        self.budget_plot.layout.width = 520

        self._budget = W.HBox([self.budget_plot, W.VBox([self.budget_pane, self.timings_pane])])
        self._folded_budget: W.Accordion | None = None

    def budget_box(self, lecture: bool) -> Any:
        """The budget plot and the timings; folded away in lecture mode (a projector has room for
        the draft, the decision and the search)."""
        if not lecture:
            return self._budget
        if self._folded_budget is None:
            self._folded_budget = W.Accordion([self._budget], titles=("token budget and timings",),
                                              selected_index=None)
        return self._folded_budget

    def show(self, rounds: Sequence[RoundTrace], index: int, result: RIGResult | None,
             protocol: MarkerProtocol) -> None:
        """Paint round `index` of `rounds` (nothing but the empty draft when there is none)."""
        self.answer_pane.value = summary.answer_html(result) + render.context_html(result)
        if not rounds:
            self.draft_pane.value = render.draft_html([], 0)
            return
        trace = rounds[index]
        self.draft_pane.value = render.draft_html(rounds, index, protocol)
        self.decision_pane.value = render.decision_html(
            trace.decision, trace.query.intent if trace.query is not None else "")
        self.query_pane.value = render.query_html(trace.query, trace.error)
        self.hits_pane.value = render.hits_html(trace.hits, trace.injection)
        self.budget_pane.value = summary.budget_html(trace)
        self.timings_pane.value = summary.timings_html(trace.timings)
        fresh = figures.budget_figure(trace)
        with self.budget_plot.batch_update():
            for old, new in zip(self.budget_plot.data, fresh.data, strict=True):
                old.x = new.x
            self.budget_plot.layout.shapes = fresh.layout.shapes
            self.budget_plot.layout.annotations = fresh.layout.annotations


class WritingPane(RoundCallback):
    """Controller callback: shows the segment's raw tokens while the model writes them."""

    def __init__(self, pane: W.HTML):
        self.pane, self.text, self.label = pane, "", "writing…"

    def on_round_start(self, index: int, state: Any) -> None:
        self.text = ""
        self.pane.value = ""
        # as in the streamed answer (`TokenStream`): a rewrite is a candidate, not answer text yet
        rewrite = getattr(state, "rewrite_of", None) is not None
        self.label = "writing again with the passages (kept only if it earns its place)…" if rewrite else "writing…"

    def on_token(self, text: str) -> None:
        self.text += text
        self.pane.value = (f'<div style="color:#555;"><i>{self.label}</i> {render.esc(self.text)}'
                           '<span style="opacity:.5;">▍</span></div>')

    def on_round_end(self, trace: RoundTrace) -> None:
        self.text = ""
        self.pane.value = ""


def _empty_round() -> tuple[Any, Any]:
    from rigkit.trace import Decision, Segment

    return Segment(text=""), Decision(False, 0.0, "")
