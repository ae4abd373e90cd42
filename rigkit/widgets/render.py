"""Pure HTML renderers for one RIG round: the panes of the RoundStepper.

Each function takes trace dataclasses (`RoundTrace`, `Decision`, `Query`, `Hit`, ...) and returns
an HTML string, so the panes are unit-testable without a kernel and reusable outside widgets
(a static report, a docs page). Styles are inline: a pane never leaks CSS into the notebook.
Class names (`rig-token`, `rig-marker`, `rig-hit`, ...) are stable hooks for tests and the
browser check.

The draft view follows FLARE's observation that low-probability tokens mark where a model
invents facts: each token is shaded by 1 - p, with p and the entropy in its hover title.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from rigkit.citations import source_label
from rigkit.markers import find_markers
from rigkit.markers.parsing import TagSpec  # a word tag or a whole MarkerProtocol
from rigkit.trace import (
    Decision,
    Hit,
    Injection,
    Kept,
    Query,
    RoundTrace,
    Segment,
    Span,
    kept_order,
    kept_part,
)
from rigkit.widgets.figures import score_cut  # pure; plotly is imported only inside figures

__all__ = [
    "draft_html",
    "segment_html",
    "decision_html",
    "query_html",
    "hits_html",
    "compressed_html",
    "context_html",
    "rankings_html",
    "hit_status",
    "BOX_STYLE",
    "MUTED_STYLE",
    "esc",
    "fmt",
    "kept_rounds",
    "top_choices",
    "marker_ranges",
    "rounded",
]

_RETRIEVER_ORDER = ("bm25", "dense", "hybrid", "fused", "rrf",
                    *(f"q{i}" for i in range(1, 10)), "merged")  # sub-queries, then their merge
BOX_STYLE = "font-family:system-ui,sans-serif;font-size:13px;line-height:1.6;"
MUTED_STYLE = "color:#666;"


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def rounded(value: Any, digits: int = 3) -> Any:
    """JSON-able `value` with floats rounded to `digits` significant digits (evidence for people)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value



# --------------------------------------------------------------------------------------- draft
def marker_ranges(text: str, tag: TagSpec) -> list[tuple[int, int]]:
    """Character ranges of retrieval markers, tags included (closed, unclosed or cut off)."""
    return [(m.start, m.end) for m in find_markers(text, tag) if m.end > m.start]


_marker_char_ranges = marker_ranges


def _token_char_offsets(segment: Segment) -> list[tuple[int, int]] | None:
    """(start, end) of each token in `segment.text`, or None when tokens do not spell the text."""
    if not segment.tokens or "".join(segment.tokens) != segment.text:
        return None
    offsets, pos = [], 0
    for tok in segment.tokens:
        offsets.append((pos, pos + len(tok)))
        pos += len(tok)
    return offsets


def _overlaps(a: tuple[int, int], ranges: Iterable[tuple[int, int]]) -> bool:
    return any(a[0] < r[1] and r[0] < a[1] for r in ranges)


def _token_style(prob: float) -> str:
    # Shade by 1 - p: confident tokens stay white, guesses turn red.
    alpha = min(1.0, max(0.0, 1.0 - prob)) * 0.85
    return f"background:rgba(239,68,68,{alpha:.2f});border-radius:2px;"


def _span_token_sets(spans: Sequence[Span], offsets: list[tuple[int, int]] | None) -> set[int]:
    marked: set[int] = set()
    for span in spans:
        if span.end > span.start:
            marked.update(range(span.start, span.end))
        elif offsets and span.char_end > span.char_start >= 0:
            rng = [(span.char_start, span.char_end)]
            marked.update(i for i, off in enumerate(offsets) if _overlaps(off, rng))
    return marked


def top_choices(segment: Segment, i: int) -> str:
    """What the model nearly wrote at token i (" · top choices: …"), where the backend recorded it."""
    if i >= len(segment.alternatives) or not segment.alternatives[i]:
        return ""
    return " · top choices: " + ", ".join(f"{t!r} {p:.2f}" for t, p in segment.alternatives[i].items())


