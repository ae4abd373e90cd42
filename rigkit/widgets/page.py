"""One run, or several runs side by side, as a single self-contained HTML page.

The page needs no network and no JavaScript: its CSS is inline, round stepping and the heatmap
toggle are radio buttons read by CSS selectors, so the same HTML works as a file handed to
students, inside an ipywidgets `HTML` widget (which runs no scripts) and in JupyterLab.

- `run_html(result)`: a round stepper over a saved run (one round shown at a time).
- `comparison_html(results)`: runs of one question in columns, aligned by round, the final
  answers' word differences against the first run marked (difflib).
- `run_page(result)` / `comparison_page(results)`: the whole document (`rigkit ask --html`,
  `rigkit compare --html`). `RIGResult.to_html()` / `save_html()` call `run_page` through an
  import inside the method: the trace is the bottom layer and loads no view on import.

`lecture=True` is for a projector: text of 18 px and more, a stepper that fits 1280x720, the
decider's evidence and the token budget folded away. Token shading follows CircuitsVis-style
token views: a heatmap of 1 - p or of the entropy, with its colour scale, details on hover.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rigkit.citations import source_label
from rigkit.text import CITATION
from rigkit.trace import Decision, Kept, RIGResult, RoundTrace, Segment
from rigkit.widgets.render import (
    esc,
    hit_status,
    kept_rounds,
    marker_ranges,
    rounded,
    top_choices,
)

__all__ = ["run_html", "comparison_html", "run_page", "comparison_page", "page", "threshold_label",
           "number_citations",
           "word_diff_html", "rounded", "external_references"]

ENTROPY_SCALE = 4.0  # nats at full colour: a token spread evenly over ~55 choices
_ids = itertools.count()

_CSS = """
.rigkit-page{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:14px;line-height:1.45;color:#111;}
.rigkit-page .rig-radio{position:absolute;opacity:0;pointer-events:none;}
.rigkit-page .rig-muted{color:#555;}
.rigkit-page .rig-box{border:1px solid #ddd;border-radius:6px;padding:6px 10px;margin:6px 0;}
.rigkit-page .rig-token{border-radius:2px;}
.rigkit-page .rig-marker{border-top:2px solid #2563eb;border-bottom:2px solid #2563eb;color:#1e3a8a;}
.rigkit-page .rig-span{text-decoration:underline 2px #b91c1c;}
.rigkit-page .rig-discarded{background:#e5e7eb;color:#4b5563;font-style:italic;}
.rigkit-page .rig-current{border-bottom:2px dashed #999;}
.rigkit-page .rig-heat{display:inline-flex;gap:10px;align-items:center;}
.rigkit-page .rig-heat label{cursor:pointer;border:1px solid #bbb;border-radius:4px;padding:0 6px;}
.rigkit-page .rig-scale{display:inline-block;width:140px;height:12px;vertical-align:middle;border:1px solid #ccc;}
.rigkit-page .rig-scale-p{background:linear-gradient(90deg,rgba(239,68,68,0),rgba(239,68,68,.85));}
.rigkit-page .rig-scale-h{background:linear-gradient(90deg,rgba(124,58,237,0),rgba(124,58,237,.85));}
.rigkit-page .rig-legend-p,.rigkit-page .rig-legend-h{display:none;}
.rig-heat-p:checked ~ .rig-body .rig-token:not(.rig-marker):not(.rig-span){background:var(--p);}
.rig-heat-h:checked ~ .rig-body .rig-token:not(.rig-marker):not(.rig-span){background:var(--h);}
.rig-heat-p:checked ~ .rig-body .rig-legend-p,.rig-heat-h:checked ~ .rig-body .rig-legend-h{display:inline;}
.rigkit-page .rig-discarded .rig-token{background:none!important;}
.rigkit-page .rig-round{display:none;}
.rigkit-page .rig-nav label{cursor:pointer;border:1px solid #888;border-radius:4px;padding:1px 10px;margin:0 4px;}
.rigkit-page .rig-nav .rig-off{opacity:.3;pointer-events:none;}
.rigkit-page .rig-cols{display:flex;gap:14px;}
.rigkit-page .rig-cols > div{flex:1;min-width:0;}
.rigkit-page table{border-collapse:collapse;}
.rigkit-page td,.rigkit-page th{padding:3px 8px;border-bottom:1px solid #eee;vertical-align:top;text-align:left;}
.rigkit-page ins{background:#bbf7d0;text-decoration:none;}
.rigkit-page del{background:#fecaca;}
.rigkit-page sup{line-height:0;}
.rigkit-page sup a{text-decoration:none;color:#1d4ed8;}
.rigkit-page details summary{cursor:pointer;color:#555;}
.rigkit-page.lecture{font-size:20px;line-height:1.35;}
.rigkit-page.lecture *{font-size:max(18px,1em)!important;}
.rigkit-page.lecture .rig-title{font-size:24px!important;}
.rigkit-page.lecture .rig-round .rig-cols > div{max-height:540px;overflow:auto;}
"""


def threshold_label(decision: Decision) -> str:
    """`0.3 probability`: a decider's threshold in its own unit ("" when it has none)."""
    if decision.threshold is None:
        return ""
    return f"{decision.threshold:g} {decision.unit or 'score'}".strip()


# ----------------------------------------------------------------------------------- tokens
def _token_html(segment: Segment, i: int, classes: list[str]) -> str:
    prob = math.exp(segment.logprobs[i]) if i < len(segment.logprobs) else 1.0
    ent = segment.entropies[i] if i < len(segment.entropies) else float("nan")
    a_p = min(1.0, max(0.0, 1.0 - prob)) * 0.85
    a_h = 0.0 if math.isnan(ent) else min(1.0, max(0.0, ent / ENTROPY_SCALE)) * 0.85
    title = f"p = {prob:.2f} · entropy = {'–' if math.isnan(ent) else f'{ent:.2f}'} nats"
    title += top_choices(segment, i)
    return (f'<span class="{" ".join(["rig-token", *classes])}" '
            f'style="--p:rgba(239,68,68,{a_p:.2f});--h:rgba(124,58,237,{a_h:.2f});" '
            f'title="{esc(title)}">{esc(segment.tokens[i])}</span>')


def segment_tokens_html(trace: RoundTrace, current: bool, marker_tag: Any = "retrieve",
                        dashed: bool = True) -> str:
    """One segment's tokens, each with one marking: marker box, triggering span, or heat.
    `current`: the round's own segment (its triggering spans shown; dashed unless `dashed=False`)."""
    seg = trace.segment
    discarded = current and trace.kept not in (Kept.SEGMENT, Kept.REWRITE)
    wrap = (["rig-segment"] + (["rig-current"] if current and dashed else [])
            + (["rig-discarded"] if discarded else []))
    if not seg.tokens or "".join(seg.tokens) != seg.text:
        return f'<span class="{" ".join(wrap)}">{esc(seg.text)}</span>'
    markers = marker_ranges(seg.text, marker_tag)
    spans = set()
    if current:
        for s in trace.decision.spans:
            spans.update(range(s.start, s.end))
    parts, pos = [], 0
    for i, tok in enumerate(seg.tokens):
        end = pos + len(tok)
        if any(pos < b and a < end for a, b in markers):
            classes = ["rig-marker"]
        elif i in spans:
            classes = ["rig-span"]
        else:
            classes = []
        parts.append(_token_html(seg, i, classes))
        pos = end
    return f'<span class="{" ".join(wrap)}" style="white-space:pre-wrap;">{"".join(parts)}</span>'


def _heat_controls(uid: str) -> tuple[str, str]:
    """(the radio inputs, which precede the body; the labels and colour scales, inside it)."""
    inputs = "".join(
        f'<input type="radio" class="rig-radio rig-heat-{k}" name="{uid}-heat" id="{uid}-heat-{k}"'
        f'{" checked" if k == "p" else ""}>' for k in ("p", "h", "off"))
    labels = (
        '<div class="rig-heat rig-muted">shade: '
        f'<label for="{uid}-heat-p">1 − probability</label>'
        f'<label for="{uid}-heat-h">entropy</label><label for="{uid}-heat-off">off</label>'
        '<span class="rig-legend-p">0 <span class="rig-scale rig-scale-p"></span> 1 (unlikely token)</span>'
        f'<span class="rig-legend-h">0 <span class="rig-scale rig-scale-h"></span> {ENTROPY_SCALE:g}+ nats</span>'
        '<span><span class="rig-marker">marker</span> · <span class="rig-span">triggering span</span></span>'
        "</div>")
    return inputs, labels


# ----------------------------------------------------------------------------------- panes
def _decision_html(d: Decision, query_intent: str = "") -> str:
    verdict = ('<b style="color:#b45309;">retrieve</b>' if d.retrieve
               else '<b style="color:#15803d;">no retrieval</b>')
    thr = threshold_label(d)
    rows = [f'decider <b class="rig-decider">{esc(d.decider or "?")}</b> → {verdict}',
            f"score {d.score:.2f}" + (f" · threshold {esc(thr)}" if thr else ""),
            f'<span class="rig-reason">{esc(d.reason)}</span>']
    if d.spans:
        rows.append("triggered by " + ", ".join(f"<q>{esc(s.text)}</q>" for s in d.spans))
    intents = [i for i in d.intents if i != query_intent]  # the query pane shows its own
    if intents:
        rows.append("intents: " + "; ".join(esc(i) for i in intents))
    if d.evidence:
        evidence = json.dumps(rounded(d.evidence), ensure_ascii=False, indent=1, default=str)
        rows.append(f'<details class="rig-evidence"><summary>evidence</summary><pre style="white-space:pre-wrap;">'
                    f"{esc(evidence)}</pre></details>")
    return '<div class="rig-box rig-decision">' + "".join(f"<div>{r}</div>" for r in rows) + "</div>"


def _query_html(trace: RoundTrace, snippet: int) -> str:
    q = trace.query
    if q is None:
        return '<div class="rig-box rig-query rig-muted">No retrieval this round.</div>'
    rows = [f'searched <q class="rig-query-text">{esc(q.text)}</q> <span class="rig-muted">({esc(q.mode)})</span>']
    if q.intent:
        rows.append(f"intent: {esc(q.intent)}")
    if trace.error:
        rows.append(f'<span style="color:#b91c1c;">error: {esc(trace.error)}</span>')
    for hit in trace.hits:
        ranks = " ".join(f"{k} #{v}" for k, v in hit.ranks.items() if k != "before_rerank")
        text = hit.text if len(hit.text) <= snippet else hit.text[:snippet] + "…"
        rows.append(f'<div class="rig-hit"><b>{esc(source_label(hit))}</b> '
                    f'<span class="rig-muted">{esc(ranks)} · {hit_status(hit.chunk_id, trace.injection)}</span>'
                    f"<br>{esc(text)}</div>")
    return '<div class="rig-box rig-query">' + "".join(f"<div>{r}</div>" for r in rows) + "</div>"


def _budget_html(trace: RoundTrace) -> str:
    b = trace.budget
    return (f'<details class="rig-budget"><summary>token budget</summary>system {b.system} · question '
            f"{b.question} · passages {b.passages} of {b.max_retrieval_tokens} · draft {b.draft} · "
            f"free {b.free} of {b.limit} · this round {trace.tokens_prefilled} tokens pre-filled</details>")


def number_citations(answer_html: str, result: RIGResult, uid: str | None = None) -> tuple[str, str]:
    """(`answer_html` with each `[[citation:ID]]` as a numbered superscript linked to its passage,
    the list of those passages). `answer_html` is the escaped answer: the tags survive escaping."""
    uid = uid or f"rig{next(_ids)}"
    numbers: dict[str, int] = {}

    def superscript(m: re.Match) -> str:
        n = numbers.setdefault(m.group(1), len(numbers) + 1)
        return f'<sup class="rig-cite"><a href="#{uid}-p{n}" title="{m.group(1)}">[{n}]</a></sup>'

    text = re.sub(r"[ \t]*" + CITATION.pattern, superscript, answer_html, flags=re.IGNORECASE)
    by_id = {h.chunk_id: h for h in result.passages}
    notes = "".join(
        f'<li id="{uid}-p{n}" value="{n}"><b>{esc(source_label(by_id[c]) if c in by_id else c)}</b> '
        f'<span class="rig-muted">{esc(by_id[c].text[:160] + "…" if c in by_id else "")}</span></li>'
        for c, n in numbers.items())
    return text, (f'<ol class="rig-passages" style="margin:4px 0;">{notes}</ol>' if notes else "")


def answer_with_citations(result: RIGResult, uid: str) -> str:
    """The answer with `[[citation:ID]]` as numbered superscripts linked to the passages below."""
    text, notes = number_citations(esc(result.answer), result, uid)
    return f'<div class="rig-answer-text">{text}</div>{notes}'


def _draft_html(rounds: Sequence[RoundTrace], index: int, marker_tag: Any) -> str:
    before = [segment_tokens_html(rounds[i], False, marker_tag) for i in kept_rounds(rounds, index)]
    return "".join(before) + segment_tokens_html(rounds[index], True, marker_tag)


# ------------------------------------------------------------------------------------ pages
def run_html(result: RIGResult, lecture: bool = False, marker_tag: Any = "retrieve") -> str:
    """A stepper over `result`'s rounds: one round at a time, draft left, decision and search right."""
    uid = f"rig{next(_ids)}"
    rounds, n = result.rounds, len(result.rounds)
    snippet = 90 if lecture else 200
    radios = "".join(f'<input type="radio" class="rig-radio" name="{uid}-round" id="{uid}-r{i}"'
                     f'{" checked" if i == 0 else ""}>' for i in range(n))
    show = "".join(f"#{uid}-r{i}:checked ~ .rig-body .rig-round-{i}{{display:block;}}" for i in range(n))
    heat_inputs, heat_labels = _heat_controls(uid)
    sections = []
    for i, trace in enumerate(rounds):
        prev = (f'<label for="{uid}-r{i - 1}">◀ previous</label>' if i else '<label class="rig-off">◀ previous</label>')
        nxt = (f'<label for="{uid}-r{i + 1}">next ▶</label>' if i + 1 < n else '<label class="rig-off">next ▶</label>')
        last = i + 1 == n
        sections.append(
            f'<section class="rig-round rig-round-{i}">'
            f'<div class="rig-nav">{prev}<b class="rig-round-label">Round {i + 1} of {n}</b>{nxt} '
            f'<span class="rig-muted">action {esc(trace.action)} · retrievals so far {trace.retrieval_round}</span></div>'
            f'<div class="rig-cols"><div><div class="rig-box rig-draft">{_draft_html(rounds, i, marker_tag)}</div>'
            f"</div><div>{_decision_html(trace.decision, trace.query.intent if trace.query else '')}"
            f"{_query_html(trace, snippet)}"
            + (f'<div class="rig-box rig-answer"><b>Answer</b> {answer_with_citations(result, uid)}</div>' if last else "")
            + f"{_budget_html(trace)}</div></div></section>")
    body = (f'<div class="rig-title"><b>Q:</b> {esc(result.question)}</div>{heat_labels}'
            + ("".join(sections) if sections else '<div class="rig-muted">No rounds.</div>'))
    return (f'<div class="rigkit-page{" lecture" if lecture else ""}"><style>{_CSS}{show}</style>'
            f'<div class="rig-stepper">{radios}{heat_inputs}<div class="rig-body">{body}</div></div></div>')


def word_diff_html(base: str, other: str) -> tuple[str, str]:
    """(base with words only it has struck, other with words only it has highlighted)."""
    a, b = base.split(), other.split()
    left, right = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            left.append(esc(" ".join(a[i1:i2])))
            right.append(esc(" ".join(b[j1:j2])))
            continue
        if i2 > i1:
            left.append(f"<del>{esc(' '.join(a[i1:i2]))}</del>")
        if j2 > j1:
            right.append(f"<ins>{esc(' '.join(b[j1:j2]))}</ins>")
    return " ".join(left), " ".join(right)


def _how(result: RIGResult) -> str:
    """How a run decided to retrieve: its decider with its threshold in its unit."""
    first = result.rounds[0].decision if result.rounds else None
    if first is None or first.decider in ("", "never"):
        return "retrieves once, before writing" if result.used_retrieval_times else "no retrieval"
    thr = threshold_label(first)
    return f"decider {esc(first.decider)}" + (f", threshold {esc(thr)}" if thr else "")


def comparison_html(results: Mapping[str, RIGResult], lecture: bool = False,
                    marker_tag: Any = "retrieve") -> str:
    """Runs of one question side by side: a column each, a row per round, the answers diffed."""
    uid = f"rig{next(_ids)}"
    names = list(results)
    runs = list(results.values())
    if not runs:
        return '<div class="rigkit-page rig-muted">No runs to compare.</div>'
    heat_inputs, heat_labels = _heat_controls(uid)
    head = "".join(f'<th class="rig-system">{esc(n)}<div class="rig-muted" style="font-weight:normal;">'
                   f"{_how(r)}</div></th>" for n, r in zip(names, runs, strict=True))
    rows = []
    for i in range(max(len(r.rounds) for r in runs)):
        cells = []
        for r in runs:
            if i >= len(r.rounds):
                cells.append('<td class="rig-muted">–</td>')
                continue
            t = r.rounds[i]
            d = t.decision
            verdict = ("" if d.decider in ("", "never")  # plain RAG: nothing decided per round
                       else f'{"retrieve" if d.retrieve else "continue"} (score {d.score:.2f})')
            if t.query is not None:
                verdict += f" · searched <q>{esc(t.query.text)}</q>"
            cells.append(f'<td class="rig-cell">{segment_tokens_html(t, True, marker_tag, dashed=False)}'
                         f'<div class="rig-muted">{verdict}</div></td>')
        rows.append(f'<tr class="rig-compare-round"><th>Round {i + 1}</th>{"".join(cells)}</tr>')
    base = strip_tags(runs[0].answer)
    answers = [esc(base)] + [word_diff_html(base, strip_tags(r.answer))[1] for r in runs[1:]]
    if len(runs) == 2:
        answers[0] = word_diff_html(base, strip_tags(runs[1].answer))[0]
    rows.append('<tr class="rig-compare-answer"><th>Answer</th>'
                + "".join(f'<td class="rig-final">{a}</td>' for a in answers) + "</tr>")
    rows.append('<tr><th>Cost</th>' + "".join(
        f'<td class="rig-muted">{r.used_retrieval_times} retrievals · {len(r.rounds)} rounds · '
        f'{r.tokens.get("generated", 0)} tokens written</td>' for r in runs) + "</tr>")
    note = (f'<div class="rig-muted">answers: <del>only in {esc(names[0])}</del> · '
            "<ins>only in this run</ins> (word diff against the first column)</div>")
    body = (f'<div class="rig-title"><b>Q:</b> {esc(runs[0].question)}</div>{heat_labels}{note}'
            f'<table class="rig-comparison"><tr><th></th>{head}</tr>{"".join(rows)}</table>')
    return (f'<div class="rigkit-page{" lecture" if lecture else ""}"><style>{_CSS}</style>'
            f'<div class="rig-compare">{heat_inputs}<div class="rig-body">{body}</div></div></div>')


def strip_tags(answer: str) -> str:
    from rigkit.text import strip_citations

    return strip_citations(answer)


def page(body: str, title: str = "rigkit run") -> str:
    """A complete HTML document around `body`: UTF-8, no external resources."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{esc(title)}</title></head><body style=\"margin:16px;\">{body}</body></html>\n")


def run_page(result: RIGResult, lecture: bool = False) -> str:
    """`run_html` as a whole HTML document: one file to hand out."""
    return page(run_html(result, lecture=lecture), title=result.question)


def comparison_page(results: Mapping[str, RIGResult], lecture: bool = False) -> str:
    """`comparison_html` as a whole HTML document."""
    question = next(iter(results.values())).question if results else "rigkit comparison"
    return page(comparison_html(results, lecture=lecture), title=question)


def external_references(html_text: str) -> list[str]:
    """http(s) URLs the page would load (src/href/url()): a self-contained page has none."""
    pattern = r"""(?:src|href)\s*=\s*["']?\s*(https?:[^"'\s>]+)|url\(\s*["']?(https?:[^)"']+)"""
    return [a or b for a, b in re.findall(pattern, html_text, re.IGNORECASE)]
