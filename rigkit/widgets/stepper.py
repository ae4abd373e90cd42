"""RoundStepper: step through a RIG answer round by round in JupyterLab.

Two sources, one view. Replay: `RoundStepper(result)` shows a saved `RIGResult` (no model).
Live: `RoundStepper.live(controller, question)` pulls one `RoundTrace` at a time from
`controller.stream(question)`, so "next" at the last shown round runs one more round of the model
in the kernel. The widget holds no loop logic: it only advances the controller's iterator and
renders each trace with the panes of `rigkit.widgets.stepper_parts` (pure functions of
`rigkit.widgets.render` / `figures`).

Markers are boxed with the run's own marker protocol (`marker_protocol=`, else the one a live
controller or a replayed run's config names, else `<marker_tag>`).

The decider and threshold pickers re-run the question through a factory
`(decider_name, threshold) -> controller`; `live()` builds one from a `RunConfig` with
`rigkit.build.build_controller` when no factory is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ipywidgets as W

from rigkit.markers import MarkerProtocol, MarkerProtocolError, resolve_protocol
from rigkit.trace import RIGResult, RoundTrace
from rigkit.widgets import summary
from rigkit.widgets.stepper_parts import RoundPanes, StepperControls

__all__ = ["RoundStepper", "ControllerFactory", "decider_names", "config_factory"]

ControllerFactory = Callable[[str, "float | None"], Any]

# Lecture mode: every pane's text at 18 px or more (the panes' inline 11-13 px sizes overridden),
# and one round in two columns (draft and answer | decision, query and hits). The stepper is at
# most the window's height less JupyterLab's bars (~130 px); the columns take what the header,
# the controls and the folded budget leave, and scroll on their own, so at 1280x720 the whole
# stepper shows in the notebook without scrolling whatever the header's length.
LECTURE_STYLE = """<style>
.rigkit-lecture, .rigkit-lecture * {font-size: max(18px, 1em) !important; line-height: 1.35 !important;}
.rigkit-stepper.rigkit-lecture {max-height: calc(100vh - 130px);}
.rigkit-lecture > * {flex-shrink: 0;}
.rigkit-lecture > .rigkit-columns {flex: 0 1 auto; min-height: 0; gap: 16px;}
.rigkit-lecture .rigkit-columns > .widget-vbox {flex: 1 1 0; min-width: 0; min-height: 0; overflow-y: auto;}
.rigkit-lecture .rigkit-decision, .rigkit-lecture .rigkit-query {width: auto !important;}
</style>"""

def decider_names() -> list[str]:
    """Registered decider names (rigkit.deciders.DECIDERS)."""
    from rigkit.deciders import DECIDERS

    return sorted(DECIDERS)


def config_factory(config: Any, generator: Any = None, retriever: Any = None) -> ControllerFactory:
    """A factory that rebuilds the controller from `config` with another decider / threshold.

    The loaded generator and retriever are passed through, so a re-run loads nothing new.
    Decider params are decider-specific, so they are dropped when the decider changes.
    """
    from rigkit.build import build_controller
    from rigkit.config import RunConfig

    def factory(name: str, threshold: float | None) -> Any:
        data = config.to_dict()
        if name != data["decider"]["name"]:
            data["decider"]["params"] = {}
        data["decider"].update(name=name, threshold=threshold)
        return build_controller(RunConfig.from_dict(data), generator=generator, retriever=retriever)

    return factory


class RoundStepper(W.VBox):
    """Previous / next / jump controls over a run's rounds, with one pane per stage."""

    def __init__(
        self,
        result: RIGResult | None = None,
        *,
        factory: ControllerFactory | None = None,
        question: str | None = None,
        marker_tag: str = "retrieve",
        marker_protocol: str | MarkerProtocol | None = None,
        deciders: Sequence[str] | None = None,
        lecture: bool = False,
    ):
        self.lecture = lecture
        self.result = result
        self.question = question if question is not None else (result.question if result else "")
        self.rounds: list[RoundTrace] = list(result.rounds) if result else []
        self.index = 0
        self.factory = factory
        self.marker_tag = marker_tag
        # the tags boxed in the draft: given, else the replayed run's own, else <marker_tag>
        self.marker_protocol = _run_protocol(result, marker_protocol, marker_tag)
        self._controller: Any = None
        self._stream: Iterator[RoundTrace] | None = None
        self._error: str | None = None  # the last failure, shown in the status line
        self.controls = StepperControls(deciders if deciders is not None else decider_names())
        self.panes = RoundPanes()
        # the widgets stay reachable on the stepper: notebooks and tests drive them there
        c, p = self.controls, self.panes
        self.prev_button, self.next_button, self.slider = c.prev_button, c.next_button, c.slider
        self.decider_picker, self.threshold_picker = c.decider_picker, c.threshold_picker
        self.rerun_button, self.status = c.rerun_button, c.status
        self.header, self.draft_pane, self.writing_pane = p.header, p.draft_pane, p.writing_pane
        self.decision_pane, self.query_pane, self.hits_pane = p.decision_pane, p.query_pane, p.hits_pane
        self.budget_pane, self.timings_pane, self.answer_pane = p.budget_pane, p.timings_pane, p.answer_pane
        self.budget_plot = p.budget_plot
        self.prev_button.on_click(lambda _: self.show(self.index - 1))
        self.next_button.on_click(lambda _: self.next())
        self.slider.observe(lambda ch: self.show(ch["new"] - 1), names="value")
        self.rerun_button.on_click(lambda _: self.rerun())
        self.lecture_switch = c.lecture_switch
        self._lecture_style = W.HTML(LECTURE_STYLE)
        self._stages = W.HBox([self.decision_pane, self.query_pane])
        # lecture mode's layout: the same panes in two columns (shown instead of the plain one)
        self._columns = W.HBox([W.VBox([self.draft_pane, self.writing_pane, self.answer_pane]),
                                W.VBox([self.decision_pane, self.query_pane, self.hits_pane])])
        self._columns.add_class("rigkit-columns")
        super().__init__()
        self.add_class("rigkit-stepper")
        self.set_lecture(lecture)
        self.lecture_switch.observe(lambda ch: self.set_lecture(ch["new"]), names="value")
        self._refresh()

    def set_lecture(self, on: bool) -> None:
        """Switch lecture mode (the "lecture" button does the same): 18 px text and up, a round in
        two columns that fits a 1280x720 projector, the token budget folded away."""
        self.lecture = self.lecture_switch.value = bool(on)
        p = self.panes
        if self.lecture:
            self.children = [self._lecture_style, self.header, self.controls, self._columns,
                             p.budget_box(True)]
        else:
            self.children = [self.header, self.controls, self.draft_pane, self.writing_pane, self._stages,
                             self.hits_pane, p.budget_box(False), self.answer_pane]
        (self.add_class if self.lecture else self.remove_class)("rigkit-lecture")

    # ------------------------------------------------------------------------- constructors
    @classmethod
    def live(
        cls,
        controller: Any,
        question: str,
        *,
        factory: ControllerFactory | None = None,
        config: Any = None,
        generator: Any = None,
        retriever: Any = None,
        start: bool = True,
        **kwargs: Any,
    ) -> RoundStepper:
        """Step a running controller; `start` runs the first round now.

        Re-runs use `factory`, or `config` (a `RunConfig`; default: the one the controller was
        built from, `controller.run_config`) with the controller's generator and retriever;
        with neither, the decider and threshold pickers are disabled.
        """
        if config is None and getattr(controller, "run_config", None):
            from rigkit.config import RunConfig

            config = RunConfig.from_dict(controller.run_config)
        if factory is None and config is not None:
            factory = config_factory(
                config,
                generator if generator is not None else getattr(controller, "generator", None),
                retriever if retriever is not None else getattr(controller, "retriever", None),
            )
        context = getattr(controller, "context", None)
        if "marker_protocol" not in kwargs and getattr(context, "protocol", None) is not None:
            kwargs["marker_protocol"] = context.protocol
        stepper = cls(None, factory=factory, question=question, **kwargs)
        stepper._attach(controller, start)
        return stepper

    def _attach(self, controller: Any, start: bool) -> None:
        self._controller = controller
        if hasattr(controller, "callbacks") and self.panes.writer not in controller.callbacks:
            controller.callbacks.append(self.panes.writer)  # the segment being written, token by token
        self._stream = iter(controller.stream(self.question))
        self.result, self.rounds, self.index, self._error = None, [], 0, None
        if start:
            self._advance()
        self._refresh()

    # ------------------------------------------------------------------------------ actions
    @property
    def policy(self) -> str:
        """The run's continue / regenerate policy: the result's, else the live controller's."""
        if self.result is not None and self.result.policy:
            return self.result.policy
        return str(getattr(self._controller, "policy", "") or "")

    @property
    def finished(self) -> bool:
        return self._stream is None

    def show(self, index: int) -> None:
        """Show round `index` (clamped to the rounds there are)."""
        self.index = max(0, min(index, len(self.rounds) - 1)) if self.rounds else 0
        self._refresh()

    def next(self) -> None:
        """Show the next round; at the last one of a live run, run one more round first."""
        if self.index + 1 >= len(self.rounds) and not self.finished:
            self._advance()
        self.show(self.index + 1)

    def run_to_end(self) -> RIGResult | None:
        """Run the live controller to the end (the shown round stays); returns the result."""
        while not self.finished:
            if not self._advance():
                break
        self._refresh()
        return self.result

    def rerun(self, decider: str | None = None, threshold: float | None = None) -> None:
        """Run the question again with another decider / threshold (needs a factory)."""
        if self.factory is None:
            raise ValueError("re-run needs a factory or a config (see RoundStepper.live)")
        name = decider if decider is not None else self.decider_picker.value
        try:
            thr = threshold if threshold is not None else _parse_threshold(
                self.threshold_picker.value)
        except ValueError:
            self._error = f"threshold must be a number or empty, got {self.threshold_picker.value!r}"
            self._refresh()
            return
        self.controls.say(f"building a controller with {name}…")
        try:
            controller = self.factory(name, thr)
        except Exception as exc:  # shown in the widget: a callback's traceback is invisible
            self._error = f"{type(exc).__name__}: {exc}"
            self._refresh()
            return
        self._attach(controller, start=True)

    def _advance(self) -> bool:
        """Pull one round from the live stream; False (and finish) when it is exhausted."""
        assert self._stream is not None
        self.controls.busy(True)
        try:
            trace = next(self._stream)
        except StopIteration:
            self._finish()
            return False
        except Exception as exc:  # keep the widget usable and say what went wrong
            self._stream = None
            self._error = f"{type(exc).__name__}: {exc}"
            return False
        finally:
            self.controls.busy(False)
        self.rounds.append(trace)
        return True

    def _finish(self) -> None:
        self._stream = None
        self.result = getattr(self._controller, "last_result", None)
        if self.result is not None and len(self.result.rounds) >= len(self.rounds):
            self.rounds = list(self.result.rounds)

    # ------------------------------------------------------------------------------- render
    def _refresh(self) -> None:
        n = len(self.rounds)
        self.controls.show(self.index, n, self.finished, can_rerun=self.factory is not None)
        self.header.value = summary.round_header_html(
            self.question, self.index, n, self.finished, self.rounds, self.policy
        )
        self.controls.say(self._status_text(), error=self._error is not None)
        if n:
            self.controls.sync(self.rounds[self.index])
        self.panes.show(self.rounds, self.index, self.result, self.marker_protocol)

    def _status_text(self) -> str:
        if self._error:
            return self._error
        if not self.finished:
            return "live: next runs another round"
        return "live run finished" if self._controller is not None else "replay"



def _run_protocol(
    result: RIGResult | None, protocol: str | MarkerProtocol | None, tag: str
) -> MarkerProtocol:
    if protocol is not None:
        return resolve_protocol(protocol, tag)
    context = (result.config or {}).get("context", {}) if result is not None else {}
    try:
        return resolve_protocol(context.get("marker_protocol"), context.get("marker_tag", tag))
    except MarkerProtocolError:  # a protocol file of another machine: box the default tags
        return resolve_protocol(None, tag)


def _parse_threshold(text: str) -> float | None:
    return float(text) if text.strip() else None
