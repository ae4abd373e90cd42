"""`rigkit compare`: one question through several systems, side by side in one HTML page.

    rigkit compare "QUESTION" --systems rag,rig:prob,rig:entropy --html compare.html

Systems are named as for `rigkit eval` (rigkit.eval.systems): each `rig:DECIDER` runs that decider
with its own default threshold, shown in the decider's unit. One model and one retriever are
loaded and shared, so the columns differ only in when and what was retrieved.
"""

from __future__ import annotations

import argparse
import sys

from rigkit.cli import add_config_options
from rigkit.cli.flags import add_flags, add_generator_flags, add_source_flags

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="answer one question with several systems, side by side")
    p.add_argument("question")
    p.add_argument("--systems", default="rag,rig:prob",
                   help="comma-separated: closed_book, rag[:K], rig[:DECIDER[:QUERY_MODE]] (default rag,rig:prob)")
    p.add_argument("--html", metavar="FILE", help="write the comparison as one self-contained HTML page")
    p.add_argument("--lecture", action="store_true", help="large type for a projector")
    add_source_flags(p, "a saved index folder (rigkit index build)")
    add_flags(p, "--calibration", "--query-mode", "--max-rounds", "--layout", "--no-cache")
    add_generator_flags(p)
    add_config_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rigkit.build import build_generator, build_retriever
    from rigkit.cli import check_index, check_model_path, check_out, check_text, run_config
    from rigkit.eval.systems import build_systems, parse_systems

    check_text(args.question)
    check_model_path(args.model)
    specs = parse_systems(args.systems)  # a bad name fails before anything loads
    if args.html:
        check_out(args.html, "file")
    config = run_config(args)
    check_index(config.retrieval.index)
    print(f"loading {config.generator.model} and the index...", file=sys.stderr)
    generator = build_generator(config.generator)
    retriever = (build_retriever(config.retrieval, generator)
                 if any(s.kind != "closed_book" for s in specs) else None)
    results = {}
    for system in build_systems(specs, config, generator, retriever):
        print(f"answering with {system.name}...", file=sys.stderr)
        results[system.name] = system.answer(args.question, config.generator.seed)
    for name, result in results.items():
        first = result.rounds[0].decision if result.rounds else None
        how = ""
        if first is not None and first.decider not in ("", "never"):
            from rigkit.widgets.page import threshold_label

            how = f" [{first.decider} {threshold_label(first)}]"
        print(f"{name}{how}: {result.answer}")
    if args.html:
        from rigkit.files import atomic_write_text
        from rigkit.widgets.page import comparison_page

        atomic_write_text(args.html, comparison_page(results, lecture=args.lecture))
        print(f"wrote {args.html}", file=sys.stderr)
    return 0