def segment_html(
    segment: Segment, spans: Sequence[Span] = (), marker_tag: TagSpec = "retrieve", current: bool = False,
    discarded: bool = False,
) -> str:
    """One segment: tokens shaded by probability, markers boxed in blue, triggering spans underlined."""
    offsets = _token_char_offsets(segment)
    markers = _marker_char_ranges(segment.text, marker_tag)
    in_span = _span_token_sets(spans, offsets)
    if offsets is None:  # tokens do not line up with the text: show the text, markers only
        return _plain_segment_html(segment.text, markers, current, discarded)
    probs = segment.probs
    parts = []
    for i, tok in enumerate(segment.tokens):
        prob = probs[i] if i < len(probs) else 1.0
        ent = segment.entropies[i] if i < len(segment.entropies) else float("nan")
        # one marking per token: a marker box, else a triggering-span underline, else the shade
        # (none in a discarded segment, which is greyed as a whole)
        classes = ["rig-token"]
        style = "" if discarded else _token_style(prob)
        if _overlaps(offsets[i], markers):
            classes.append("rig-marker")
            style = "border-top:2px solid #2563eb;border-bottom:2px solid #2563eb;color:#1e3a8a;"
        elif i in in_span:
            classes.append("rig-span")
            style = "text-decoration:underline 2px #b91c1c;"
        title = f"p={prob:.3f} · entropy={fmt(ent, 2)} nats · token {i}"
        title += top_choices(segment, i)
        parts.append(
            f'<span class="{" ".join(classes)}" style="{style}" title="{esc(title)}">'
            f"{esc(tok)}</span>"
        )
    return _wrap_segment("".join(parts), current, discarded)


def _plain_segment_html(
    text: str, markers: list[tuple[int, int]], current: bool, discarded: bool
) -> str:
    parts, pos = [], 0
    for start, end in markers:
        parts.append(esc(text[pos:start]))
        parts.append(
            f'<span class="rig-marker" style="border-top:2px solid #2563eb;border-bottom:2px solid #2563eb;color:#1e3a8a;">'
            f"{esc(text[start:end])}</span>"
        )
        pos = end
    parts.append(esc(text[pos:]))
    return _wrap_segment("".join(parts), current, discarded)


def _wrap_segment(body: str, current: bool, discarded: bool) -> str:
    classes = ["rig-segment"] + (["rig-current"] if current else []) + (
        ["rig-discarded"] if discarded else []
    )
    style = "white-space:pre-wrap;"
    if current:
        style += "border-bottom:2px dashed #999;"
    if discarded:  # greyed, not struck through: its tokens keep their own marking
        style += "background:#e5e7eb;color:#4b5563;font-style:italic;"
    title = ' title="discarded: regenerated after retrieval"' if discarded else ""
    return f'<span class="{" ".join(classes)}" style="{style}"{title}>{body}</span>'


def kept_rounds(rounds: Sequence[RoundTrace], index: int) -> list[int]:
    """Indices of the rounds before `index` whose segments stand in the draft at round `index`."""
    # what this round decided counts too: a restore puts the set-aside segment back, a kept rewrite replaces one
    return [i for i in kept_order([r.kept or Kept.NOTHING for r in rounds[: index + 1]]) if i != index]


def draft_html(rounds: Sequence[RoundTrace], index: int, marker_tag: TagSpec = "retrieve") -> str:
    """The draft as it stood at round `index`: kept segments so far, then this round's segment.

    Earlier segments that left the answer (regenerated, dropped, replaced) are left out; the
    current one is dashed-underlined, and struck through unless it stays in the answer whole.
    """
    if not rounds:
        return f'<div class="rig-draft" style="{BOX_STYLE}{MUTED_STYLE}">No rounds yet.</div>'
    index = max(0, min(index, len(rounds) - 1))
    parts = [segment_html(kept_part(rounds[i]), (), marker_tag) for i in kept_rounds(rounds, index)]
    cur = rounds[index]
    parts.append(
        segment_html(
            cur.segment, cur.decision.spans, marker_tag, current=True,
            discarded=cur.kept not in (Kept.SEGMENT, Kept.REWRITE),
        )
    )
    legend = (
        f'<div style="{MUTED_STYLE}font-size:11px;">shade = 1 − p (hover a token for p and entropy)'
        " · <span style=\"border-top:2px solid #2563eb;border-bottom:2px solid #2563eb;\">retrieval marker</span>"
        " · <u>triggering span</u> · dashed = this round's segment</div>"
    )
    return f'<div class="rig-draft" style="{BOX_STYLE}">{"".join(parts)}{legend}</div>'


