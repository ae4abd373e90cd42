"""`rigkit markers build-data | train | eval`: teach a model to write retrieval markers."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    from rigkit.cli import add_config_options
    from rigkit.cli.flags import add_generator_flags, deprecated_alias
    from rigkit.config import GeneratorConfig

    parser = subparsers.add_parser(
        "markers", help="fine-tune a model to write <retrieve> markers (LoRA, CPU)",
        description="Build marker transcripts from multi-hop QA sets, train a LoRA adapter that "
        "makes the model ask for retrieval itself, and measure how it asks.",
    )
    sub = parser.add_subparsers(dest="markers_command", required=True)

    p = sub.add_parser("build-data", help="supervised marker transcripts from a QA set")
    p.add_argument("--qa", required=True, action="append",
                   help="QA JSONL with splits.json beside it (repeat for several sets)")
    p.add_argument("--split", default="train", choices=["train", "dev"],
                   help="questions of this split only (test is never used)")
    p.add_argument("--out", required=True, help="JSONL file to write")
    add_config_options(p, " (context settings, model)")
    add_generator_flags(p)  # the model whose chat template and tokenizer the transcripts use
    p.add_argument("--max-tokens", type=int, default=512, help="skip longer transcripts")
    p.add_argument("--closed-share", type=float, default=0.15,
                   help="share of questions that also get an all-facts-given negative")
    p.add_argument("--stated-share", type=float, default=0.2,
                   help="share that also get a first-hop-given negative")
    p.add_argument("--no-single-hop", dest="single_hop", action="store_false",
                   help="do not add each hop of a multi-hop question as a question of its own")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_build_data)

    p = sub.add_parser("train", help="train a LoRA adapter on marker transcripts")
    p.add_argument("--data", required=True, help="JSONL written by build-data")
    p.add_argument("--out", required=True, help="adapter folder (checkpoints go inside)")
    p.add_argument("--eval-data", help="dev transcripts for early stopping")
    add_config_options(p, " (the base model and where it runs)")
    add_generator_flags(p)  # --model: the base model the adapter is trained on
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=int, default=16)
    p.add_argument("--top-layers", type=int, default=None,
                   help="adapt only the top N transformer blocks (cheaper backward pass)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--grad-accum", type=int, default=4, help="examples per optimizer step")
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps at most")
    p.add_argument("--max-len", type=int, default=512, help="tokens per example at most")
    p.add_argument("--time-budget", type=float, default=None, metavar="MINUTES",
                   help="stop (and keep a resumable checkpoint) after this many minutes")
    p.add_argument("--eval-every", type=int, default=10, help="dev loss every N steps")
    p.add_argument("--eval-examples", type=int, default=40, help="dev examples per evaluation")
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--patience", type=int, default=3,
                   help="stop after N dev evaluations without improvement (0: never stop early)")
    p.add_argument("--keep", choices=["best", "last"], default="best",
                   help="adapter to keep: lowest dev loss, or the last step")
    p.add_argument("--fresh", action="store_true", help="ignore a checkpoint in --out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the training report as JSON")
    p.set_defaults(func=_train)

    p = sub.add_parser("eval", help="how a marker model asks: markers, hops, query quality")
    p.add_argument("--qa", action="append", help="QA JSONL (repeat for several sets)")
    p.add_argument("--rows", nargs="+", metavar="FILE",
                   help="print the table from rows written by earlier --out runs instead (e.g. one per set)")
    p.add_argument("--split", default="test", choices=["train", "dev", "test"])
    p.add_argument("--tuned-model", dest="model", default="smollm2-135m-instruct+markers",
                   help="the tuned model: short name, hub id or local path (default: %(default)s)")
    p.add_argument("--base-model", default=GeneratorConfig.model,
                   help="the model FLARE's queries and the baselines use (default: %(default)s)")
    add_config_options(p, " (default: configs/cpu.yaml)")
    add_generator_flags(p, leave_out=("--model",))  # where both models run
    deprecated_alias(p, "--model", "--tuned-model", " here (it named the tuned model)")
    p.add_argument("--limit", type=int, default=None, help="first N questions per set")
    p.add_argument("--end-effect", action="store_true",
                   help="also score answers (Cover EM / F1) of rig:marker, rig:prob, rag, closed-book")
    p.add_argument("--out", help="write the per-question rows here (JSONL)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_eval)


def _log(text: str) -> None:
    print(text, file=sys.stderr)


def _build_data(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from rigkit.build import build_generator
    from rigkit.cli import run_config
    from rigkit.finetune.data import build_marker_data, write_examples

    config = run_config(args)
    generator = build_generator(config.generator)  # device, dtype, backend from the config
    context = replace(config.context, max_passage_tokens=min(config.context.max_passage_tokens, 80))
    examples, stats = [], Counter()
    for qa in args.qa:
        found, counts = build_marker_data(
            qa, args.split, generator, context_config=context, closed_share=args.closed_share,
            stated_share=args.stated_share, single_hop=args.single_hop, seed=args.seed,
            max_tokens=args.max_tokens,
        )
        examples += found
        stats.update(counts)
    digest = write_examples(args.out, examples)
    kinds = Counter(e.kind for e in examples)
    _log(f"wrote {len(examples)} transcripts to {args.out} (data hash {digest}): "
         f"{dict(kinds)}; {stats['questions']} questions, {stats['too_long']} over {args.max_tokens} tokens")
    return 0


def _train(args: argparse.Namespace) -> int:
    from rigkit.build import build_generator
    from rigkit.cli import run_config
    from rigkit.finetune.train import LoraTrainConfig, train_markers

    config = LoraTrainConfig(
        rank=args.rank, alpha=args.alpha, top_layers=args.top_layers, learning_rate=args.lr, epochs=args.epochs,
        grad_accum=args.grad_accum, max_steps=args.max_steps, max_len=args.max_len,
        time_budget_min=args.time_budget, eval_every=args.eval_every, eval_examples=args.eval_examples, save_every=args.save_every,
        patience=args.patience, keep=args.keep, seed=args.seed,
    )
    base = run_config(args).generator
    generator = build_generator(base)
    command = "rigkit " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""
    report = train_markers(args.data, args.out, generator, config, eval_path=args.eval_data,
                           base_model=base.model, resume=not args.fresh, command=command)
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(report)))
    else:
        last = report.train_loss[-1][1] if report.train_loss else float("nan")
        _log(f"{report.steps} steps ({report.stopped_because}) in {report.minutes} min, "
             f"last loss {last}, best step {report.best_step}; adapter {report.adapter_mb} MB in {args.out}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rigkit.cli.flags import flag_settings
    from rigkit.finetune.evaluate import MarkerEvalReport, evaluate_markers, load_rows

    if args.rows:
        rows = [row for path in args.rows for row in load_rows(path)]
        report = MarkerEvalReport(rows, args.model, args.base_model, args.split)
        print(json.dumps(report.to_dict()) if args.json else report.table())
        return 0
    if not args.qa:
        from rigkit.errors import InputError

        raise InputError("markers eval needs --qa (or --rows from earlier runs)")
    report = evaluate_markers(
        args.qa, split=args.split, model=args.model, base_model=args.base_model,
        config_path=args.config, settings=[*args.settings, *flag_settings(args)], limit=args.limit, end_effect=args.end_effect, rows_path=args.out,
    )
    print(json.dumps(report.to_dict()) if args.json else report.table())
    return 0
