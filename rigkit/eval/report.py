"""The evaluation report: one Markdown file and one self-contained HTML file with the same numbers.

Both are pure functions of a run folder's `results.jsonl` and `meta.json`, so a report can be
rebuilt at any time (also while an evaluation is still running). The HTML embeds plotly.js
inline (`include_plotlyjs=True`) because readers may be offline; figures: accuracy by system and
question type, latency per stage (stacked), retrievals per question (histogram), accuracy vs
retrievals (scatter). Files are written to a temporary name and renamed, so a reader never sees
half a report. Reading the run folder (and those compared with it): `rigkit.eval.run_folder`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rigkit.errors import InputError
from rigkit.eval.aggregate import (
    ALL_TYPES,
    METRICS,
    GroupStats,
    aggregate,
    question_type,
    stage_names,
)
from rigkit.eval.answers import answer_kind, before_short_answer, with_open_scores
from rigkit.eval.by_source import source_tables
from rigkit.eval.decisions import with_type_aware
from rigkit.eval.floor import with_floor
from rigkit.eval.loss import COVER_EM_CAUTION, loss_tables
from rigkit.eval.paired import (
    FEW_DISCORDANT,
    PairedComparison,
    compare_systems,
    per_question,
    wins_losses,
)
from rigkit.eval.run_folder import META_FILE, load_compared, load_run, read_meta, split_label
from rigkit.eval.runner import RESULTS_FILE
from rigkit.files import atomic_write_text

__all__ = ["META_FILE", "read_meta", "load_run", "load_compared", "split_label", "report_tables", "markdown_report", "report_figures",
           "write_report", "markdown_table", "html_table"]

DEFAULT_BASELINE = "rag"  # what the paired comparisons are against
QUALITY = ("em_short", "f1_short", "em_open", "f1_open", "em", "f1", "em_extracted", "f1_extracted", "cover_em", "type_aware", "support_recall",
           "support_recall_pid", "citation_precision", "all_sentences_supported",
           "sentence_support_share")
COST = ("retrievals", "trigger_rate", "passages_injected", "tokens_injected", "tokens_prefilled",
        "tokens_reused", "forward_passes", "extra_model_calls", "model_calls", "latency")
# "better" and "cheaper" read together: the headline figures, then what they cost per question
HEADLINE = ("em_short", "f1_short", "em_open", "f1_open", "cover_em", "f1", "support_recall", "retrievals", "model_calls",
            "tokens_prefilled")
# what the loop's guards did, and the final text's repeated sentences and unfinished endings
GUARDS = ("fallbacks", "repeats_cut", "query_guard_hits", "trimmed", "unsupported_flagged",
          "grounded_rewrites", "grounded_kept", "repeated_sentences", "ends_mid_sentence", "cut_mid_sentence")
CLOSED_BOOK = "closed_book"  # the reference of the harm table's first count
BY_TYPE = ("em_short", "f1_short", "em_open", "f1_open", "em", "f1", "em_extracted", "cover_em", "type_aware", "support_recall", "retrievals", "latency")
_LABEL = {key: label for key, label, _ in METRICS}
_FORMAT = {key: fmt for key, _, fmt in METRICS}

Table = tuple[list[str], list[list[str]]]  # (header, rows of cells)


def _cell(stats: GroupStats, key: str) -> str:
    mean, spread = stats.mean.get(key), stats.spread.get(key)
    if mean is None:
        return "–"
    text = _FORMAT[key].format(mean)
    return f"{text} ± {_FORMAT[key].format(spread)}" if spread is not None else text


def _metric_table(groups: list[GroupStats], keys: tuple[str, ...], with_type: bool) -> Table:
    keys = tuple(k for k in keys if any(g.mean.get(k) is not None for g in groups))
    header = ["System", *(["Type"] if with_type else []), "Questions", "Runs",
              *(_LABEL[k] for k in keys)]
    rows = []
    for g in groups:
        # answers whose every retrieval failed are left out of the figures, and the row says so
        name = g.system + (f" (⚠ {g.retrieval_failed} answers: every retrieval failed, left out)"
                           if g.retrieval_failed else "")
        lead = [name, *([g.type] if with_type else []), str(g.questions), str(g.runs)]
        rows.append(lead + [_cell(g, k) for k in keys])
    return header, rows


def _latency_table(groups: list[GroupStats], stages: list[str]) -> Table:
    def fmt(v: float | None) -> str:
        return "–" if v is None else f"{v:.2f}"

    header = ["System", "Policy", *(f"{s} (s)" for s in stages), "p50 (s)", "p95 (s)", "Errors",
              "Rounds with retrieval errors", "Answers with every retrieval failed"]
    rows = [[g.system, "/".join(g.policies) or "–", *(fmt(g.stages.get(s)) for s in stages),
             fmt(g.latency_p50), fmt(g.latency_p95), str(g.errors), str(g.retrieval_error_rounds),
             str(g.retrieval_failed)] for g in groups]
    return header, rows


def _paired_table(comparisons: list[PairedComparison]) -> Table:
    header = ["System", "Metric", "Pairs", "Difference", "95% interval (bootstrap)",
              f"95% interval (Newcombe, < {FEW_DISCORDANT} discordant)", "Wins / losses", "p (exact McNemar)"]
    rows = [[c.system, _LABEL[c.metric], str(c.pairs), f"{c.difference:+.3f}",
             f"[{c.low:+.3f}, {c.high:+.3f}]",
             "" if c.newcombe is None else f"[{c.newcombe[0]:+.3f}, {c.newcombe[1]:+.3f}]",
             f"{c.wins} / {c.losses}", f"{c.p_value:.3g}"]
            for c in comparisons]
    return header, rows


def _glance_table(headline: Table, comparisons: list[PairedComparison], baseline: str) -> Table:
    """One row per system: the headline figures, then its paired differences from `baseline`."""
    found = {(c.system, c.metric): c for c in comparisons}
    header = [*headline[0], f"Cover EM − {baseline} [95%]", "Wins / losses, p",
              f"F1 − {baseline} [95%]", f"Support recall − {baseline} [95%]"]

    def diff(system: str, metric: str) -> str:
        c = found.get((system, metric))
        return "" if c is None else f"{c.difference:+.3f} {c.interval_text()}"

    rows = []
    for row in headline[1]:
        system = row[0]
        cover = found.get((system, "cover_em"))
        rows.append([*row, diff(system, "cover_em"),
                     "" if cover is None else f"{cover.wins} / {cover.losses}, p={cover.p_value:.2g}",
                     diff(system, "f1"), diff(system, "support_recall")])
    return header, rows


def _types_table(rows: list[dict[str, Any]], typed: list[GroupStats], baseline: str,
                 metric: str = "cover_em") -> Table:
    """`metric` per question type (with its count), each system's wins / losses against `baseline`."""
    systems = list(dict.fromkeys(g.system for g in typed))
    header = ["Type", "Questions", *systems]
    table = []
    for qtype in sorted({g.type for g in typed}):
        of_type = [r for r in rows if question_type(r) == qtype]
        scores = per_question(of_type, metric)
        reference = scores.get(baseline, {})
        stats = {g.system: g for g in typed if g.type == qtype}
        cells = []
        for system in systems:
            g = stats.get(system)
            cell = "–" if g is None or g.mean.get(metric) is None else _cell(g, metric)
            mine = scores.get(system, {})
            if system != baseline and set(mine) & set(reference):
                cell += " ({} / {})".format(*wins_losses(mine, reference))
            cells.append(cell)
        table.append([qtype, str(len({r["id"] for r in of_type})), *cells])
    return header, table


