"""rigkit: a research workbench for Retrieval-Interleaved Generation (RIG).

The public names load lazily, so `import rigkit` stays cheap (no torch until a model is used).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "RIGController": "rigkit.controller",
    "ContextManager": "rigkit.context",
    "build_controller": "rigkit.build",
    "build_run": "rigkit.build",
    "Parts": "rigkit.build",
    "Run": "rigkit.run",
    "build_generator": "rigkit.build",
    "build_retriever": "rigkit.build",
    "answer_closed_book": "rigkit.eval.systems",
    "answer_with_passages": "rigkit.eval.systems",
    "HFGenerator": "rigkit.generation",
    "Generator": "rigkit.generation",
    "RunConfig": "rigkit.config",
    "load_config": "rigkit.config",
    "RIGResult": "rigkit.trace",
    "RoundTrace": "rigkit.trace",
    "Segment": "rigkit.trace",
    "Decision": "rigkit.trace",
    "Query": "rigkit.trace",
    "Hit": "rigkit.trace",
    "build_decider": "rigkit.build",
    "build_query_builder": "rigkit.queries",
    "open_retriever": "rigkit.retrieval",
    "Index": "rigkit.retrieval",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rigkit' has no attribute {name!r}")
