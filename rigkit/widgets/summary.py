"""Pure HTML summaries: the round header, token budget, stage timings, the final answer, and
tables that put several runs or deciders side by side (closed-book vs RAG vs RIG).

Like `render`, every function maps trace data to an HTML string, testable without a kernel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rigkit.short_answer import answer_line
from rigkit.trace import Action, RIGResult, RoundTrace
from rigkit.widgets.render import BOX_STYLE, MUTED_STYLE, esc, fmt

__all__ = [
    "budget_html",
    "timings_html",
    "round_header_html",
    "answer_html",
    "results_html",
    "comparison_html",
    "recall_html",
]


# ------------------------------------------------------------------------- budget and timings
def budget_html(trace: RoundTrace) -> str:
    """The token budget in numbers (the stacked bar is `figures.budget_figure`)."""
    b = trace.budget
    reused = trace.tokens_reused  # None: a served model that does not report its prefix cache
    total = trace.tokens_prefilled + (reused or 0)
    saved = f" ({reused / total:.0%} cached)" if total and reused is not None else ""
    segment = trace.segment
    chat = ""
    if segment.continuation:  # a chat server: how it went on from the draft
        chat += f"<br>continued: {esc(segment.continuation.replace('_', ' '))}"
    if segment.reasoning:  # a reasoning model's thinking: shown, never part of the answer
        chat += f'<br><span style="{MUTED_STYLE}">reasoning (not in the answer): {esc(segment.reasoning[:400])}</span>'
    return (
        f'<div class="rig-budget" style="{BOX_STYLE}">'
        f"system {b.system} · question {b.question} · passages {b.passages}"
        f" (max {b.max_retrieval_tokens}) · draft {b.draft} · free {b.free} / limit {b.limit}"
        f"<br>this round: {trace.tokens_prefilled} pre-filled, {'unknown' if reused is None else reused} from the KV cache"
        f"{saved}{chat}</div>"
    )


def timings_html(timings: dict[str, float]) -> str:
    """Stage timings for a round, as bars scaled to the slowest stage."""
    if not timings:
        return f'<div class="rig-timings" style="{BOX_STYLE}{MUTED_STYLE}">No timings recorded.</div>'
    longest = max(timings.values()) or 1.0
    rows = []
    for stage, secs in timings.items():
        width = 160 * secs / longest
        rows.append(
            f'<tr class="rig-timing"><td style="padding-right:8px;">{esc(stage)}</td>'
            f'<td style="text-align:right;padding-right:8px;">{secs * 1000:.0f} ms</td>'
            f'<td><span style="display:inline-block;height:9px;width:{width:.0f}px;'
            f'background:#60a5fa;"></span></td></tr>'
        )
    total = sum(timings.values())
    rows.append(f"<tr><td><b>total</b></td><td style=\"text-align:right;\"><b>{total * 1000:.0f} ms"
                "</b></td><td></td></tr>")
    return f'<div class="rig-timings" style="{BOX_STYLE}"><table>{"".join(rows)}</table></div>'


# ------------------------------------------------------------------------------ round / answer
# What each round action did to the answer (hover text of the header's action).
ACTION_MEANINGS = {
    Action.ACCEPT: "no retrieval: the segment stays in the answer",
    Action.CONTINUE: "retrieved: the segment stays and the answer goes on after the passages",
    Action.REGENERATE: "retrieved: the segment is dropped and written again with the passages",
    Action.REWIND: "retrieved: the segment is kept up to its flagged word, and the model writes on from there "
                   "with the passages",
    Action.SKIP: "no retrieval rounds left: the segment stays, the answer finishes from the context",
    Action.GO_ON: "the model ended its turn right after the passages: it is asked to go on from them",
    Action.RESTORE: "asked to go on, the model still wrote nothing: the flagged segment is kept",
    Action.FALLBACK: "the rewrite did not earn its place: the flagged segment is kept after the passages",
    Action.REPEAT: "the segment repeated an earlier sentence: the repeat is cut and the answer ends",
    Action.GROUND: "the previous segment was unsupported by its passages: written again under the strict "
                   "grounding prompt, the rewrite replaces it if supported",
}


def round_header_html(
    question: str, index: int, total: int, finished: bool = True, rounds: Sequence[RoundTrace] = (),
    policy: str = "",
) -> str:
    """`Round i of n` with the question, the run's policy (continue / regenerate after a
    retrieval) and the round's action; `so far` while a live run is still going."""
    if total == 0:
        label = "No rounds yet"
    else:
        label = f"Round {index + 1} of {total}" + ("" if finished else " so far")
    extra = f' · policy <code class="rig-policy">{esc(policy)}</code>' if policy else ""
    if rounds and 0 <= index < len(rounds):
        r = rounds[index]
        meaning = esc(ACTION_MEANINGS.get(r.action, r.action))
        extra += (f' · action <code class="rig-action" title="{meaning}">{esc(r.action)}</code>'
                  f" · retrievals so far {r.retrieval_round}")
        extra += _round_notes(r)
    return (
        f'<div class="rig-header" style="{BOX_STYLE}"><b class="rig-round-label">{label}</b>{extra}'
        f'<div class="rig-question"><b>Q:</b> {esc(question)}</div></div>'
    )


