"""`rigkit ask`: answer one question with the RIG loop, printing each round as it happens."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rigkit.citations import source_label
from rigkit.cli import add_config_options, add_rerank_option
from rigkit.cli.sources import add_source_flags, source_overrides
from rigkit.config import DeciderConfig, apply_settings, load_config
from rigkit.errors import InputError
from rigkit.trace import RIGResult, RoundTrace

__all__ = ["register", "format_round", "format_result"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer a question with retrieval-interleaved generation")
    p.add_argument("question")
    add_source_flags(p, "a saved index folder (rigkit index build)")
    p.add_argument("--model", help="smollm2-135m-instruct (default), a hub id or a local path")
    p.add_argument("--decider", help="marker|prob|entropy|keyword|classifier|composite|always|every_n|never")
    p.add_argument("--threshold", type=float, help="the decider's threshold")
    p.add_argument("--query-mode", help="marker|masked|rewrite|keywords|attention|multi "
                   "(multi: up to query.max_subqueries searches, merged by RRF)")
    p.add_argument("--marker-protocol", metavar="NAME|PATH",
                   help="openrig (default) | search-r1 | r1-searcher | self-rag | a .yaml/.json protocol file; "
                        "implies --decider marker --query-mode marker unless they are given")
    p.add_argument("--trigger-model", help="trained classifier file for --decider classifier")
    p.add_argument("--max-rounds", type=int, help="retrieval rounds before finishing from context")
    p.add_argument("--policy", choices=["auto", "continue", "regenerate"],
                   help="after retrieval keep the sentence and continue, or regenerate it "
                        "(auto: the decider's own policy)")
    p.add_argument("--layout", choices=["append", "prefix"], help="where passages go in the context")
    p.add_argument("--no-cache", action="store_true", help="do not reuse the KV cache across rounds")
    p.add_argument("--grounded", action="store_true",
                   help="answer only from the passages and cite them as [n]; unseen citations are removed "
                        "(context.grounding=strict, context.cite=model)")
    add_rerank_option(p)
    p.add_argument("--filter", action="append", metavar="KEY=VALUE",
                   help="search only chunks whose metadata passes, repeatable: lang=en, year>=1990, "
                   "modified<2024-01-01 (replaces retrieval.filters; docs/retrieval.md)")
    add_generator_flags(p)
    add_config_options(p)
    p.add_argument("--json", action="store_true", help="print exactly the RIGResult JSON on stdout")
    p.set_defaults(func=run)


def add_generator_flags(p: argparse.ArgumentParser) -> None:
    """Where the model runs: in-process on a device, or behind an OpenAI-compatible server."""
    g = p.add_argument_group("generator")
    g.add_argument("--backend", choices=["hf", "openai"], help="hf: in-process (default); openai: a served model")
    g.add_argument("--base-url", help="the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the server's API key")
    g.add_argument("--tokenizer", help="the served model's tokenizer (hub id or path; default: --model)")
    g.add_argument("--top-logprobs", type=int, help="top-k log-probabilities per token from the server (20)")
    g.add_argument("--device", help="auto|cpu|cuda|cuda:N|mps (in-process)")
    g.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="weights' dtype (in-process)")
    g.add_argument("--device-map", help="e.g. auto: shard a model over several GPUs (accelerate)")
    g.add_argument("--attn-implementation", help="sdpa (default) | eager | flash_attention_2 ...")
    g.add_argument("--trust-remote-code", action="store_true", default=None,
                   help="run the model repository's own code (only for repositories you trust)")


def generator_overrides(args: argparse.Namespace) -> dict:
    """The generator flags as a config override (None = keep the file's / default value)."""
    return {
        "model": args.model, "use_cache": False if getattr(args, "no_cache", False) else None,
        "backend": args.backend, "base_url": args.base_url, "api_key_env": args.api_key_env,
        "tokenizer": args.tokenizer, "top_logprobs": args.top_logprobs, "device": args.device,
        "dtype": args.dtype, "device_map": args.device_map,
        "attn_implementation": args.attn_implementation, "trust_remote_code": args.trust_remote_code,
    }


def run(args: argparse.Namespace) -> int:
    from rigkit.build import build_controller, uses_markers
    from rigkit.cli import check_decider_params, check_index, check_model_path, check_text
    from rigkit.markers import resolve_protocol
    from rigkit.retrieval.filters import parse_filters

    check_text(args.question)
    check_model_path(args.model)
    base = load_config(args.config)
    decider, query_mode = args.decider, args.query_mode
    if args.marker_protocol and not decider and not uses_markers(base):
        decider, query_mode = "marker", query_mode or "marker"  # a tag protocol is the model's own call
    if decider and decider != base.decider.name:
        # another decider: the file's threshold and params were meant for the one it names
        base = dataclasses.replace(base, decider=DeciderConfig(name=decider))
    config = apply_settings(base, args.settings).override(
        generator=generator_overrides(args),
        retrieval={**source_overrides(args), "rerank": args.rerank, "filters": args.filter},
        decider={"name": decider, "threshold": args.threshold, "trigger_model": args.trigger_model},
        query={"mode": query_mode},
        context={"layout": args.layout, "marker_protocol": args.marker_protocol,
                 "grounding": "strict" if args.grounded else None, "cite": "model" if args.grounded else None},
        controller={"max_rounds": args.max_rounds, "policy": args.policy},
    )
    _check_names(config.decider.name, config.query.mode)
    check_decider_params(config.decider)
    for index in [config.retrieval.index, *(s.index for s in config.retrieval.sources)]:
        check_index(index)
    parse_filters(config.retrieval.filters)  # a malformed filter fails now; its keys with the index
    protocol = resolve_protocol(config.context.marker_protocol, config.context.marker_tag)  # bad file: fail now
    _check_generator(config.generator)
    for path in (config.retrieval.corpus, config.retrieval.index, *(s.index for s in config.retrieval.sources)):
        if path and not path.startswith(("http://", "https://")) and not Path(path).exists():
            raise InputError(f"not found: {path}")
    out = sys.stderr if args.json else sys.stdout
    print(f"loading {config.generator.model} and the index...", file=sys.stderr)
    printer = None if args.json else _TokenPrinter(out)
    callbacks = [] if printer is None else [printer.stream(protocol)]
    controller = build_controller(config, callbacks=callbacks)
    for trace in controller.stream(args.question):
        if printer is not None:
            printer.end_line()
        print(format_round(trace), file=out, flush=True)
    result = controller.last_result
    if args.json:
        print(result.to_json())
    else:
        print(format_result(result), file=out)
    return 0


class _TokenPrinter:
    """Prints the answer as the model writes it (live `TokenStream`), one line per round."""

    def __init__(self, out):
        self.out, self.open = out, False

    def stream(self, marker_tag: object):
        from rigkit.streaming import TokenStream

        return TokenStream(self, marker_tag=marker_tag)

    def __call__(self, event) -> None:
        if not self.open:
            print("writing   ", end="", file=self.out)
            self.open = True
        if event.kind == "token":
            print(event.text, end="", file=self.out, flush=True)
        else:  # a regenerated segment: say what is taken back rather than erase the terminal
            print(f"  [taken back: {len(event.text)} characters]", end="", file=self.out, flush=True)

    def end_line(self) -> None:
        if self.open:
            print(file=self.out)
            self.open = False


def _check_names(decider: str, query_mode: str) -> None:
    """Fail before loading a model when a name is wrong."""
    from rigkit.deciders import check_decider_name
    from rigkit.queries import check_query_mode

    check_decider_name(decider)
    check_query_mode(query_mode)


def _check_generator(g) -> None:
    """Fail before loading a model when the generator settings cannot work."""
    from rigkit.generation.loading import check_placement

    if g.backend == "openai" and not g.base_url:
        raise InputError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
    if g.backend == "hf":
        check_placement(g.device, g.dtype, g.attn_implementation)


def _reused(value: int | None) -> str:
    return "unknown" if value is None else str(value)


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
        lines.append(f"hit {rank}     [{_safe(hit.chunk_id)}] {_safe(source_label(hit))}  ({ranks})")
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
    lines.append(f"tokens    pre-filled {trace.tokens_prefilled}, reused from cache {_reused(trace.tokens_reused)}   {timing}")
    return "\n".join(lines)


def _safe(text: str) -> str:
    from rigkit.cli import safe_terminal

    return safe_terminal(text)


def _sources(result: RIGResult) -> list[str]:
    """`sources` line: where each cited passage comes from (file, page, section)."""
    by_id = {h.chunk_id: h for h in result.passages}
    cited = [by_id[c] for c in result.citations if c in by_id]
    if all(source_label(h) == h.title for h in cited):
        return []  # the titles already say it (a JSONL corpus): the output stays as it was
    return [f"sources   {'; '.join(_safe(f'{h.chunk_id}: {source_label(h)}') for h in cited)}"]


def format_result(result: RIGResult) -> str:
    t = result.tokens
    lines = [
        "═" * 64,
        f"answer    {result.answer}",
        f"citations {', '.join(result.citations) or '-'}",
        *_sources(result),
        f"retrievals {result.used_retrieval_times}   low confidence: {result.low_confidence}"
        + (f"   policy: {result.policy}" if result.policy else ""),
        f"tokens    generated {t['generated']}, pre-filled {t['prefilled']}, reused {_reused(t['reused'])}"
        + (f" ({t['reused'] / max(1, t['prefilled'] + t['reused']):.0%} of prompt tokens from cache)"
           if t["reused"] is not None else " (the server does not report its prefix cache)"),
        f"time      {result.timings.get('total', 0):.1f}s   model {result.model.get('spec')} ({result.model.get('source')})",
    ]
    if result.errors:
        failed_all = result.used_retrieval_times == 0
        lines.append(f"errors    {len(result.errors)} retrieval(s) failed"
                     + (" (every retrieval failed: this answer had no retrieval)" if failed_all else ""))
        lines += [f"          {e}" for e in result.errors]
    lines += [f"warning   {_safe(w)}" for w in result.warnings]
    lines += [f"suspicious {_safe(s.text)!r} ({', '.join(map(_safe, s.facts))})" for s in result.suspicious]
    return "\n".join(lines)