def _harm_table(rows: list[dict[str, Any]]) -> Table:
    """Answers retrieval made wrong (losses) or right (wins), on Cover EM, per system.

    Against closed-book (when it ran): closed-book right and the system not, and the reverse.
    For RIG: the draft before the first retrieval held the gold answer and the final one does
    not, and the reverse; answers that never retrieved mid-answer have no such draft."""
    scores = per_question(rows, "cover_em")
    closed = scores.get(CLOSED_BOOK, {})
    header = ["System", "Questions", "Closed-book right, system wrong", "System right, closed-book wrong",
              "Draft right, final wrong", "Draft wrong, final right", "Answers with a draft"]
    table = []
    for system in (s for s in dict.fromkeys(r["system"] for r in rows) if s != CLOSED_BOOK):
        mine = scores.get(system, {})
        wins, losses = wins_losses(mine, closed) if closed else ("–", "–")
        drafts = [r for r in rows if r["system"] == system and not r.get("error")
                  and isinstance(r.get("draft_cover_em"), (int, float)) and isinstance(r.get("cover_em"), (int, float))]
        lost = sum(r["draft_cover_em"] > r["cover_em"] for r in drafts)
        gained = sum(r["draft_cover_em"] < r["cover_em"] for r in drafts)
        table.append([system, str(len(mine)), str(losses), str(wins),
                      *((str(lost), str(gained)) if drafts else ("–", "–")), str(len(drafts))])
    return header, table


