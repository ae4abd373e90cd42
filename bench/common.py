"""What every bench script shares: arguments, the machine description, JSON results, plots.

Each script takes `--quick` (a minute or two, run by `make bench-quick` and by a test so the
scripts never rot) and writes one JSON file into `bench/results/` (quick runs into
`bench/results/quick/`), atomically, with the machine, the date, the command and the mode.
`bench/report.py` turns the full-mode files into the table of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the scripts run as `python bench/x.py` from a source tree
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a benchmark never downloads anything
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = ROOT / "bench" / "results"
CPU_CONFIG = ROOT / "configs" / "cpu.yaml"
SETS = ("2wikimultihopqa", "musique")


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser with the options every script shares."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a small run (a minute or two) that exercises every code path")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the JSON (and plot) go (default: bench/results, quick: bench/results/quick)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's own; quick: 1). On a machine shared with other "
                        "jobs, 2 threads on 2 cores thrash (measured here: 0.8 vs 4.4 tokens/s)")
    return p


def setup(args: argparse.Namespace) -> None:
    """Apply the shared options (threads) before anything is timed."""
    import torch

    threads = args.threads or (1 if args.quick else None)
    if threads:
        torch.set_num_threads(threads)


def out_dir(args: argparse.Namespace) -> Path:
    folder = args.out_dir or (RESULTS / "quick" if args.quick else RESULTS)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def machine() -> dict[str, Any]:
    """The machine, the software and the moment, as recorded beside every figure."""
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = None
    try:
        memory_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": memory_gb,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def save(args: argparse.Namespace, name: str, payload: dict[str, Any], started: float) -> Path:
    """Write `<out>/<name>.json` atomically, with machine, mode, command and run time."""
    from rigkit.files import atomic_write_text

    record = {
        "benchmark": name,
        "mode": "quick" if args.quick else "full",
        "command": " ".join(["python", *[_rel(a) for a in sys.argv]]),
        "machine": machine(),
        "seconds": round(time.perf_counter() - started, 1),
        **payload,
    }
    path = out_dir(args) / f"{name}.json"
    atomic_write_text(path, json.dumps(record, indent=1, ensure_ascii=False, default=_plain) + "\n")
    print(f"\nwrote {_rel(str(path))} ({record['seconds']:.0f} s)")
    return path


def _rel(text: str) -> str:
    try:
        return str(Path(text).resolve().relative_to(ROOT)) if Path(text).exists() else text
    except ValueError:
        return text


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-able: {type(value).__name__}")


def plot(path: Path, title: str, panels: Sequence[dict[str, Any]]) -> str:
    """Line charts side by side, one per panel (`{"title", "x", "y", "series": {label: (xs, ys)}}`),
    saved as a PNG: plotly + kaleido if installed, else matplotlib, else skipped.
    Returns what happened, for the script's output."""
    try:
        return _plot_plotly(path, title, panels)
    except Exception as err:  # noqa: BLE001 - no kaleido, or kaleido without a browser
        plotly_error = f"{type(err).__name__}: {err}".splitlines()[0][:120]
    try:
        return _plot_matplotlib(path, title, panels)
    except ImportError:
        return f"plot skipped: neither plotly+kaleido ({plotly_error}) nor matplotlib is installed"


def _plot_plotly(path: Path, title: str, panels: Sequence[dict[str, Any]]) -> str:
    import kaleido  # noqa: F401 - plotly's PNG export needs it; fail early without it
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p["title"] for p in panels])
    for col, panel in enumerate(panels, start=1):
        for label, (xs, ys) in panel["series"].items():
            fig.add_scatter(x=list(xs), y=list(ys), name=label, mode="lines+markers",
                            legendgroup=label, showlegend=col == 1, row=1, col=col)
        fig.update_xaxes(title_text=panel["x"], row=1, col=col)
        fig.update_yaxes(title_text=panel["y"], row=1, col=col)
    fig.update_layout(title=title, width=520 * len(panels), height=420)
    fig.write_image(str(path))
    return f"plot: {_rel(str(path))} (plotly)"


