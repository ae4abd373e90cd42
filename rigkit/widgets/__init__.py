"""Notebook widgets for watching RIG work: RoundStepper, DeciderComparison, RunComparison,
RetrievalInspector.

Thin views: they render `RIGResult` / `RoundTrace` / `Hit` data with the pure functions in
`rigkit.widgets.render` (HTML) and `rigkit.widgets.figures` (plotly), and hold no loop logic.
The widget classes import ipywidgets and plotly when first used, so `rigkit.widgets.render`
works in a plain Python process (a static report, a test) without them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RoundStepper", "DeciderComparison", "RunComparison", "RetrievalInspector", "render", "figures",
           "page"]

_LAZY = {
    "RoundStepper": "rigkit.widgets.stepper",
    "DeciderComparison": "rigkit.widgets.compare",
    "RunComparison": "rigkit.widgets.side_by_side",
    "RetrievalInspector": "rigkit.widgets.inspector",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(_LAZY[name])
        except ImportError as exc:
            raise ImportError(
                f"rigkit.widgets.{name} needs ipywidgets, plotly and anywidget: "
                "pip install 'rigkit[notebooks]'"
            ) from exc
        return getattr(module, name)
    if name in ("render", "figures", "page"):
        import importlib

        return importlib.import_module(f"rigkit.widgets.{name}")
    raise AttributeError(f"module 'rigkit.widgets' has no attribute {name!r}")
