"""`rigkit trigger build-labels | train | eval | cross | calibrate`: the retrieval trigger from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    from rigkit.cli import add_config_options
    from rigkit.cli.flags import add_flags, add_generator_flags, deprecated_alias

    parser = subparsers.add_parser(
        "trigger", help="train and evaluate a retrieval-trigger classifier",
        description="Label segments, train a classifier that says when to retrieve, compare it "
        "with the probability / entropy / keyword deciders.",
    )
    sub = parser.add_subparsers(dest="trigger_command", required=True)

    p = sub.add_parser("build-labels", help="label closed-book segments of a QA set")
    p.add_argument("--qa", required=True, help="QA JSONL with gold answers and paragraphs")
    p.add_argument("--limit", type=int, default=None, help="first N questions only")
    p.add_argument("--split", default=None,
                   help="comma list of splits.json splits to label, e.g. train,dev (default: all)")
    p.add_argument("--out", required=True, help="labelled set to write (JSONL with a header)")
    p.add_argument("--rule", default="any", help="r1 | r2 | any | all (all are stored)")
    p.add_argument("--min-gain", type=float, default=0.5, help="r1: token-F1 gain that counts")
    add_config_options(p, " (generator, answer length)")
    add_flags(p, "--max-answer-tokens")  # a short cap labels the first sentences only
    add_generator_flags(p)
    p.add_argument("--no-hidden", action="store_true", help="do not store hidden states")
    p.add_argument("--fresh", action="store_true",
                   help="start over instead of resuming an unfinished --out (saved per question)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(func=_build_labels)

    p = sub.add_parser("train", help="train a trigger classifier on a labelled set")
    p.add_argument("--labels", required=True, help="rigkit labelled set, or your CSV/JSONL text,label")
    p.add_argument("--out", required=True, help="model file to write (.skops)")
    p.add_argument("--features", default="probability,embedding",
                   help="comma list of probability, embedding, hidden")
    p.add_argument("--classifier", default="logreg", choices=["logreg", "mlp"],
                   help="logistic regression or a small MLP (default: %(default)s)")
    deprecated_alias(p, "--model", "--classifier")
    p.add_argument("--rule", default=None, help="train on another stored rule's labels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set-dir", help="data set folder with splits.json (default: the labels' own)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_train)

    p = sub.add_parser("eval", help="compare the classifier with the other deciders' scores")
    p.add_argument("--labels", required=True)
    add_flags(p, "--trigger-model")  # needed: checked in _eval, so the old spelling still counts
    deprecated_alias(p, "--model", "--trigger-model",
                     " for trigger eval (it will name the generator, as on other commands)")
    p.add_argument("--split", default=None, choices=["all", "train", "dev", "test"],
                   help="segments to score (default: all when none of the labelled questions "
                   "trained the model, e.g. labels of another data set; else test)")
    p.add_argument("--deciders", default="prob,entropy,keyword", help="baselines to score")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="question resamples for the AUCs' 95%% intervals (0: none)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--html", help="write the ROC / PR figure here (self-contained HTML)")
    p.add_argument("--end-effect", type=int, default=0, metavar="N",
                   help="also run RIG on N test questions with classifier vs prob decider")
    p.add_argument("--qa", help="QA file for --end-effect (default: the one the labels came from)")
    add_config_options(p, " for --end-effect")
    # --model is the trigger model's deprecated spelling here for one release: the end-effect
    # generator is --set generator.model=... meanwhile
    add_generator_flags(p, leave_out=("--model",))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_eval)

    p = sub.add_parser("cross", help="train on one data set's labels, score on another's, both ways",
                       description="Does a learned trigger generalise? Trains a classifier on each "
                       "labelled set (its train split, threshold on its dev split), scores it on its "
                       "own test split and on every question of the other set, beside the deciders.")
    p.add_argument("--labels", required=True, nargs=2, metavar=("A", "B"),
                   help="two labelled sets from different data sets")
    p.add_argument("--features", default="probability,embedding",
                   help="comma list of probability, embedding, hidden")
    p.add_argument("--classifier", default="logreg", choices=["logreg", "mlp"],
                   help="logistic regression or a small MLP (default: %(default)s)")
    deprecated_alias(p, "--model", "--classifier")
    p.add_argument("--rule", default=None, help="train and score on another stored rule's labels")
    p.add_argument("--deciders", default="prob,entropy,keyword", help="baselines to score")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="question resamples for the AUCs' 95%% intervals (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON result here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cross)

    p = sub.add_parser("calibrate", help="choose the deciders' thresholds on the dev split",
                       description="Replay each decider on the labelled closed-book segments, per "
                       "question: retrieval rate, recall of the questions retrieval turns right (r1) "
                       "and over-search (questions answered right closed-book that retrieve anyway) "
                       "over a threshold grid; choose the threshold on dev (best recall minus "
                       "over-search, ties to fewer retrievals) and report it and the default on test.")
    p.add_argument("--labels", required=True, help="labelled set from `rigkit trigger build-labels`")
    p.add_argument("--deciders", default="prob,entropy,margin", help="deciders to calibrate")
    p.add_argument("--grid", type=int, default=21, metavar="N",
                   help="thresholds to try, at quantiles of the dev questions (default: %(default)s)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="question resamples for the ROC-AUC's 95%% interval (0: none)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--out", help="write the calibration JSON here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_calibrate)


def _log(text: str) -> None:
    print(text, file=sys.stderr)


def _check_exists(path: str, flag: str) -> None:
    from rigkit.errors import InputError

    if not Path(path).exists():
        raise InputError(f"{flag} {path}: file not found")


def _build_labels(args: argparse.Namespace) -> int:
    from rigkit.build import build_generator
    from rigkit.cli import check_model_path, check_out, run_config
    from rigkit.trigger.labels import agreement, build_labels, resumable

    check_out(args.out, "file")
    check_model_path(args.model)
    _check_exists(args.qa, "--qa")
    config = run_config(args)
    generator = build_generator(config.generator)  # device, dtype, backend
    resume = None if args.fresh else resumable(args.out, args.qa, generator)
    if resume is not None:
        _log(f"resuming {args.out}: {len(resume.meta.get('done_qids', []))} questions already labelled")
    splits = [s.strip() for s in args.split.split(",") if s.strip()] if args.split else None
    labels = build_labels(args.qa, generator, config, limit=args.limit, rule=args.rule,
                          hidden=not args.no_hidden, min_gain=args.min_gain,
                          checkpoint=args.out, resume=resume, progress=not args.json, splits=splits)
    labels.save(args.out)
    summary = {"out": args.out, "segments": len(labels), "positives": labels.positives,
               "rule": labels.rule, "questions": labels.meta.get("questions"),
               "agreement": agreement(labels) if len(labels) else None}
    if args.json:
        print(json.dumps(summary))
    else:
        _log(f"wrote {len(labels)} segments ({labels.positives} positive by {labels.rule}) to {args.out}")
        _log(f"rule agreement r1 vs r2: {summary['agreement']}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from rigkit.cli import check_out
    from rigkit.deciders.trigger_features import parse_feature_sets
    from rigkit.trigger.labelset import load_labels
    from rigkit.trigger.model import save_trigger, train_trigger

    check_out(args.out, "file")
    _check_exists(args.labels, "--labels")
    labels = load_labels(args.labels)
    model = train_trigger(labels, features=parse_feature_sets(args.features), model=args.classifier,
                          rule=args.rule, seed=args.seed, set_dir=args.set_dir)
    save_trigger(model, args.out)
    summary = {"out": args.out, "threshold": model.threshold, "features": list(model.spec.sets),
               "split_source": model.meta["split_source"], "counts": model.meta["counts"]}
    if args.json:
        print(json.dumps(summary))
    else:
        _log(f"wrote {args.out}: threshold {model.threshold:.3f} ({model.meta['threshold_source']}), "
             f"split {model.meta['split_source']}, counts {model.meta['counts']}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from rigkit.trigger.evaluate import evaluate_trigger
    from rigkit.trigger.labels import agreement
    from rigkit.trigger.labelset import load_labels
    from rigkit.trigger.model import load_trigger

    if not args.trigger_model:
        from rigkit.errors import InputError

        raise InputError("trigger eval needs --trigger-model FILE (written by `rigkit trigger train`)")
    labels = load_labels(args.labels)
    model = load_trigger(args.trigger_model)
    deciders = [d.strip() for d in args.deciders.split(",") if d.strip()]
    report = evaluate_trigger(labels, model, deciders=deciders, split=args.split,
                              bootstrap=args.bootstrap, seed=args.seed)
    out = report.to_dict()
    if {"r1", "r2"} <= set(labels.rows[0].rules):
        out["agreement"] = agreement(labels)
    if args.html:
        report.figure().write_html(args.html, include_plotlyjs=True)
    if args.end_effect:
        effect = _end_effect(args, labels, model)
        out["end_effect"] = effect.to_dict()
    if args.json:
        print(json.dumps(out))
    else:
        print(report.table())
        if "agreement" in out:
            a = out["agreement"]
            print(f"\nrule agreement r1 vs r2: {a['percent_agree']}% agree, kappa {a['cohen_kappa']}")
        if args.end_effect:
            print("\n" + effect.table())
    return 0


def _cross(args: argparse.Namespace) -> int:
    from rigkit.cli import check_out
    from rigkit.deciders.trigger_features import parse_feature_sets
    from rigkit.files import atomic_write_text
    from rigkit.trigger.evaluate import cross_set, cross_set_table
    from rigkit.trigger.labelset import load_labels

    for path in args.labels:
        _check_exists(path, "--labels")
    if args.out:
        check_out(args.out, "file")
    first, second = (load_labels(p) for p in args.labels)
    deciders = [d.strip() for d in args.deciders.split(",") if d.strip()]
    result = cross_set(first, second, features=parse_feature_sets(args.features), model=args.classifier,
                       rule=args.rule, deciders=deciders, bootstrap=args.bootstrap, seed=args.seed)
    result["labels"] = list(args.labels)
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print(cross_set_table(result))
        for name, run in result["runs"].items():
            for note in run["notes"]:
                print(f"note ({name}): {note}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from rigkit.cli import check_out
    from rigkit.files import atomic_write_text
    from rigkit.trigger.calibrate import calibrate
    from rigkit.trigger.labelset import load_labels

    _check_exists(args.labels, "--labels")
    if args.out:
        check_out(args.out, "file")
    deciders = [d.strip() for d in args.deciders.split(",") if d.strip()]
    result = calibrate(load_labels(args.labels), deciders=deciders, grid=args.grid,
                       bootstrap=args.bootstrap, seed=args.seed)
    data = result.to_dict()
    if args.out:
        atomic_write_text(args.out, json.dumps(data, indent=1) + "\n")
    print(json.dumps(data) if args.json else result.table())
    if args.out and not args.json and any(d.get("chosen_threshold") is not None for d in data["deciders"].values()):
        print(f"or every calibrated decider at once: --calibration {args.out}")
    return 0


def _end_effect(args, labels, model):
    from rigkit.build import build_generator, build_retriever
    from rigkit.cli import run_config
    from rigkit.datasets import load_qa
    from rigkit.errors import InputError
    from rigkit.trigger.endeffect import end_effect

    qa = args.qa or labels.meta.get("qa")
    if not qa or not Path(qa).exists():
        raise InputError("--end-effect needs the QA file: pass --qa FILE")
    test = set(model.meta.get("split_qids", {}).get("test", []))
    records = [r for r in load_qa(qa) if r["id"] in test][: args.end_effect]
    if not records:
        raise InputError(f"none of the model's test questions are in {qa}")
    config = run_config(args)
    if config.retrieval.corpus is None and config.retrieval.index is None:
        corpus = Path(qa).with_name("corpus.jsonl")  # the QA set's own paragraph corpus
        if corpus.exists():
            config = config.override(retrieval={"corpus": str(corpus)})
    generator = build_generator(config.generator)  # device, dtype, backend
    retriever = build_retriever(config.retrieval)
    return end_effect(records, model.path, generator, retriever, config)
