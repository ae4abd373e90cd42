"""`rigkit ask`: answer one question with the RIG loop, printing each round as it happens."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rigkit.config import DeciderConfig, load_config
from rigkit.errors import InputError
from rigkit.trace import RIGResult, RoundTrace

__all__ = ["register", "format_round", "format_result"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer a question with retrieval-interleaved generation")
    p.add_argument("question")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--corpus", help="JSONL or folder of .md/.txt (indexed on first use, cached)")
    source.add_argument("--index", help="a saved index folder (rigkit index build)")
    p.add_argument("--model", help="smollm2-135m-instruct (default), a hub id or a local path")
    p.add_argument("--decider", help="marker|prob|entropy|keyword|classifier|composite|always|every_n|never")
    p.add_argument("--threshold", type=float, help="the decider's threshold")
    p.add_argument("--query-mode", help="marker|masked|rewrite|keywords|attention")
    p.add_argument("--trigger-model", help="trained classifier file for --decider classifier")
    p.add_argument("--max-rounds", type=int, help="retrieval rounds before finishing from context")
    p.add_argument("--layout", choices=["append", "prefix"], help="where passages go in the context")
    p.add_argument("--no-cache", action="store_true", help="do not reuse the KV cache across rounds")
    p.add_argument("--config", help="a YAML run config (defaults < file < flags)")
    p.add_argument("--json", action="store_true", help="print exactly the RIGResult JSON on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rigkit.build import build_controller

    base = load_config(args.config)
    if args.decider and args.decider != base.decider.name:
        # another decider: the file's threshold and params were meant for the one it names
        base = dataclasses.replace(base, decider=DeciderConfig(name=args.decider))
    config = base.override(
        generator={"model": args.model, "use_cache": False if args.no_cache else None},
        retrieval={"corpus": args.corpus, "index": args.index},
        decider={"name": args.decider, "threshold": args.threshold, "trigger_model": args.trigger_model},
        query={"mode": args.query_mode},
        context={"layout": args.layout},
        controller={"max_rounds": args.max_rounds},
    )
    if not args.question.strip():
        raise InputError("the question is empty")
    _check_names(config.decider.name, config.query.mode)
    for path in (config.retrieval.corpus, config.retrieval.index):
        if path and not Path(path).exists():
            raise InputError(f"not found: {path}")
    out = sys.stderr if args.json else sys.stdout
    print(f"loading {config.generator.model} and the index...", file=sys.stderr)
    controller = build_controller(config)
    for trace in controller.stream(args.question):
        print(format_round(trace), file=out, flush=True)
    result = controller.last_result
    if args.json:
        print(result.to_json())
    else:
        print(format_result(result), file=out)
    return 0


def _check_names(decider: str, query_mode: str) -> None:
    """Fail before loading a model when a name is wrong."""
    from rigkit.deciders import DECIDERS
    from rigkit.queries import QUERY_BUILDERS

    if decider not in DECIDERS:
        raise InputError(f"unknown decider {decider!r}; choose from {', '.join(DECIDERS)}")
    if query_mode not in QUERY_BUILDERS:
        raise InputError(f"unknown query mode {query_mode!r}; choose from {', '.join(QUERY_BUILDERS)}")


def format_round(trace: RoundTrace) -> str:
    """A plain-text block for one round: segment, decision, query, hits, injection, budget."""
    d, b = trace.decision, trace.budget
    lines = [
        f"── round {trace.index} " + "─" * 50,
        f"segment   {trace.segment.text.strip()!r}  ({len(trace.segment.token_ids)} tokens, {trace.segment.finish_reason})",
        f"decision  {'RETRIEVE' if d.retrieve else 'continue'}  {d.decider} score={d.score:.2f}"
        + (f" threshold={d.threshold}" if d.threshold is not None else "") + f"  {d.reason}",
    ]
    if trace.query is not None:
        lines.append(f"query     {trace.query.text!r}  (mode {trace.query.mode}, extra model calls {trace.query.llm_calls})")
    for rank, hit in enumerate(trace.hits, 1):
        ranks = " ".join(f"{k}#{v}" for k, v in hit.ranks.items())
        lines.append(f"hit {rank}     [{hit.chunk_id}] {hit.title}  ({ranks})")
    if trace.injection is not None:
        inj = trace.injection
        lines.append(
            f"injected  {inj.added or '-'}  duplicates {inj.dropped_duplicates or '-'}  evicted {inj.evicted or '-'}"
        )
    if trace.error:
        lines.append(f"error     {trace.error}")
    lines.append(
        f"action    {trace.action}   budget system {b.system} | question {b.question} | passages {b.passages}"
        f"/{b.max_retrieval_tokens} | draft {b.draft} | free {b.free}"
    )
    timing = " ".join(f"{k} {v:.2f}s" for k, v in trace.timings.items() if v)
    lines.append(f"tokens    pre-filled {trace.tokens_prefilled}, reused from cache {trace.tokens_reused}   {timing}")
    return "\n".join(lines)


def format_result(result: RIGResult) -> str:
    t = result.tokens
    lines = [
        "═" * 64,
        f"answer    {result.answer}",
        f"citations {', '.join(result.citations) or '-'}",
        f"retrievals {result.used_retrieval_times}   low confidence: {result.low_confidence}",
        f"tokens    generated {t['generated']}, pre-filled {t['prefilled']}, reused {t['reused']}"
        + (f" ({t['reused'] / max(1, t['prefilled'] + t['reused']):.0%} of prompt tokens from cache)"),
        f"time      {result.timings.get('total', 0):.1f}s   model {result.model.get('spec')} ({result.model.get('source')})",
    ]
    return "\n".join(lines)