def report_tables(rows: list[dict[str, Any]], baseline: str = DEFAULT_BASELINE,
                  meta: dict[str, Any] | None = None) -> dict[str, Table]:
    """Named tables (quality, cost, paired comparisons, by type, latency) from result lines; with
    `meta`, the where-the-loss-lies tables too (`rigkit.eval.loss`)."""
    rows = with_open_scores(with_type_aware(rows))
    groups = aggregate(rows)
    overall = [g for g in groups if g.type == ALL_TYPES]
    typed = [g for g in groups if g.type != ALL_TYPES]
    comparisons = compare_systems(rows, baseline)
    headline = _metric_table(overall, HEADLINE, False)
    headline[0].append("Latency p50 (s)")
    for row, g in zip(headline[1], overall):
        row.append("–" if g.latency_p50 is None else f"{g.latency_p50:.2f}")
    # a set of several question types leads with them: comparison apart from compositional
    lead = ({f"Type-aware score by question type, wins / losses against {baseline} (leads: read each "
             "type apart)": _types_table(rows, typed, baseline, "type_aware")}
            if comparisons and len({g.type for g in typed}) > 1 else {})
    return {
        **lead,
        "Answer quality and evidence": _metric_table(overall, QUALITY, False),
        "Quality beside cost": headline,
        "Cost": _metric_table(overall, COST, False),
        "Harm: answers retrieval made wrong (losses) or right (wins), on Cover EM": _harm_table(rows),
        "Loop guards per answer (fallbacks, repeats cut, query guards, trimmed endings, unsupported "
        "sentences, grounded rewrites tried and kept) and the final text's repeats and unfinished endings":
        _metric_table(overall, GUARDS, False),
        # only when the baseline ran beside other systems
        **({f"Paired against {baseline} (same questions; bootstrap interval, Newcombe's below "
            f"{FEW_DISCORDANT} discordant pairs, exact sign / McNemar test)":
            _paired_table(comparisons),
            f"Against {baseline} at a glance (cost beside quality; paired differences)":
            _glance_table(headline, comparisons, baseline),
            f"Cover EM by question type, wins / losses against {baseline}":
            _types_table(rows, typed, baseline)} if comparisons else {}),
        "By question type": _metric_table(typed, BY_TYPE, True),
        "Latency per question by stage (mean), p50 / p95": _latency_table(overall, stage_names(rows)),
        **loss_tables(meta or {}, rows, baseline),
        **source_tables(meta or {}, rows),
    }