# ------------------------------------------------------------------------------------ decision
def _score_bar(score: float, threshold: float | None) -> str:
    width = 220
    fill = max(0.0, min(1.0, score)) * width
    bar = (
        f'<span class="rig-score-bar" style="display:inline-block;position:relative;width:{width}px;'
        f'height:10px;background:#eee;vertical-align:middle;">'
        f'<span style="position:absolute;left:0;top:0;height:10px;width:{fill:.0f}px;'
        f'background:#f97316;"></span>'
    )
    if threshold is not None:
        x = max(0.0, min(1.0, threshold)) * width
        bar += (
            f'<span title="threshold {threshold:.3f}" style="position:absolute;left:{x:.0f}px;'
            f'top:-3px;height:16px;width:2px;background:#111;"></span>'
        )
    return bar + "</span>"


def decision_html(decision: Decision, shown_intent: str = "") -> str:
    """Which decider, score against threshold, verdict, reason, triggering spans, evidence.

    The threshold is shown in the decider's unit and, on the score bar, as its cut on the score.
    Intents equal to `shown_intent` (the query pane's) are not repeated; the evidence is folded
    away with its numbers rounded.
    """
    cut = score_cut(decision)
    verdict = "retrieve" if decision.retrieve else "no retrieval"
    color = "#b45309" if decision.retrieve else "#15803d"
    rows = [
        f'<b>decider</b> <code class="rig-decider">{esc(decision.decider or "?")}</code> · '
        f'<b class="rig-verdict" style="color:{color};">{verdict}</b>',
        f"<b>score</b> {fmt(decision.score)} · <b>threshold</b> {fmt(decision.threshold)}"
        + (f" {esc(decision.unit)}" if decision.unit and decision.threshold is not None else "")
        + (f" (retrieves above score {fmt(cut, 2)})" if cut is not None
           and cut != decision.threshold else "") + " " + _score_bar(decision.score, cut),
        f'<b>reason</b> <span class="rig-reason">{esc(decision.reason)}</span>',
    ]
    if decision.spans:
        spans = ", ".join(
            f'<q class="rig-trigger">{esc(s.text)}</q> ({fmt(s.score, 2)})' for s in decision.spans
        )
        rows.append(f"<b>triggering span</b> {spans}")
    intents = [i for i in decision.intents if i.strip() != shown_intent.strip()]
    if intents:
        rows.append("<b>intents</b> " + "; ".join(esc(i) for i in intents))
    if decision.extra_forward_passes:
        rows.append(f"<b>extra forward passes</b> {decision.extra_forward_passes}")
    if decision.evidence:
        text = json.dumps(rounded(decision.evidence), ensure_ascii=False, default=str)
        text = text if len(text) <= 600 else text[:597] + "..."
        rows.append(f'<details class="rig-evidence"><summary><b>evidence</b></summary>'
                    f'<code style="font-size:12px;">{esc(text)}</code></details>')
    body = "".join(f"<div>{r}</div>" for r in rows)
    return f'<div class="rig-decision" style="{BOX_STYLE}">{body}</div>'


# --------------------------------------------------------------------------------------- query
def query_html(query: Query | None, error: str | None = None) -> str:
    """The search: original intent, the query sent, how it was built and what building it cost."""
    err = (
        f'<div class="rig-error" style="color:#b91c1c;"><b>error</b> {esc(error)}</div>'
        if error
        else ""
    )
    if query is None:
        return f'<div class="rig-query" style="{BOX_STYLE}{MUTED_STYLE}">No retrieval this round.{err}</div>'
    rows = [
        f"<b>intent</b> {esc(query.intent) if query.intent else '<i>(none)</i>'}",
        f'<b>query</b> <q class="rig-query-text">{esc(query.text)}</q>',
        *_subqueries_html(query),
        f"<b>mode</b> <code>{esc(query.mode)}</code>"
        + (f" (fell back from <code>{esc(query.fallback_from)}</code>)" if query.fallback_from else "")
        + f" · <b>cost</b> {query.llm_calls} LLM call{'s' if query.llm_calls != 1 else ''}",
    ]
    body = "".join(f"<div>{r}</div>" for r in rows)
    return f'<div class="rig-query" style="{BOX_STYLE}">{body}{err}</div>'