def _plot_matplotlib(path: Path, title: str, panels: Sequence[dict[str, Any]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for label, (xs, ys) in panel["series"].items():
            ax.plot(list(xs), list(ys), marker="o", label=label)
        ax.set_title(panel["title"])
        ax.set_xlabel(panel["x"])
        ax.set_ylabel(panel["y"])
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"plot: {_rel(str(path))} (matplotlib)"


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between points; nan for no values."""
    import numpy as np

    return float(np.percentile(list(values), q)) if len(values) else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextmanager
def stopwatch(into: dict[str, float], key: str):
    """Adds the block's wall time (seconds) to `into[key]`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        into[key] = into.get(key, 0.0) + time.perf_counter() - start


class ForwardMeter:
    """Counts the model's forward passes and their wall time, through torch's module hooks.

    Everything a run spends outside these passes (and outside the retriever) is the loop's own
    cost: Python in rigkit and in `generate`, tokenisation, the stop rule, traces.
    """

    def __init__(self, model: Any):
        self.model, self.calls, self.seconds, self.tokens = model, 0, 0.0, 0
        # the same passes split by width: pre-fill (more than one token at once) or decoding
        self.prefill_s = self.decode_s = 0.0
        self.prefill_tokens = self.decode_tokens = 0
        self._start, self._width = 0.0, 0
        self._handles: list[Any] = []

    def __enter__(self) -> ForwardMeter:
        self._handles = [
            self.model.register_forward_pre_hook(self._before, with_kwargs=True),
            self.model.register_forward_hook(self._after),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()

    def _before(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._width = int(ids.shape[-1]) if ids is not None else 0
        self.tokens += self._width
        self._start = time.perf_counter()

    def _after(self, module: Any, args: Any, output: Any) -> None:
        seconds = time.perf_counter() - self._start
        self.seconds += seconds
        self.calls += 1
        if self._width > 1:
            self.prefill_s, self.prefill_tokens = self.prefill_s + seconds, self.prefill_tokens + self._width
        else:
            self.decode_s, self.decode_tokens = self.decode_s + seconds, self.decode_tokens + self._width

    def snapshot(self) -> tuple[int, float, int]:
        return self.calls, self.seconds, self.tokens


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - start


def demo_questions(limit: int) -> list[str]:
    """The demo set's English questions (the demo corpus answers them)."""
    rows = [json.loads(line) for line in (ROOT / "data/demo/questions.jsonl").open(encoding="utf-8")]
    return [r["question"] for r in rows if r["question"].isascii()][:limit]


def test_questions(dataset: str, limit: int | None = None) -> list[Any]:
    """The stored test split of a shipped QA set, as `QAItem`s, first `limit`."""
    from rigkit.eval.experiment import load_questions

    return load_questions(ROOT / "data" / dataset / "qa.jsonl", split="test", limit=limit)


def set_retriever(dataset: str, config: Any = None) -> Any:
    """The hybrid retriever over a shipped set's paragraphs (indexed once, then cached)."""
    from rigkit.build import build_retriever
    from rigkit.config import RetrievalConfig

    retrieval = config.retrieval if config is not None else RetrievalConfig()
    return build_retriever(_replace(retrieval, corpus=str(ROOT / "data" / dataset / "corpus.jsonl")))


def _replace(dc: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(dc, **changes)


def fmt_ratio(value: float) -> str:
    return "n/a" if value != value else f"{value:.2f}x"


@contextmanager
def vllm_url(url: str | None, tmp: Path, *extra_args: str):
    """The OpenAI routes' base URL of `url`, or of a vLLM on the default model started here (the
    tests' venv and flags, `extra_args` added) and stopped after."""
    if url:
        yield url
        return
    from rigkit.build import build_generator
    from rigkit.generation import converted_model_dir
    from tests import vllm_setup

    build_generator()  # the converted folder vLLM reads
    print("starting vLLM", flush=True)
    with vllm_setup.running(converted_model_dir(), tmp / "vllm.log", extra_args=extra_args) as base:
        yield f"{base}/v1"


def eval_test_split(folder: Path, dataset: str, systems: str, limit: int | None, settings: Sequence[str],
                    concurrency: int = 1) -> list[dict[str, Any]]:
    """One `rigkit eval` of `systems` on `dataset`'s stored test split (configs/cpu.yaml, the set's own
    corpus, `settings` on top); its per-answer rows. Any failed answer stops the benchmark."""
    from rigkit.eval.experiment import evaluate
    from rigkit.eval.runner import read_results

    evaluate(ROOT / "data" / dataset / "qa.jsonl", folder, systems, config=CPU_CONFIG, split="test", limit=limit,
             settings=[f"retrieval.corpus={ROOT / 'data' / dataset / 'corpus.jsonl'}", *settings],
             concurrency=concurrency, progress=False, report=False, faithfulness=False)
    rows = read_results(folder)
    errors = [r["error"] for r in rows if r.get("error")]
    if errors:
        raise SystemExit(f"{dataset} ({folder.name}): {len(errors)} answers failed, e.g. {errors[0]}")
    return rows


def identical_answers(base: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]]) -> int:
    """How many of `other`'s answers equal `base`'s answer to the same question and system."""
    answers = {(r["id"], r["system"]): r["answer"] for r in base}
    return sum(answers.get((r["id"], r["system"])) == r["answer"] for r in other)