def _describe(meta: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    cfg = meta.get("config", {})
    added = [r for r in rows if r.get("answered_by") == "report"]  # the floor `with_floor` added
    rows = [r for r in rows if r.get("answered_by") != "report"]
    # the answers' own record first: a served model's source is known only once it has answered
    extracted = list(dict.fromkeys(r["system"] for r in rows if before_short_answer(r)))
    floor = list(dict.fromkeys(r["system"] for r in added))
    model = next((r["model"] for r in rows if r.get("model")), None) or meta.get("model") or {}
    questions = len({r["id"] for r in rows})
    systems = list(dict.fromkeys(r["system"] for r in rows))
    runs = len({r["run"] for r in rows})
    open_questions = {r["id"] for r in rows if not r.get("error") and answer_kind(r.get("question", ""), r.get("gold") or []) == "open"}
    model_line = (
        "Model: none (every system answers without one)." if model.get("source") == "no model" else
        f"Model: `{model.get('spec', cfg.get('generator', {}).get('model', '?'))}` "
        f"(source: {model.get('source', '?')}), temperature "
        f"{cfg.get('generator', {}).get('temperature', '?')}; index: `{meta.get('index', '?')}`; "
        f"layout: {cfg.get('context', {}).get('layout', '?')}; config: "
        f"`{meta.get('config_file') or 'defaults'}`.")
    return [
        f"Data: `{meta.get('qa', '?')}` (split: {meta.get('split', '?')}, {split_label(meta)}"
        f"{'; cut from runs over every question' if meta.get('restricted_from') else ''}), {questions} questions, "
        f"{len(systems)} systems, {runs} run(s), {len(rows)} answers.",
        model_line,
        f"EM / F1 open: on the {len(open_questions)} of {questions} questions that are open (neither yes/no "
        "nor one of two options the question names, where EM is near a coin's .5 for any system). "
        "A system beats another only if it also beats `question_only` (no model: the first option "
        "named, or yes).",
        *([f"EM / F1 open of {', '.join(f'`{s}`' for s in extracted)}: on the answer the extraction rules of "
           "their date cut from the reply (these runs came before the short-answer line)."] if extracted else []),
        *([f"{' and '.join(f'`{s}`' for s in floor)} {'were' if len(floor) > 1 else 'was'} answered by "
           f"this report (no model; deterministic) on the same {len({r['id'] for r in added})} questions: "
           "the run itself did not include them."] if floor else []),
        "Figures are means over questions; with several runs, ± is the standard deviation of the "
        "run means. Cover EM: the gold answer appears in the answer. Support recall: share of "
        "supporting paragraphs (by title; pid: by paragraph id) among the injected passages. "
        f"Cover EM is lenient: {COVER_EM_CAUTION}",
        *(f"`[{c['label']}]`: the systems of `{c['dir']}`, which differs in "
          + (", ".join(f"`{k}: {v}`" for k, v in c["changed"].items()) or "no config key") + "."
          + (f" {_wall_time(c['sessions'])}" if c.get("sessions") else "")
          for c in meta.get("compared", [])),
        *([_wall_time(meta["sessions"])] if meta.get("sessions") else []),
        *([_commits(meta["sessions"])] if meta.get("sessions") else []),
        *(["Latencies of compared runs were measured in separate runs: compare them only when the "
           "machine was equally loaded; token counts compare exactly."] if meta.get("compared") else []),
    ]


def _commits(sessions: list[dict[str, Any]]) -> str:
    """The commits whose rules answered, from the sessions (runs before this was recorded: none)."""
    found = list(dict.fromkeys(s["commit"] for s in sessions if s.get("commit")))
    if not found:
        return "Rules from: no commit recorded (answered before runs recorded one)."
    return "Rules from commit " + ", ".join(f"`{c[:12]}{'+dirty' if c.endswith('+dirty') else ''}`"
                                            for c in found) + "."


def _wall_time(sessions: list[dict[str, Any]]) -> str:
    """How long answering took, from the sessions `rigkit eval` recorded (resumes add sessions)."""
    minutes = sum(float(s.get("seconds", 0)) for s in sessions) / 60
    workers = sorted({s.get("workers") for s in sessions if s.get("workers")})
    return (f"Wall time answering: {minutes:.1f} min in {len(sessions)} session(s), "
            f"{sessions[0].get('started', '?')} to {sessions[-1].get('finished') or 'unfinished'}, "
            f"{'/'.join(map(str, workers)) or '?'} at once on {sessions[-1].get('cpus', '?')} CPUs.")


def _markdown_table(table: Table) -> str:
    header, rows = table
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_report(meta: dict[str, Any], rows: list[dict[str, Any]], baseline: str = DEFAULT_BASELINE,
                    tables: dict[str, Table] | None = None) -> str:
    """`tables`: `report_tables`' result when the caller has it already (computed here otherwise)."""
    parts = ["# rigkit evaluation", "", *(line + "  " for line in _describe(meta, rows)), ""]
    for title, table in (tables or report_tables(rows, baseline, meta)).items():
        parts += [f"## {title}", "", _markdown_table(table), ""]
    return "\n".join(parts)


def report_figures(rows: list[dict[str, Any]], baseline: str = DEFAULT_BASELINE) -> dict[str, Any]:
    """The plotly figures, by title (plotly imported here, never by the core): four always, plus
    paired differences, citations / support and retrieval errors when the rows have them."""
    from rigkit.eval import figures

    groups = aggregate(rows)
    comparisons = compare_systems(rows, baseline)
    return {
        "Accuracy by system and question type": figures.accuracy_figure(groups),
        "Latency per question by stage": figures.latency_figure(
            [g for g in groups if g.type == ALL_TYPES], stage_names(rows)),
        "Retrievals per question": figures.retrievals_figure(rows),
        "Accuracy vs retrievals": figures.scatter_figure(groups),
        **({f"Difference from {baseline} (95% interval)": figures.paired_figure(comparisons)}
           if comparisons else {}),
        # drawn only when they would show something: a run without citations or errors has none
        **({"Citations and support": figures.support_figure(groups)}
           if figures.has_support_metrics(groups) else {}),
        **({"Retrieval errors": figures.retrieval_errors_figure(groups)}
           if figures.has_retrieval_errors(groups) else {}),
    }


def _html_table(table: Table) -> str:
    header, rows = table
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# public: the ladder's report renders its table the same way
markdown_table, html_table = _markdown_table, _html_table

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;
padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
th{background:#f3f3f3}.note{color:#555}"""


def html_report(meta: dict[str, Any], rows: list[dict[str, Any]], baseline: str = DEFAULT_BASELINE,
                tables: dict[str, Table] | None = None) -> str:
    parts = [f"<p class='note'>{html.escape(line.replace('`', ''))}</p>"
             for line in _describe(meta, rows)]
    for title, table in (tables or report_tables(rows, baseline, meta)).items():
        parts += [f"<h2>{html.escape(title)}</h2>", _html_table(table)]
    for i, (title, fig) in enumerate(report_figures(rows, baseline).items()):
        parts.append(f"<h2>{html.escape(title)}</h2>")
        # plotly.js once, inline, before the first figure: the file works offline.
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0), default_width="100%"))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>rigkit evaluation</title>"
            f"<style>{_STYLE}</style></head><body><h1>rigkit evaluation</h1>"
            f"<p class='note'>Written {stamp}.</p>{''.join(parts)}</body></html>")


