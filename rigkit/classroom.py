"""Replay or live: the notebooks' classroom path.

A notebook's first cell picks a mode: `Classroom(replay=True)` loads the runs saved beside the
notebooks (`notebooks/runs/<name>.json`) and needs no model; `replay=False` runs the model in the
kernel. The environment variable `RIGKIT_REPLAY=1` forces replay whatever the cell says (a lecture
machine, a test run); `RIGKIT_REPLAY=0` forces live.

The saved runs are produced by the same recipes the notebooks run live:
`python -m rigkit.classroom record [NAME ...]` (from the repository root) re-records them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rigkit.trace import RIGResult

__all__ = ["Classroom", "replay_forced", "RECIPES", "record", "main"]

RUNS = "runs"  # beside the notebooks: notebooks/runs/
QUESTIONS = {
    "apache": ("Can I use code under the Apache-2.0 licence in a commercial product, "
               "and what must I include when I ship it?"),
    "notice": "Which licence does the NOTICE file belong to, and what has to be in it?",
}


def replay_forced() -> bool | None:
    """`RIGKIT_REPLAY`: "1" forces replay, "0" forces live, unset (or anything else) leaves the choice."""
    value = os.environ.get("RIGKIT_REPLAY", "").strip()
    return {"1": True, "0": False}.get(value)


class Classroom:
    """Where a notebook's runs come from: saved files (replay) or the model (live)."""

    def __init__(self, replay: bool = True, folder: str | Path = RUNS):
        forced = replay_forced()
        self.replay = forced if forced is not None else bool(replay)
        self.folder = Path(folder)

    def __repr__(self) -> str:
        how = f"replay: saved runs from {self.folder}/, no model" if self.replay else "live: the model runs here"
        return f"Classroom({how})"

    def live(self, build: Callable[[], Any]) -> Any:
        """`build()` in live mode (load a model, a controller); None in replay mode."""
        return None if self.replay else build()

    def runs(self, name: str, run: Callable[[], Mapping[str, RIGResult]]) -> dict[str, RIGResult]:
        """Named results: loaded from `<folder>/<name>.json`, or `run()` live."""
        if not self.replay:
            return dict(run())
        path = self.folder / f"{name}.json"
        if not path.exists():
            raise FileNotFoundError(f"no saved run {path}: record it with `python -m rigkit.classroom "
                                    f"record {name}`, or switch the notebook to live")
        data = json.loads(path.read_text(encoding="utf-8"))
        return {key: RIGResult.from_dict(value) for key, value in data["results"].items()}

    def run(self, name: str, run: Callable[[], RIGResult]) -> RIGResult:
        """One result: the saved run `name`, or `run()` live."""
        return self.runs(name, lambda: {name: run()})[name]


# -- recipes: what each notebook runs live, recorded for replay -----------------------------------
def _cpu(**generator: Any):
    from rigkit.config import load_config

    return load_config(str(Path(__file__).resolve().parents[1] / "configs" / "cpu.yaml"),
                       **({"generator": generator} if generator else {}))


def _quickstart() -> dict[str, RIGResult]:
    from rigkit.build import build_controller

    return {"quickstart": build_controller(_cpu()).run(QUESTIONS["apache"])}


def rag_vs_rig_config():
    """Notebook 02's config: the CPU profile with room for the second (NOTICE) hop."""
    return _cpu(max_answer_tokens=128)


def three_ways(controller: Any, config: Any, question: str) -> dict[str, RIGResult]:
    """Closed-book, plain RAG and RIG answers to one question with one loaded model."""
    from rigkit.eval.systems import answer_closed_book, answer_with_passages

    generator, retriever = controller.generator, controller.retriever
    hits = retriever.search(question, config.retrieval.top_k)
    return {"closed-book": answer_closed_book(generator, question, config),
            "plain RAG": answer_with_passages(generator, question, hits, config),
            "RIG": controller.run(question)}


def _rag_vs_rig() -> dict[str, RIGResult]:
    from rigkit.build import build_controller

    config = rag_vs_rig_config()
    return three_ways(build_controller(config), config, QUESTIONS["apache"])


def _deciders() -> dict[str, RIGResult]:
    from rigkit.build import build_controller

    return {"deciders": build_controller(_cpu()).run(QUESTIONS["notice"])}


RECIPES: dict[str, Callable[[], dict[str, RIGResult]]] = {
    "quickstart": _quickstart,
    "rag_vs_rig": _rag_vs_rig,
    "deciders": _deciders,
}


def record(name: str, folder: str | Path) -> Path:
    """Run recipe `name` with the model and save its results as `<folder>/<name>.json` (atomic)."""
    from rigkit.files import atomic_write_text

    results = RECIPES[name]()
    data = {"recipe": name, "results": {k: r.to_dict() for k, r in results.items()}}
    path = Path(folder) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rigkit.classroom",
                                     description="record the notebooks' saved runs")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run recipes with the model and save them for replay")
    rec.add_argument("names", nargs="*", help=f"recipes (default: all): {', '.join(RECIPES)}")
    rec.add_argument("--out", default="notebooks/runs", help="folder (default: notebooks/runs)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in RECIPES]
    if unknown:
        print(f"unknown recipe {unknown[0]!r}: one of {', '.join(RECIPES)}", file=sys.stderr)
        return 2
    for name in args.names or list(RECIPES):
        path = record(name, args.out)
        print(f"recorded {name} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
