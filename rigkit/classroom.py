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
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rigkit.trace import RIGResult

__all__ = ["Classroom", "replay_forced", "RECIPES", "FOLDERS", "KETTLE_NOTES", "record", "main"]

RUNS = "runs"  # beside the notebooks: notebooks/runs/
ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = {
    "apache": ("Can I use code under the Apache-2.0 licence in a commercial product, "
               "and what must I include when I ship it?"),
    "notice": "Which licence does the NOTICE file belong to, and what has to be in it?",
    "kettle": "In which city does the maintainer of Kettle live?",
}
# Notebook 05's own documents: a two-hop question (Kettle -> Ada Moss -> Lisbon) over three notes.
KETTLE_NOTES = {
    "kettle.md": "# The Kettle project\n\nKettle is a build tool written in 2019 by the Orbit team. "
                 "Its current maintainer is Ada Moss.\n",
    "ada.md": "# Ada Moss\n\nAda Moss is a software engineer based in Lisbon. "
              "She joined the Orbit team in 2021.\n",
    "orbit.md": "# Orbit\n\nOrbit is an open-source collective that publishes "
                "developer tools under the Apache-2.0 licence.\n",
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
        self.saved = Path(folder)

    def __repr__(self) -> str:
        how = f"replay: saved runs from {self.saved}/, no model" if self.replay else "live: the model runs here"
        return f"Classroom({how})"

    def live(self, build: Callable[[], Any]) -> Any:
        """`build()` in live mode (load a model, a controller); None in replay mode."""
        return None if self.replay else build()

    def runs(self, name: str, run: Callable[[], Mapping[str, RIGResult]]) -> dict[str, RIGResult]:
        """Named results: loaded from `<folder>/<name>.json`, or `run()` live."""
        if not self.replay:
            return dict(run())
        path = self.saved / f"{name}.json"
        if not path.exists():
            raise FileNotFoundError(f"no saved run {path}: record it with `python -m rigkit.classroom "
                                    f"record {name}`, or switch the notebook to live")
        data = json.loads(path.read_text(encoding="utf-8"))
        return {key: RIGResult.from_dict(value) for key, value in data["results"].items()}

    def run(self, name: str, run: Callable[[], RIGResult]) -> RIGResult:
        """One result: the saved run `name`, or `run()` live."""
        return self.runs(name, lambda: {name: run()})[name]

    def result(self, name: str, key: str, run: Callable[[], RIGResult]) -> RIGResult:
        """Result `key` of the saved run `name`, or `run()` live."""
        return run() if not self.replay else self.runs(name, dict)[key]

    def folder(self, name: str, into: str | Path, make: Callable[[Path], Any]) -> Path:
        """A folder of results at `into`: a copy of the saved `<folder>/<name>/` (replay), or
        written there by `make(into)` live. A copy, so the notebook never writes a tracked file."""
        into = Path(into)
        if not self.replay:
            make(into)
            return into
        saved = self.saved / name
        if not saved.is_dir():
            raise FileNotFoundError(f"no saved run {saved}/: record it with `python -m rigkit.classroom "
                                    f"record {name}`, or switch the notebook to live")
        shutil.copytree(saved, into, dirs_exist_ok=True)
        return into


# -- recipes: what each notebook runs live, recorded for replay -----------------------------------
def _cpu(**generator: Any):
    from rigkit.config import load_config

    return load_config(str(ROOT / "configs" / "cpu.yaml"),
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


def write_notes(folder: str | Path) -> Path:
    """Notebook 05's three notes as Markdown files in `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in KETTLE_NOTES.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def answer_by_hand(controller: Any, question: str, text: str) -> RIGResult:
    """Step a run to its first search and answer that search with `text` instead of the index."""
    from rigkit.trace import SearchRequest

    run = controller.start(question)
    while not isinstance(step := run.step(), SearchRequest):
        if step is None:
            return run.result
    run.resume(step.id, [text])
    while run.step() is not None:
        pass
    return run.result


CMRC = ROOT / "data" / "cmrc2018-zh"


def cmrc_sample(folder: str | Path, paragraphs: int = 12):
    """An index over the first `paragraphs` of the shipped CMRC 2018 corpus; `auto` picks its
    embedder by the corpus' language."""
    from rigkit.retrieval import Index

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = (CMRC / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:paragraphs]
    (folder / "cmrc.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Index.build(folder / "cmrc.jsonl", folder / "index")


def pausing_config(config: Any):
    """Notebook 05's paused loop: the `always` decider asks at the first sentence, one round."""
    return config.override(decider={"name": "always"}, controller={"max_rounds": 1},
                           generator={"max_answer_tokens": 48})


BY_HAND = "Kettle's current maintainer is Ada Moss; the Orbit team wrote it in 2019."


def _bring_your_own() -> dict[str, RIGResult]:
    from rigkit.build import build_run
    from rigkit.config import load_config
    from rigkit.datasets import load_qa

    with tempfile.TemporaryDirectory() as tmp:
        docs = write_notes(Path(tmp) / "docs")
        config = load_config(str(ROOT / "configs" / "cpu.yaml"), retrieval={"corpus": str(docs)})
        parts = build_run(config)
        asking = build_run(pausing_config(config), parts.generator, parts.retriever).controller
        zh_index, zh_row = cmrc_sample(Path(tmp) / "zh"), load_qa(CMRC / "qa.jsonl")[0]
        zh = build_run(config.override(retrieval={"index": str(zh_index.path)}, decider={"name": "always"}),
                       parts.generator).controller
        return {"kettle": parts.controller.run(QUESTIONS["kettle"]),
                "by hand": answer_by_hand(asking, "Who maintains Kettle?", BY_HAND),
                "zh": zh.run(zh_row["question"])}


def paragraphs_index(record: Mapping[str, Any], folder: str | Path) -> Any:
    """A hybrid retriever over one QA record's own paragraphs (gold and distractors): small, fast."""
    from rigkit.retrieval import Index

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(
        json.dumps({"id": p["pid"], "title": p["title"], "text": p["text"]}) + "\n"
        for p in record["paragraphs"]), encoding="utf-8")
    return Index.build(folder / "corpus.jsonl", folder / "index").retriever("hybrid")


def marker_question() -> dict[str, Any]:
    """Notebook 08's held-out question: the second of MuSiQue's test split (never trained on)."""
    from rigkit.datasets import load_qa, split_questions

    musique = ROOT / "data" / "musique"
    return split_questions(load_qa(musique / "qa.jsonl"), musique, "test")[1]


def marker_config():
    """Notebook 08's run: the shipped marker adapter asks, the marker decider and query mode listen."""
    from rigkit.config import load_config

    return load_config(str(ROOT / "configs" / "cpu.yaml")).override(
        generator={"model": "smollm2-135m-instruct+markers", "max_answer_tokens": 64},
        decider={"name": "marker"}, query={"mode": "marker"}, controller={"max_rounds": 2})


def _markers() -> dict[str, RIGResult]:
    from rigkit.build import build_controller

    record = marker_question()
    with tempfile.TemporaryDirectory() as tmp:
        controller = build_controller(marker_config(), retriever=paragraphs_index(record, tmp))
        return {"markers": controller.run(record["question"])}


TRIGGER_LABELS = ROOT / "data" / "trigger" / "2wiki-labels.jsonl"
TRIGGER_FEATURES = ("probability", "embedding", "hidden")


def trigger_config(trigger_model: str | Path):
    """Notebook 06's run: the CPU profile (48 tokens, one round) with the classifier as decider.
    A fresh decider section (`with_decider`): cpu.yaml's threshold (0.3) is the prob decider's and
    must not carry over; with none given the classifier uses the one chosen on dev, stored in its file."""
    from rigkit.config import load_config

    config = load_config(str(ROOT / "configs" / "cpu.yaml")).override(generator={"max_answer_tokens": 48})
    return config.with_decider("classifier").override(decider={"trigger_model": str(trigger_model)},
                                                      controller={"max_rounds": 1})


def trigger_question(labels: Any, model: Any) -> dict[str, Any]:
    """The held-out question whose labelled segment the classifier flags most strongly (greedy
    decoding repeats that segment), as its QA record."""
    from rigkit.trigger import FeatureExtractor

    test = set(model.meta["split_qids"]["test"])
    rows = [r for r in labels.rows if r.qid in test]
    qid = rows[int(model.score_rows(rows, FeatureExtractor(model.spec)).argmax())].qid
    lines = (ROOT / "data" / "2wikimultihopqa" / "qa.jsonl").read_text(encoding="utf-8").splitlines()
    return next(r for r in map(json.loads, lines) if r["id"] == qid)


def _trigger() -> dict[str, RIGResult]:
    from rigkit.build import build_controller
    from rigkit.trigger import load_labels, save_trigger, train_trigger

    labels = load_labels(TRIGGER_LABELS)
    model = train_trigger(labels, features=TRIGGER_FEATURES, rule="r1")
    record = trigger_question(labels, model)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_trigger(model, Path(tmp) / "trigger.skops")
        controller = build_controller(trigger_config(path), retriever=paragraphs_index(record, tmp))
        return {"classifier": controller.run(record["question"])}


RECIPES: dict[str, Callable[[], dict[str, RIGResult]]] = {
    "quickstart": _quickstart,
    "rag_vs_rig": _rag_vs_rig,
    "deciders": _deciders,
    "bring_your_own": _bring_your_own,
    "markers": _markers,
    "trigger": _trigger,
}


# -- folder recipes: a notebook's results folder (an evaluation), recorded for replay -------------
EVAL_SYSTEMS = "closed_book,rig:prob"


def evaluation_sample(work: str | Path, questions: int = 2) -> list[dict[str, Any]]:
    """Notebook 07's data: the first `questions` of the shipped 2WikiMultihopQA sample as
    `work/qa.jsonl`, and their own paragraphs (gold and distractors) as `work/corpus.jsonl`."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    lines = (ROOT / "data" / "2wikimultihopqa" / "qa.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines[:questions]]
    (work / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    paragraphs = {p["pid"]: p for r in rows for p in r["paragraphs"]}
    (work / "corpus.jsonl").write_text("".join(
        json.dumps({"id": pid, "title": p["title"], "text": p["text"]}) + "\n"
        for pid, p in paragraphs.items()), encoding="utf-8")
    return rows


def _evaluation(out: Path) -> None:
    from rigkit.eval import evaluate
    from rigkit.retrieval import Index

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        evaluation_sample(work)
        Index.build(work / "corpus.jsonl", work / "index")
        evaluate(work / "qa.jsonl", out, EVAL_SYSTEMS, index=work / "index",
                 config=ROOT / "configs" / "cpu.yaml", progress=False)


# What a saved folder keeps: the answers, their traces and the run's meta (the report is rebuilt).
FOLDERS: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "evaluation": (_evaluation, ("meta.json", "results.jsonl", "traces.jsonl")),
}


def record(name: str, folder: str | Path) -> Path:
    """Run recipe `name` with the model and save it in `folder`: results as `<name>.json`, a
    results folder as `<name>/` (each atomic)."""
    from rigkit.files import atomic_write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if name in FOLDERS:
        make, keep = FOLDERS[name]
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            make(Path(tmp) / "run")
            staged = Path(tmp) / "saved"
            staged.mkdir()
            for file in keep:
                shutil.copy2(Path(tmp) / "run" / file, staged / file)
            target = folder / name
            if target.exists():
                shutil.rmtree(target)
            staged.rename(target)
        return target
    results = RECIPES[name]()
    data = {"recipe": name, "results": {k: r.to_dict() for k, r in results.items()}}
    return atomic_write_text(folder / f"{name}.json", json.dumps(data, ensure_ascii=False, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rigkit.classroom",
                                     description="record the notebooks' saved runs")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run recipes with the model and save them for replay")
    rec.add_argument("names", nargs="*", help=f"recipes (default: all): {', '.join([*RECIPES, *FOLDERS])}")
    rec.add_argument("--out", default="notebooks/runs", help="folder (default: notebooks/runs)")
    args = parser.parse_args(argv)
    names = [*RECIPES, *FOLDERS]
    unknown = [n for n in args.names if n not in names]
    if unknown:
        print(f"unknown recipe {unknown[0]!r}: one of {', '.join(names)}", file=sys.stderr)
        return 2
    for name in args.names or names:
        path = record(name, args.out)
        print(f"recorded {name} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