def write_report(run_dir: str | Path, baseline: str = DEFAULT_BASELINE, compare: Sequence[str] = (),
                 out: str | Path | None = None, split: str | None = None) -> Path:
    """Write report.md and report.html into `out` (default: run_dir); returns the HTML path.

    Systems are compared question by question against `baseline` when it is among them; the
    systems of the `compare` folders join as `system [label]` (`load_compared`). `split`: only
    that stored split's questions, from every folder (a run over every question is cut to them)."""
    meta, rows = load_compared(run_dir, compare, split)
    rows = with_floor(rows)  # every report shows the no-model floor, answered here when the run lacks it
    folder = Path(out) if out is not None else Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    if not rows:
        raise InputError(f"{Path(run_dir) / RESULTS_FILE} holds no complete result lines yet")
    systems = list(dict.fromkeys(r["system"] for r in rows))
    if baseline != DEFAULT_BASELINE and baseline not in systems:
        raise InputError(f"--baseline {baseline}: not a system of this run; its systems: {', '.join(systems)}")
    tables = report_tables(rows, baseline, meta)  # once: the gold file and the bootstraps serve both files
    atomic_write_text(folder / "report.md", markdown_report(meta, rows, baseline, tables))
    target = folder / "report.html"
    atomic_write_text(target, html_report(meta, rows, baseline, tables))
    return target
