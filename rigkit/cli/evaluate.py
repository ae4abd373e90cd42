"""`rigkit eval` (closed-book vs RAG vs RIG, resumable) and `rigkit report DIR`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["register"]

EVAL_EXAMPLE = """example:
  rigkit eval --qa data/2wikimultihopqa/qa.jsonl --index indexes/2wiki \\
      --systems closed_book,rag,rig:prob --runs 1 --limit 100 \\
      --config configs/cpu.yaml --out runs/2wiki-cpu

systems: closed_book | rag[:K] | rig[:DECIDER[:QUERY_MODE]], each optionally @append or @prefix.
Re-running the same command resumes; `rigkit report DIR` rebuilds the report."""


LADDER_EXAMPLE = """example (the default model, and the same with the shipped marker adapter):
  rigkit ladder --qa data/2wikimultihopqa/qa.jsonl --split test --config configs/cpu.yaml \\
      --set retrieval.corpus=data/2wikimultihopqa/corpus.jsonl --systems rag,rig:prob \\
      --rung smollm2-135m-instruct --rung smollm2-135m-instruct+markers --out runs/ladder-2wiki

a served model is one spec: --rung model=qwen3:0.6b,backend=ollama,size=0.6 (Ollama), or
model=NAME,backend=openai,base_url=http://HOST:PORT/v1 (vLLM); docs/evaluation.md. `rigkit report DIR`
rebuilds the ladder's report."""