def _subqueries_html(query: Query) -> list[str]:
    """One row listing a round's sub-queries (q1, q2, ... as the hits' rank columns name them)."""
    subqueries = getattr(query, "subqueries", None) or []  # traces from before sub-queries have none
    if len(subqueries) < 2:
        return []
    items = "".join(f'<li class="rig-subquery"><code>q{i}</code> {esc(q)}</li>'
                    for i, q in enumerate(subqueries, start=1))
    return [f'<b>sub-queries</b> ({len(subqueries)}, merged by RRF)'
            f'<ol style="margin:2px 0 2px 18px;padding:0;list-style:none;">{items}</ol>']


# ---------------------------------------------------------------------------------------- hits
def hit_status(chunk_id: str, injection: Injection | None) -> str:
    """What the context manager did with a hit: injected, duplicate, over budget, evicted."""
    if injection is None:
        return "not injected"
    if chunk_id in injection.evicted:
        return "evicted"
    if chunk_id in injection.added:
        return "injected"
    if chunk_id in injection.dropped_duplicates:
        return "duplicate"
    if chunk_id in injection.dropped_budget:
        return "over budget"
    if chunk_id in injection.dropped_relevance:
        return "below the cut"
    return "not injected"


_STATUS_COLORS = {
    "injected": "#15803d", "duplicate": "#6b7280", "over budget": "#b45309",
    "evicted": "#b91c1c", "not injected": "#6b7280", "below the cut": "#6b7280",
}


def _retriever_names(hits: Sequence[Hit]) -> list[str]:
    names = {n for h in hits for n in (*h.ranks, *h.scores)} - {"before_rerank"}  # shown in "#"
    known = [n for n in _RETRIEVER_ORDER if n in names]
    return known + sorted(names - set(known))


def hits_html(
    hits: Sequence[Hit], injection: Injection | None = None, snippet_chars: int = 160,
    show_status: bool = True,
) -> str:
    """A table of hits: title, snippet, rank and score per retriever, fused score, status."""
    if not hits:
        return f'<div class="rig-hits" style="{BOX_STYLE}{MUTED_STYLE}">No hits.</div>'
    names = _retriever_names(hits)
    cell = "padding:2px 6px;border-bottom:1px solid #eee;vertical-align:top;"
    # the hit's own score only without retriever columns: with them it repeats the fused column's
    # RRF score (1/(60 + rank): the same 0.03 for every top hit)
    scored = not names
    head = ["#", "title / snippet", *names, *(["score"] if scored else [])] + (["status"] if show_status else [])
    rows = ["<tr>" + "".join(f'<th style="{cell}text-align:left;">{esc(h)}</th>' for h in head) + "</tr>"]
    for i, hit in enumerate(hits, 1):
        snippet = hit.text if len(hit.text) <= snippet_chars else hit.text[:snippet_chars] + "…"
        before = hit.ranks.get("before_rerank")
        cols = [
            str(i) if before is None  # reranked: where the retriever had it, where it landed
            else f'<span class="rig-rerank-move" title="rank before rerank → after">{before} → {i}</span>',
            f'<b class="rig-hit-title">{esc(hit.title)}</b> '
            f'<span style="{MUTED_STYLE}font-size:11px;">{esc(hit.chunk_id)}</span>'
            + (f' <span class="rig-hit-source" style="font-size:11px;">{esc(source_label(hit))}</span>'
               if source_label(hit) != hit.title else "")
            + f'<div style="font-size:12px;">{esc(snippet)}</div>',
        ]
        for name in names:
            rank, score = hit.ranks.get(name), hit.scores.get(name)
            cols.append(
                f'<span class="rig-rank" data-retriever="{esc(name)}">'
                f"{'#' + str(rank) if rank is not None else '–'}</span>"
                f'<br><span style="{MUTED_STYLE}font-size:11px;">{fmt(score)}</span>'
            )
        if scored:
            cols.append(fmt(hit.score))
        if show_status:
            status = hit_status(hit.chunk_id, injection)
            cols.append(
                f'<span class="rig-status rig-status-{status.replace(" ", "-")}" '
                f'style="color:{_STATUS_COLORS[status]};font-weight:600;">{status}</span>'
            )
        rows.append(
            '<tr class="rig-hit">' + "".join(f'<td style="{cell}">{c}</td>' for c in cols) + "</tr>"
        )
    extra = ""
    if injection is not None:
        shown = {h.chunk_id for h in hits}
        gone = [c for c in injection.evicted if c not in shown]
        if gone:
            extra += (
                f'<div class="rig-evicted" style="color:#b91c1c;">evicted from context: '
                f"{esc(', '.join(gone))}</div>"
            )
        cut = getattr(injection, "truncated", [])  # traces from before cuts were recorded have none
        if cut:
            extra += (
                f'<div class="rig-truncated" style="color:#b45309;">cut to max_passage_tokens: '
                f"{esc(', '.join(cut))}</div>"
            )
        extra += compressed_html(getattr(injection, "compressed", {}))  # none in older traces
        extra += f'<div style="{MUTED_STYLE}">{injection.tokens_added} passage tokens added</div>'
    table = f'<table style="border-collapse:collapse;">{"".join(rows)}</table>'
    return f'<div class="rig-hits" style="{BOX_STYLE}">{table}{extra}</div>'


