"""How a marker model asks: run it on QA questions and measure its markers and their queries.

Per question of each set's split:
- the tuned model answers with `rig:marker` (marker decider, `marker` query mode); counted are
  its well-formed markers (closed, with a phrase) against the question's number of hops;
- query quality: does the top-5 of the hybrid retriever contain a supporting paragraph, for each
  marker query, for the question text alone, and for FLARE's masked queries (the base model with
  the probability decider and `masked` query mode);
- optionally the end effect: Cover EM / F1 of rig:marker (tuned), rig:prob, rag and closed-book
  (each with the base and the tuned model), retrievals per question and seconds per question.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigkit.config import GeneratorConfig, apply_settings, load_config
from rigkit.errors import InputError
from rigkit.files import iter_jsonl, write_jsonl_atomic
from rigkit.markers import find_markers

__all__ = ["MarkerEvalRow", "MarkerEvalReport", "evaluate_markers", "well_formed_markers"]

QUALITY_K = 5


def well_formed_markers(text: str, tag: str = "retrieve") -> int:
    """Markers with an opening tag, a phrase and a closing tag."""
    return sum(m.closed and bool(m.phrase) for m in find_markers(text, tag))


@dataclass
class MarkerEvalRow:
    dataset: str
    id: str
    hops: int
    markers: int = 0  # well-formed markers the tuned model wrote
    marker_queries: list[str] = field(default_factory=list)
    marker_query_hits: list[bool] = field(default_factory=list)  # top-5 holds a supporting paragraph
    question_hit: bool = False
    flare_queries: list[str] = field(default_factory=list)
    flare_query_hits: list[bool] = field(default_factory=list)
    answer: str = ""
    systems: dict[str, dict[str, Any]] = field(default_factory=dict)  # end effect, per system


def _share(values: Sequence[bool]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


@dataclass
class MarkerEvalReport:
    rows: list[MarkerEvalRow]
    model: str
    base_model: str
    split: str

    def summary(self) -> dict[str, dict[str, Any]]:
        groups: dict[str, list[MarkerEvalRow]] = defaultdict(list)
        for row in self.rows:
            groups[row.dataset].append(row)
            groups["all"].append(row)
        out = {}
        for name, rows in groups.items():
            by_hops: dict[int, list[int]] = defaultdict(list)
            for row in rows:
                by_hops[row.hops].append(row.markers)
            systems: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
            for row in rows:
                for system, scores in row.systems.items():
                    for key, value in scores.items():
                        systems[system][key].append(value)
            out[name] = {
                "questions": len(rows),
                "with_marker": _share([r.markers > 0 for r in rows]),
                "markers_per_question": round(sum(r.markers for r in rows) / max(len(rows), 1), 2),
                "markers_by_hops": {h: round(sum(v) / len(v), 2) for h, v in sorted(by_hops.items())},
                "top5_support_marker": _share([h for r in rows for h in r.marker_query_hits]),
                "top5_support_question": _share([r.question_hit for r in rows]),
                "top5_support_flare": _share([h for r in rows for h in r.flare_query_hits]),
                "marker_queries": sum(len(r.marker_queries) for r in rows),
                "flare_queries": sum(len(r.flare_queries) for r in rows),
                "end_effect": {
                    s: {k: round(sum(v) / len(v), 3) for k, v in scores.items()} for s, scores in systems.items()
                },
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "base_model": self.base_model, "split": self.split,
                "summary": self.summary()}

    def table(self) -> str:
        summary = self.summary()
        names = [n for n in summary if n != "all"] + ["all"]

        def fmt(value: Any, share: bool) -> str:
            return "-" if value is None else f"{value:.0%}" if share else str(value)

        lines = [f"marker behaviour of {self.model} on the {self.split} split (top-{QUALITY_K} hybrid hits)",
                 "| measure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        rows = [
            ("questions", "questions"),
            ("answers with >= 1 well-formed marker", "with_marker"),
            ("markers per question", "markers_per_question"),
            ("top-5 holds a supporting paragraph: marker queries", "top5_support_marker"),
            ("  ... question text alone", "top5_support_question"),
            ("  ... FLARE masked queries (base model)", "top5_support_flare"),
            ("marker queries / FLARE queries", None),
        ]
        for label, key in rows:
            if key is None:
                cells = [f"{summary[n]['marker_queries']} / {summary[n]['flare_queries']}" for n in names]
            else:
                cells = [fmt(summary[n][key], key.startswith(('with_', 'top5'))) for n in names]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        hops = sorted({h for n in names for h in summary[n]["markers_by_hops"]})
        for h in hops:
            cells = [str(summary[n]["markers_by_hops"].get(h, "-")) for n in names]
            lines.append(f"| markers per question, {h}-hop | " + " | ".join(cells) + " |")
        systems = sorted({s for n in names for s in summary[n]["end_effect"]})
        if systems:
            lines += ["", "| system | " + " | ".join(f"{n} Cover EM / F1" for n in names)
                      + " | retrievals / q | s / q |", "|---|" + "---|" * (len(names) + 2)]
            for s in systems:
                cells = []
                for n in names:
                    e = summary[n]["end_effect"].get(s)
                    cells.append("-" if not e else f"{e['cover_em']:.2f} / {e['f1']:.2f}")
                e = summary["all"]["end_effect"].get(s, {})
                lines.append(f"| {s} | " + " | ".join(cells)
                             + f" | {e.get('retrievals', 0):.2f} | {e.get('seconds', 0):.1f} |")
        return "\n".join(lines)


def _supported(hits: Sequence[Any], support: set[str]) -> bool:
    return any(h.doc_id in support or h.chunk_id.split("#", 1)[0] in support for h in hits)


def _hops(record: dict[str, Any]) -> int:
    return len(record.get("question_decomposition") or record.get("evidences") or []) or 1


def _queries(result: Any) -> list[str]:
    return [r.query.text for r in result.rounds if r.query is not None and r.query.text.strip()]


def evaluate_markers(
    qa_paths: Sequence[str | Path],
    *,
    split: str = "test",
    model: str = "smollm2-135m-instruct+markers",
    base_model: str = GeneratorConfig.model,
    config_path: str | Path | None = None,
    settings: Sequence[str] = (),
    limit: int | None = None,
    end_effect: bool = False,
    rows_path: str | Path | None = None,
    max_rounds: int = 4,
    progress: bool = True,
) -> MarkerEvalReport:
    """Run the tuned and the base model over each set's `split` and measure how they ask.

    `settings` (`section.key=value`, the command line's `--set`) apply over the config file."""
    from tqdm.auto import tqdm

    from rigkit.build import build_generator, build_retriever
    from rigkit.datasets import load_qa, split_questions
    from rigkit.eval.metrics import QAItem, cover_match, token_f1
    from rigkit.eval.systems import build_system, parse_system

    default_config = Path(__file__).resolve().parents[2] / "configs" / "cpu.yaml"
    if config_path is None and default_config.exists():
        config_path = default_config
    config = apply_settings(load_config(config_path), settings)
    config = config.override(controller={"max_rounds": max_rounds}, retrieval={"mode": "hybrid"})
    # the config's backend, device and dtype, for the tuned and the base model alike
    tuned = build_generator(config.override(generator={"model": str(model)}).generator)
    base = build_generator(config.override(generator={"model": str(base_model)}).generator)
    rows: list[MarkerEvalRow] = []
    for qa in qa_paths:
        qa = Path(qa)
        records = split_questions(load_qa(qa), qa.parent, split)[:limit]
        if not records:
            raise InputError(f"{qa}: no questions in split {split!r}")
        cfg = config.override(retrieval={"corpus": str(qa.parent / "corpus.jsonl"), "index": None})
        retriever = build_retriever(cfg.retrieval)
        marker = build_system(parse_system("rig:marker:marker"), cfg, tuned, retriever)
        flare = build_system(parse_system("rig:prob:masked"), cfg, base, retriever)
        others = []
        if end_effect:
            # rig:prob with the base model is the FLARE run above (the CPU profile's masked query)
            for name, generator in (("rig:prob", tuned), ("rag", base), ("rag", tuned),
                                    ("closed_book", base), ("closed_book", tuned)):
                label = f"{name} ({'tuned' if generator is tuned else 'base'})"
                others.append((label, build_system(parse_system(name), cfg, generator, retriever)))
        dataset = qa.parent.name
        for record in tqdm(records, desc=f"markers eval {dataset}", disable=not progress):
            item = QAItem.from_record(record)
            support = set(item.supporting_pids)
            row = MarkerEvalRow(dataset=dataset, id=item.id, hops=_hops(record))
            start = time.perf_counter()
            result = marker.answer(item.question, cfg.generator.seed)
            seconds = time.perf_counter() - start
            row.answer = result.answer
            row.markers = sum(well_formed_markers(r.segment.text, cfg.context.marker_tag) for r in result.rounds)
            row.marker_queries = [r.query.text for r in result.rounds
                                  if r.query is not None and r.query.mode == "marker"]
            row.marker_query_hits = [_supported(retriever.search(q, QUALITY_K), support) for q in row.marker_queries]
            row.question_hit = _supported(retriever.search(item.question, QUALITY_K), support)
            start = time.perf_counter()
            flare_result = flare.answer(item.question, cfg.generator.seed)
            flare_seconds = time.perf_counter() - start
            # the queries searched: a repeat of an earlier one is skipped by the loop's query guard
            row.flare_queries = [r.query.text for r in flare_result.rounds
                                 if r.query is not None and r.query.mode == "masked"
                                 and not (r.action == "skip" and r.guards)]
            row.flare_query_hits = [_supported(retriever.search(q, QUALITY_K), support) for q in row.flare_queries]
            if end_effect:
                runs = [("rig:marker (tuned)", result, seconds), ("rig:prob (base)", flare_result, flare_seconds)]
                for label, system in others:
                    start = time.perf_counter()
                    answered = system.answer(item.question, cfg.generator.seed)
                    runs.append((label, answered, time.perf_counter() - start))
                for label, answered, took in runs:
                    row.systems[label] = {
                        "cover_em": cover_match(answered.answer, item.golds),
                        "f1": token_f1(answered.answer, item.golds),
                        "retrievals": float(answered.used_retrieval_times),
                        "seconds": took,
                    }
            rows.append(row)
    if rows_path:
        write_jsonl_atomic(rows_path, (dataclasses.asdict(r) for r in rows))
    return MarkerEvalReport(rows, model, base_model, split)


def load_rows(path: str | Path) -> list[MarkerEvalRow]:
    """Rows written with `rows_path` (to re-print a table without re-running)."""
    return [MarkerEvalRow(**row) for _, row in iter_jsonl(path, InputError)]