def _round_notes(r: RoundTrace) -> str:
    """Why a rewrite fell back, the loop guards that fired, the sentences flagged unsupported."""
    notes = ([f'<div class="rig-fallback" style="color:#b45309;">fallback: {esc(r.fallback)}</div>']
             if r.fallback else [])
    if r.action is Action.GROUND and not r.fallback:
        notes.append('<div class="rig-grounded" style="color:#15803d;">grounded rewrite: supported by its '
                     "passages, it replaces the previous round's segment</div>")
    notes += [f'<div class="rig-guard" style="{MUTED_STYLE}">guard · {esc(g)}</div>' for g in r.guards]
    notes += [f'<div class="rig-unsupported" style="color:#b45309;">unsupported by its passages: {esc(s)}</div>'
              for s in r.unsupported]
    return "".join(notes)


def answer_html(result: RIGResult | None) -> str:
    """The final clean answer and what it cost; a placeholder while the run is going."""
    if result is None:
        return f'<div class="rig-answer" style="{BOX_STYLE}{MUTED_STYLE}">Answer not finished yet.</div>'
    from rigkit.widgets.page import number_citations

    tok = result.tokens
    flags = " · <b style=\"color:#b45309;\">low confidence</b>" if result.low_confidence else ""
    answer, cited = number_citations(_marked_answer(result), result)  # [[citation:ID]] -> [n]
    # citations the answer carries no tags for (context.citations off): listed by id
    cites = f" · citations {esc(', '.join(result.citations))}" if result.citations and not cited else ""
    return (
        f'<div class="rig-answer" style="{BOX_STYLE}"><b>Answer:</b> '
        f'<span class="rig-answer-text">{answer}</span>'
        + (f'<div class="rig-short-answer"><b>{esc(answer_line(result.short_answer, result.question))}</b></div>'
           if result.short_answer else "")
        + (f'<div class="rig-trimmed" style="{MUTED_STYLE}">trimmed to its last whole sentence: '
           f"cut {esc(result.trimmed)!r}</div>" if result.trimmed else "")
        + f'<div style="{MUTED_STYLE}">{len(result.rounds)} rounds · {result.used_retrieval_times} retrievals'
        f" · tokens generated {tok.get('generated', 0)}, pre-filled {tok.get('prefilled', 0)},"
        f" reused {'unknown' if tok.get('reused', 0) is None else tok.get('reused', 0)}{cites}{flags}</div>"
        + (f'<div style="font-size:12px;">{cited}</div>' if cited else "")
        + "".join(f'<div class="rig-warning" style="color:#b45309;">⚠ {esc(w)}</div>' for w in result.warnings)
        + "</div>"
    )


def _marked_answer(result: RIGResult) -> str:
    """The answer, escaped, with each suspicious sentence marked and its unsupported facts in the
    tooltip (sentences are found in order; citation tags between them are left as they are)."""
    out, cursor = [], 0
    for item in result.suspicious:
        at = result.answer.find(item.text, cursor)
        if at < 0:
            continue
        title = esc("in no passage it could see: " + ", ".join(item.facts))
        out += [esc(result.answer[cursor:at]),
                f'<mark class="rig-suspicious" style="background:#fde68a;" title="{title}">{esc(item.text)}</mark>']
        cursor = at + len(item.text)
    out.append(esc(result.answer[cursor:]))
    return "".join(out)


_CELL = "padding:3px 8px;border-bottom:1px solid #eee;vertical-align:top;text-align:left;"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str) -> str:
    th = "".join(f'<th style="{_CELL}">{esc(h)}</th>' for h in head)
    body = "".join(
        f'<tr class="{cls}-row">' + "".join(f'<td style="{_CELL}">{c}</td>' for c in row) + "</tr>"
        for row in rows
    )
    return f'<table class="{cls}" style="border-collapse:collapse;{BOX_STYLE}"><tr>{th}</tr>{body}</table>'


def results_html(results: Mapping[str, RIGResult]) -> str:
    """Several systems' answers to one question side by side, with retrievals, tokens and time."""
    rows = []
    for name, r in results.items():
        t = r.tokens
        rows.append([
            f"<b>{esc(name)}</b>", esc(r.answer), str(r.used_retrieval_times), str(len(r.rounds)),
            str(t.get("generated", 0)), str(t.get("prefilled", 0)), "unknown" if t.get("reused", 0) is None else str(t.get("reused", 0)),
            fmt(r.timings.get("total"), 1), "yes" if r.low_confidence else "",
        ])
    head = ["system", "answer", "retrievals", "rounds", "generated", "pre-filled", "cached",
            "seconds", "low confidence"]
    return _table(head, rows, "rig-results")


def comparison_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """`compare_deciders` rows as a table: each segment, each decider's score and verdict."""
    names = list(rows[0]["decisions"]) if rows else []
    body = []
    for row in rows:
        cells = [str(row.get("segment", "")), esc(row.get("text", ""))]
        for name in names:
            d = row["decisions"][name]
            mark = " <b style=\"color:#b45309;\">retrieve</b>" if d.retrieve else ""
            cells.append(f'<span title="{esc(d.reason)}">{fmt(d.score)}</span>{mark}')
        body.append(cells)
    return _table(["#", "segment", *names], body, "rig-comparison")


def recall_html(table: Mapping[str, Mapping[str, float]]) -> str:
    """`evaluate_retrieval` output ({mode: {metric: value}}) as a table, best value in bold."""
    metrics = list(next(iter(table.values()), {}))
    best = {m: max(row.get(m, 0.0) for row in table.values()) for m in metrics}
    rows = [
        [f"<b>{esc(mode)}</b>"] + [
            (f"<b>{fmt(row[m])}</b>" if row[m] == best[m] else fmt(row[m])) for m in metrics
        ]
        for mode, row in table.items()
    ]
    return _table(["mode", *metrics], rows, "rig-recall")