def compressed_html(compressed: dict[str, dict]) -> str:
    """Passages shortened on the way in: tokens before → after, and the text the model read."""
    rows = []
    for chunk_id, c in compressed.items():
        rows.append(
            f'<details class="rig-compressed" style="color:#1d4ed8;"><summary>{esc(c.get("mode", ""))} '
            f'<code>{esc(chunk_id)}</code>: {c.get("before", "?")} → {c.get("after", "?")} tokens</summary>'
            f'<div class="rig-compressed-text" style="white-space:pre-wrap;font-size:12px;color:#111;">'
            f'{esc(c.get("text", ""))}</div></details>'
        )
    return "".join(rows)


def context_html(result: object) -> str:
    """What the context manager did before the first round: up-front passages compressed or over
    budget, and earlier turns summarised (the summary shown) or dropped."""
    parts: list[str] = []
    upfront = getattr(result, "upfront", None)  # a RIGResult, or None while the run is going
    if upfront is not None and (upfront.dropped_budget or getattr(upfront, "compressed", None)):
        if upfront.dropped_budget:
            parts.append(f"<div>up-front passages over budget: {esc(', '.join(upfront.dropped_budget))}</div>")
        parts.append(compressed_html(getattr(upfront, "compressed", {})))
    history = getattr(result, "history", None)
    if history is not None and history.older_turns:
        what = (f"summarised ({history.older_tokens} → {history.summary_tokens} tokens)" if history.summary
                else f"dropped ({history.older_tokens} tokens; no summarizer)")
        parts.append(f'<div class="rig-history"><b>earlier turns</b>: {history.older_turns} {what}, '
                     f"{history.kept_turns} kept"
                     + (f'<div class="rig-history-summary" style="font-style:italic;">{esc(history.summary)}</div>'
                        if history.summary else "") + "</div>")
    return f'<div class="rig-context" style="{BOX_STYLE}">{"".join(parts)}</div>' if parts else ""


def rankings_html(rankings: dict[str, Sequence[Hit]], snippet_chars: int = 120) -> str:
    """Several retrievers' rankings for one query, side by side (BM25 | dense | hybrid)."""
    cols = []
    for name, hits in rankings.items():
        cols.append(
            f'<div class="rig-ranking" data-retriever="{esc(name)}" style="flex:1;min-width:260px;">'
            f"<h4 style=\"margin:4px 0;\">{esc(name)}</h4>"
            f"{hits_html(hits, None, snippet_chars, show_status=False)}</div>"
        )
    return f'<div class="rig-rankings" style="display:flex;gap:12px;{BOX_STYLE}">{"".join(cols)}</div>'
