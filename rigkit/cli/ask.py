"""`rigkit ask`: answer one question with the RIG loop, printing each round as it happens."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rigkit.citations import source_label
from rigkit.cli import add_config_options
from rigkit.cli.flags import add_flags, add_generator_flags, add_source_flags
from rigkit.errors import InputError
from rigkit.short_answer import answer_line
from rigkit.trace import Action, Decision, RIGResult, RoundTrace

__all__ = ["register", "decision_scale", "format_round", "format_result"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer a question with retrieval-interleaved generation")
    p.add_argument("question")
    add_source_flags(p, "a saved index folder (rigkit index build)")
    add_flags(p, "--decider", "--threshold", "--calibration", "--query-mode", "--marker-protocol", "--trigger-model",
              "--max-rounds", "--policy", "--layout", "--no-cache", "--grounded", "--rerank", "--filter")
    add_generator_flags(p)
    add_config_options(p)
    p.add_argument("--json", action="store_true", help="print exactly the RIGResult JSON on stdout")
    p.add_argument("--html", metavar="FILE",
                   help="also write the run as one self-contained HTML page (no network needed)")
    p.add_argument("--lecture", action="store_true",
                   help="with --html: large type for a projector, details folded away")
    p.epilog = ("--marker-protocol implies --decider marker --query-mode marker unless a decider is "
                "given (by flag, --set or --config)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rigkit.build import build_controller, uses_markers
    from rigkit.cli import check_index, check_model_path, check_out, check_text, run_config
    from rigkit.markers import resolve_protocol
    from rigkit.retrieval.filters import parse_filters

    check_text(args.question)
    check_model_path(args.model)
    if args.html:
        check_out(args.html, "file")
    config = run_config(args)
    if args.marker_protocol and not args.decider and not uses_markers(config):
        # a tag protocol is the model's own call
        args.decider, args.query_mode = "marker", args.query_mode or "marker"
        config = run_config(args)
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
    if args.html:
        result.save_html(args.html, lecture=args.lecture)
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


class _TokenPrinter:
    """Prints the answer as the model writes it (live `TokenStream`), one line per round."""

    def __init__(self, out):
        self.out, self.open = out, False

    def stream(self, marker_tag: object):
        from rigkit.streaming import TokenStream

        return TokenStream(self, marker_tag=marker_tag)

    def __call__(self, event) -> None:
        if event.kind == "token":
            if not self.open:
                print("writing   ", end="", file=self.out)
                self.open = True
            print(event.text, end="", file=self.out, flush=True)
            return
        # a take-back or a note: said in brackets rather than erasing the terminal, and what comes
        # next is written on a line of its own, not glued to the text it replaces
        note = f"taken back: {len(event.text)} characters" if event.kind == "retract" else event.text
        print(f"  [{note}]" if self.open else f"writing   [{note}]", file=self.out, flush=True)
        self.open = False

    def end_line(self) -> None:
        if self.open:
            print(file=self.out)
            self.open = False


def _check_generator(g) -> None:
    """Fail before loading a model when the generator settings cannot work."""
    from rigkit.generation.loading import check_placement

    if g.backend in ("openai", "chat") and not g.base_url:
        raise InputError(f"--backend {g.backend} needs --base-url (e.g. http://127.0.0.1:8000/v1)")
    if g.backend == "hf":
        check_placement(g.device, g.dtype, g.attn_implementation)


def _reused(value: int | None) -> str:
    return "unknown" if value is None else str(value)


def decision_scale(d: Decision) -> str:
    """Score and cut on one scale, the threshold in the decider's unit beside them: "score=0.55
    cut=0.70 (threshold 0.3 probability)" reads true where "score=0.55 threshold=0.3" did not."""
    text = f"score={d.score:.2f}"
    if d.score_threshold is not None:
        text += f" cut={d.score_threshold:.2f}"
    if d.threshold is not None:
        text += f" (threshold {d.threshold:g}" + (f" {d.unit})" if d.unit else ")")
    return text


def format_round(trace: RoundTrace) -> str:
    """A plain-text block for one round: segment, decision, query, hits, injection, budget."""
    d, b = trace.decision, trace.budget
    lines = [
        f"── round {trace.index} " + "─" * 50,
        f"segment   {trace.segment.text.strip()!r}  ({len(trace.segment.token_ids)} tokens, {trace.segment.finish_reason})",
        f"decision  {'RETRIEVE' if d.retrieve else 'continue'}  {d.decider} {decision_scale(d)}  {d.reason}",
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
            + (f"  below the cut {inj.dropped_relevance}" if inj.dropped_relevance else "")
        )
    if trace.error:
        lines.append(f"error     {trace.error}")
    lines += [f"guard     {_safe(g)}" for g in trace.guards]
    if trace.action is Action.GROUND:
        lines.append("grounded  the previous segment written again under the strict grounding prompt: "
                     + ("dropped" if trace.fallback else "supported, it replaces that segment"))
    if trace.fallback:
        lines.append(f"fallback  {trace.fallback}")
    lines += [f"unused    [{_safe(cid)}] {_safe(why)}" for cid, why in trace.unused.items()]
    lines += [f"unsupported {_safe(s)!r}" for s in trace.unsupported]
    lines.append(
        f"action    {trace.action}   budget system {b.system} | question {b.question} | passages {b.passages}"
        f"/{b.max_retrieval_tokens} | draft {b.draft} | free {b.free}"
    )
    timing = " ".join(f"{k} {v:.2f}s" for k, v in trace.timings.items() if v)
    lines.append(f"tokens    pre-filled {trace.tokens_prefilled}, reused from cache {_reused(trace.tokens_reused)}"
                 f"{_share(trace.tokens_prefilled, trace.tokens_reused)}   {timing}")
    if trace.segment.continuation:
        lines.append(f"continued {trace.segment.continuation.replace('_', ' ')}"
                     " (chat server: the final assistant message, or a new turn carrying the draft)")
    if trace.segment.reasoning:
        lines.append(f"reasoning {_safe(' '.join(trace.segment.reasoning.split())[:200])!r} (not part of the answer)")
    return "\n".join(lines)


def _share(prefilled: int, reused: int | None) -> str:
    """The share of the prompt's tokens the cache (in-process, or the server's) served."""
    return "" if not reused else f" ({reused / max(1, prefilled + reused):.0%} of the prompt)"


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
        *([f"short     {answer_line(result.short_answer, result.question)}"] if result.short_answer else []),
        *([f"trimmed   {result.trimmed!r} (an unfinished last sentence)"] if result.trimmed else []),
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
