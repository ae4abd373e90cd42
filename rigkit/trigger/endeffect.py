"""Does a better trigger give better answers? RIG with the classifier vs the probability decider.

Both systems answer the same held-out questions with the same generator, retriever and config;
only the decider differs. Reported per system: EM, token F1, cover match (the gold answer appears
in the sentence answer), retrievals per question and seconds per question.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rigkit.config import RunConfig

__all__ = ["EndEffect", "end_effect"]


@dataclass
class EndEffect:
    """Mean scores per system, and the per-question rows behind them."""

    systems: dict[str, dict[str, float]]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def table(self) -> str:
        lines = ["| decider | EM | F1 | cover | retrievals / q | s / q |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for name, m in self.systems.items():
            lines.append(f"| {name} | {m['em']:.3f} | {m['f1']:.3f} | {m['cover']:.3f} | "
                         f"{m['retrievals']:.2f} | {m['seconds']:.1f} |")
        n = len({r["qid"] for r in self.rows})
        return "\n".join(lines) + f"\n({n} questions)"

    def to_dict(self) -> dict[str, Any]:
        return {"systems": self.systems, "questions": len({r["qid"] for r in self.rows})}


def end_effect(
    records: Sequence[dict[str, Any]],
    model_path: str,
    generator: Any,
    retriever: Any,
    config: RunConfig | None = None,
    baseline: str = "prob",
    progress: bool = True,
) -> EndEffect:
    """Run RIG on `records` once with the classifier decider and once with `baseline`."""
    from tqdm.auto import tqdm

    from rigkit.build import build_controller
    from rigkit.eval.answers import cover_match, exact_match, token_f1

    config = config or RunConfig()
    # A config's threshold for one decider must not leak into the other (the classifier then uses
    # the threshold stored in its file); the config's own settings for the baseline (e.g.
    # configs/cpu.yaml's prob threshold) are kept.
    systems = {
        "classifier": config.with_decider("classifier").override(decider={"trigger_model": model_path}),
        baseline: config.with_decider(baseline),
    }
    rows: list[dict[str, Any]] = []
    for name, cfg in systems.items():
        controller = build_controller(cfg, generator=generator, retriever=retriever)
        for rec in tqdm(records, desc=f"RIG with {name}", unit="q", disable=not progress):
            started = time.perf_counter()
            result = controller.run(rec["question"])
            golds = [rec["answer"], *rec.get("answer_aliases", [])]
            rows.append({
                "system": name, "qid": rec["id"], "answer": result.answer,
                "em": exact_match(result.answer, golds), "f1": token_f1(result.answer, golds),
                "cover": cover_match(result.answer, golds),
                "retrievals": result.used_retrieval_times,
                "seconds": time.perf_counter() - started,
            })
    summary = {}
    for name in systems:
        mine = [r for r in rows if r["system"] == name]
        summary[name] = {k: sum(r[k] for r in mine) / max(len(mine), 1)
                         for k in ("em", "f1", "cover", "retrievals", "seconds")}
    return EndEffect(summary, rows)