def register(subparsers: argparse._SubParsersAction) -> None:
    from rigkit.cli import add_config_options
    from rigkit.cli.flags import add_flags, add_generator_flags, deprecated_alias

    ev = subparsers.add_parser(
        "eval", help="evaluate closed-book, RAG and RIG systems on a QA set (resumable)",
        epilog=EVAL_EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("--qa", required=True, help="qa.jsonl of a data set (data/<set>/qa.jsonl)")
    add_flags(ev, "--index")
    ev.add_argument("--systems", default="closed_book,rag,rig:prob",
                    help="comma-separated systems (default: %(default)s)")
    ev.add_argument("--runs", type=int, default=1, help="repeats with seeds seed+0..N-1")
    ev.add_argument("--limit", type=int, help="only the first N questions (after --split)")
    add_flags(ev, "--layout")  # a system's own @append / @prefix wins
    add_config_options(ev, "; model, deciders...")
    add_generator_flags(ev)
    ev.add_argument("--split", default="all", choices=("all", "train", "dev", "test"),
                    help="stored split of the data set to evaluate (default: %(default)s)")
    ev.add_argument("--out", required=True, help="run folder: results.jsonl, meta.json, report")
    add_flags(ev, "--rerank")
    add_flags(ev, "--calibration")
    ev.add_argument("--no-faithfulness", action="store_true",
                    help="skip the embedding-based faithfulness check")
    ev.add_argument("--no-traces", action="store_true", help="do not keep full traces")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    ev.add_argument("--concurrency", type=int, default=None,
                    help="questions answered at once, each worker with its own generator "
                    "(default: 1 in-process, 8 for a served model)")
    ev.add_argument("--ray", metavar="ADDRESS",
                    help="answer on a Ray cluster (auto, HOST:PORT, ray://HOST:10001, or local): "
                         "--concurrency actors (default: one per CPU), each loading its own generator "
                         "and retriever; this process writes the results")
    ev.add_argument("--shard", help="i/n: only every n-th question from the i-th, to split one "
                    "evaluation across machines (join with `rigkit eval-merge`)")
    ev.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    ev.set_defaults(func=_run_eval)

    ld = subparsers.add_parser(
        "ladder", help="the same systems over several models: one table and one figure against model size",
        epilog=LADDER_EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    ld.add_argument("--qa", required=True, help="qa.jsonl of a data set (data/<set>/qa.jsonl)")
    ld.add_argument("--rung", dest="models", action="append", metavar="SPEC",
                    help="a rung: a model (name, hub id, path, BASE+ADAPTER) or key=value pairs of generator "
                         "settings plus label= and size= (billions); repeat for each model (at least one)")
    ld.add_argument("--systems", default="closed_book,rag,rig:prob",
                    help="comma-separated systems, the same on every rung (default: %(default)s)")
    ld.add_argument("--split", default="all", choices=("all", "train", "dev", "test"),
                    help="stored split of the data set (default: %(default)s)")
    ld.add_argument("--limit", type=int, help="only the first N questions (after --split)")
    add_config_options(ld, "; shared by every rung")
    add_generator_flags(ld, leave_out=("--model",))  # shared by every rung; --rung names the models
    add_flags(ld, "--index")
    deprecated_alias(ld, "--model", "--rung", " here (it named a rung)")
    ld.add_argument("--concurrency", type=int, default=None,
                    help="questions answered at once per rung (default: 1 in-process, 8 served)")
    ld.add_argument("--out", required=True, help="ladder folder: one rung folder each, ladder.md, ladder.html")
    ld.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    ld.set_defaults(func=_run_ladder)

    mg = subparsers.add_parser("eval-merge", help="join the folders of a sharded `rigkit eval`")
    mg.add_argument("shards", nargs="+", help="the shards' --out folders")
    mg.add_argument("--out", required=True, help="merged run folder (results, traces, report)")
    mg.add_argument("--force", action="store_true", help="replace an evaluation already in --out")
    mg.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    mg.set_defaults(func=_run_merge)

    rp = subparsers.add_parser("report", help="write DIR/report.html and DIR/report.md (a ladder folder: "
                                              "DIR/ladder.html and DIR/ladder.md)")
    rp.add_argument("dir", help="a run folder written by `rigkit eval`, or a ladder folder (`rigkit ladder`)")
    rp.add_argument("--baseline", default="rag",
                    help="the system every other is compared with, question by question (default rag)")
    rp.add_argument("--compare", action="append", default=[], metavar="DIR[=LABEL]",
                    help="add the systems of another run over the same questions as `system [LABEL]` "
                         "(label: the folder name), paired against the baseline too (repeatable)")
    rp.add_argument("--split", choices=("train", "dev", "test"),
                    help="only the questions of this stored split (data/<set>/splits.json), in DIR and every "
                         "--compare folder: a run over every question is cut to them (not for a ladder folder)")
    rp.add_argument("--out", help="folder for report.md and report.html, or a ladder folder's ladder.md "
                                  "and ladder.html (default: DIR)")
    rp.add_argument("--json", action="store_true", help="print the paths as JSON on stdout")
    rp.set_defaults(func=_run_report)


def _run_eval(args: argparse.Namespace) -> int:
    from rigkit.cli import check_index, check_model_path, check_out, run_config
    from rigkit.cli.flags import flag_settings
    from rigkit.errors import InputError
    from rigkit.eval.experiment import evaluate
    from rigkit.eval.runner import parse_shard

    check_out(args.out)
    check_model_path(args.model)
    parse_shard(args.shard)
    if args.concurrency is not None and args.concurrency < 1:
        raise InputError("--concurrency must be at least 1")
    for flag, path in (("--qa", args.qa), ("--config", args.config)):
        if path and not Path(path).exists():
            raise InputError(f"{flag} {path}: file not found")
    config = run_config(args, leave_out=("--index",))  # checked here: before the model loads
    check_index(args.index or config.retrieval.index)
    # the flags as settings, so the run folder records them; --index is resolved to a full path
    settings = [*args.settings, *flag_settings(args, leave_out=("--index",))]
    summary = evaluate(
        args.qa, args.out, args.systems, index=args.index, config=args.config,
        settings=settings, runs=args.runs, limit=args.limit, split=args.split,
        faithfulness=not args.no_faithfulness, traces=not args.no_traces,
        progress=not args.no_progress and not args.json, concurrency=args.concurrency,
        shard=args.shard, ray=args.ray,
    )
    out = Path(args.out)
    if args.json:
        print(json.dumps({"results": str(summary.path), "total": summary.total,
                          "skipped": summary.skipped, "written": summary.written,
                          "errors": summary.errors, "report": str(out / "report.html")}))
    else:
        print((out / "report.md").read_text(encoding="utf-8"))
        print(f"rigkit eval: {summary.written} answers written, {summary.skipped} already there, "
              f"{summary.errors} errors; report: {out / 'report.html'}", file=sys.stderr)
    return 0


def _run_ladder(args: argparse.Namespace) -> int:
    from rigkit.cli import check_index, check_out, run_config
    from rigkit.cli.flags import flag_settings
    from rigkit.errors import InputError
    from rigkit.eval.ladder import parse_rungs, run_ladder

    check_out(args.out)
    if not args.models:
        raise InputError("rigkit ladder needs at least one --rung SPEC (a model, or key=value generator settings)")
    parse_rungs(args.models)  # every spec checked before the first model loads
    for flag, path in (("--qa", args.qa), ("--config", args.config)):
        if path and not Path(path).exists():
            raise InputError(f"{flag} {path}: file not found")
    if args.concurrency is not None and args.concurrency < 1:
        raise InputError("--concurrency must be at least 1")
    config = run_config(args, leave_out=("--index",))
    check_index(args.index or config.retrieval.index)
    settings = [*args.settings, *flag_settings(args, leave_out=("--index",))]
    path = run_ladder(args.qa, args.out, args.models, args.systems, settings=settings, index=args.index,
                      config=args.config, split=args.split, limit=args.limit, concurrency=args.concurrency,
                      progress=not args.no_progress)
    print(path.with_name("ladder.md").read_text(encoding="utf-8"))
    print(f"rigkit ladder: {path}", file=sys.stderr)
    return 0


def _run_merge(args: argparse.Namespace) -> int:
    from rigkit.cli import check_out
    from rigkit.eval.merge import merge_runs
    from rigkit.eval.report import write_report

    check_out(args.out)
    summary = merge_runs(args.out, args.shards, force=args.force)
    path = write_report(args.out)
    for where in summary.dropped:
        print(f"rigkit eval-merge: warning: {where} unreadable (torn or corrupt), left out", file=sys.stderr)
    if summary.missing:
        print(f"rigkit eval-merge: warning: {summary.missing} answers missing (a shard did not finish: "
              "resume it with the same `rigkit eval` command, then merge again)", file=sys.stderr)
    if args.json:
        print(json.dumps({"results": str(summary.path), "rows": summary.written, "errors": summary.errors,
                          "dropped": summary.dropped, "missing": summary.missing, "report": str(path)}))
    else:
        print(f"rigkit eval-merge: {summary.written} result lines from {len(args.shards)} shards "
              f"in {summary.path}; report: {path}", file=sys.stderr)
    return 0


def _run_report(args: argparse.Namespace) -> int:
    from rigkit.errors import InputError
    from rigkit.eval.ladder import is_ladder, write_ladder_report
    from rigkit.eval.report import write_report

    if is_ladder(args.dir):  # a ladder folder: the ladder's table and figure
        if args.compare or args.split:
            flag = "--compare" if args.compare else "--split"
            raise InputError(f"{flag}: {args.dir} is a ladder folder; report its rung folders "
                             f"(rigkit report {Path(args.dir) / '<rung>'} {flag} ...)")
        path = write_ladder_report(args.dir, args.baseline, args.out)
        md = path.with_name("ladder.md")
    else:
        path = write_report(args.dir, args.baseline, args.compare, args.out, args.split)
        md = path.with_name("report.md")
    if args.json:
        print(json.dumps({"html": str(path), "markdown": str(md)}))
    else:
        print(md.read_text(encoding="utf-8"))
        print(f"rigkit report: {path}", file=sys.stderr)
    return 0
