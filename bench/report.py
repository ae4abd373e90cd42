"""Print the performance table of docs/performance.md (markdown) from the suite's JSON in bench/results/.

    python bench/report.py             # the full-mode results (what `make bench` wrote)
    python bench/report.py --quick     # the quick-mode results
    python bench/report.py --dir DIR   # any folder of results

A part whose JSON is missing is listed as not run, so a partial suite still gives a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PARTS = ("cache", "overhead", "cost", "latency", "stages", "retrieval", "startup", "compression", "serve", "serve_vllm",
         "eval_throughput")


# the parts whose script is not named after them
COMMANDS = {"serve_vllm": "python bench/serve.py --vllm --clients 4 --workers 4 --no-first-token --dataset 2wikimultihopqa"}


def load(folder: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for name in PARTS:
        path = folder / f"{name}.json"
        if path.exists():
            found[name] = json.loads(path.read_text(encoding="utf-8"))
    return found


def x(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None or value != value else f"{value:.{digits}f}x"


def goal(met: bool) -> str:
    return "met" if met else "**missed**"


def cache_rows(r: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    summary = [e for p in r["profiles"].values() for e in p["summary"]]
    names = {"cpu": "CPU profile", "default": "library defaults"}
    for profile, data in r["profiles"].items():
        mine = [e for e in summary if e["profile"] == profile]
        st = data.get("setting", {})
        label = (f"{names.get(profile, profile)} ({st.get('n', '?')} {st.get('questions', '')} question(s), "
                 f"{st.get('max_retrieval_tokens', '?'):,} passage tokens, top-k {st.get('top_k', '?')}, "
                 f"{st.get('max_answer_tokens', '?')}-token answers)")
        if not mine:
            continue
        for rounds in sorted({e["rounds"] for e in mine}):
            def pick(mode, way, rounds=rounds, mine=mine):
                return next((e for e in mine if (e["rounds"], e["mode"], e["way"]) == (rounds, mode, way)), None)

            ref = pick("free", "append + cache")
            parts = []
            for way in ("prefix + cache", "prefix, no cache", "append, no cache"):
                rep = pick("replay", way) or (pick("free", way) if way == "append, no cache" else None)
                if rep:
                    parts.append(f"{way} {x(rep['prefill_vs_append'])} pre-fill / {x(rep['time_vs_append'])} time")
            free = pick("free", "prefix + cache")
            free_txt = (f"; free run prefix + cache {x(free['prefill_vs_append'])} / {x(free['time_vs_append'])} "
                        f"({free['generated']} vs {ref['generated']} tokens written)") if free and ref else ""
            want = {5: 3.0, 3: 2.0}.get(rounds)
            flare = pick("replay", "prefix, no cache")
            prefix = pick("replay", "prefix + cache")
            verdict = ""
            if want and prefix and flare:
                verdict = (f">= {want:.0f}x: {goal(prefix['prefill_vs_append'] >= want)} vs prefix + cache, "
                           f"{goal(flare['prefill_vs_append'] >= want)} vs re-encoding")
            nocache = pick("free", "append, no cache")
            if nocache:
                verdict += f"; cache on/off same tokens {nocache['same_tokens']}/{nocache['questions']}"
            rows.append((f"KV reuse, {rounds} round{'s' if rounds > 1 else ''}",
                         f"{label}; replay, vs append + cache ({ref['prefilled'] if ref else '?'} tokens pre-filled, "
                         f"{ref['seconds']:.1f} s)" if ref else label,
                         "; ".join(parts) + free_txt, verdict.strip("; ")))
    return rows


def overhead_rows(r: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    for length, s in r["summary"].items():
        rows.append((
            f"loop overhead, {length}-token answers",
            f"`never` RIG vs one bare `model.generate` of the same tokens ({s['questions']} questions, "
            f"same tokens {s['same_tokens']}/{s['questions']})",
            f"wall {x(s['rig_vs_bare'])}; non-forward overhead {100 * s['loop_overhead_share']:+.1f}% of bare; "
            f"+{100 * s['extra_forward_share']:.1f}% forward passes",
            f"<= 5%: {goal(s['loop_overhead_share'] <= 0.05)}",
        ))
    st = r["stop_rule"]
    per = {name: s["per_round_ms"] for name, s in r["stages"].items()}
    stage_txt = "; ".join(
        f"{name}: decide {p['decide']:.1f}, query {p['query']:.1f}, inject {p['inject']:.1f}, trace {p['trace']:.1f}"
        for name, p in per.items())
    rows.append(("per-round stage cost", "ms per round, stages that are not the model or the retriever",
                 f"{stage_txt}; stop rule {st['per_token_us']:.0f} us per token "
                 f"({100 * st['share_of_forward']:.2f}% of a forward pass)", ""))
    return rows


def cost_rows(r: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    for key, run in r["runs"].items():
        s = run["summary"]
        shares = (", ".join(f"{k.replace('_', '-')} {100 * v:.0f}%" for k, v in s["over_floor_share"].items())
                  if s["over_floor_share"] else f"under {100 * r.get('noise', 0.05):.0f}% of it, not split")
        rows.append((f"RIG over its floor, {key}",
                     f"`rig:prob` per answer ({s['questions']} q, {s['retrievals']} retrievals) vs each prompt "
                     "token pre-filled once + the kept tokens decoded + the retrieval",
                     f"{x(s['rig_vs_floor'])} ({s['rig_s']:.1f} vs {s['floor_s']:.1f} s); over the floor: {shares}; "
                     f"pre-filled {x(s['prefilled_vs_floor'])} the floor's tokens, decoded "
                     f"{x(s['decoded_vs_kept'])} the kept; retrieval {100 * s['retrieval_share_of_floor']:.0f}% "
                     "of the floor",
                     f"<= {r['goal']}x: {goal(s['goal_met'])}"))
    return rows


def latency_rows(r: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    scope_names = {"2wikimultihopqa": "2Wiki", "musique": "MuSiQue", "all": "both sets"}
    for scope, table in r["summary"].items():
        if not table:
            continue
        n = r["done"].get(scope, sum(r["done"].values()))
        cells = "; ".join(f"{name} {s['p50_s']:.1f} / {s['p95_s']:.1f} s, {s['model_calls']:.1f} calls, "
                          f"{s['forward_passes']:.0f} passes" for name, s in table.items())
        rows.append((f"latency, {scope_names.get(scope, scope)}",
                     f"p50 / p95 per answer, model calls, forward passes ({n} test questions"
                     f"{', budget-limited' if r['stopped_by_budget'] else ''}"
                     f"{', from the `rigkit eval` test-split runs' if r.get('from_eval') else ''})", cells, ""))
    allsets = r["summary"].get("all", {})
    openrig = ", ".join(f"{k} {v['ratio']:.2f}x" for k, v in r["openrig"].items())
    ratios = "; ".join(f"{name} {x(s['vs_rag_p50'])} p50, {x(s['vs_rag_per_token'])} per token"
                       for name, s in allsets.items() if "vs_rag_p50" in s)
    met = [name for name, g in r["goal_rig_vs_rag_le_1_2"].items() if g["met"]]
    rows.append(("RIG / RAG", f"latency ratio, both sets (OpenRIG published: {openrig})", ratios,
                 f"<= 1.2x per token: met by {', '.join(met) if met else 'none'}"))
    return rows


def stages_rows(r: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, s in r["deciders"].items():
        cells = ", ".join(f"{k} {100 * v:.0f}%" for k, v in s["stages_share"].items())
        rows.append((f"stages, `{name}`", f"one answer of the demo question ({s['retrievals']} retrievals, "
                     f"{s['generated']} tokens)", f"{s['seconds']:.1f} s: {cells}", ""))
    return rows


def retrieval_rows(r: dict) -> list[tuple[str, str, str, str]]:
    b, d, h = r["bm25"], r["dense"], r["hybrid"]
    n = f"{r['chunks']:,} chunks"
    return [
        ("BM25", f"bm25s vs rank-bm25 query (median, {n})",
         f"{b['bm25s_query_ms']:.2f} ms vs {b['rank_bm25_query_ms']:.0f} ms: "
         f"**{b['rank_bm25_query_ms'] / b['bm25s_query_ms']:.0f}x**; identical top-10 {b['top10_identical_share']:.0%}", ""),
        ("faiss", f"exact (flat) vs HNSW / IVF query ({d['chunks']:,} vectors)",
         f"{d['flat']['query_ms']:.2f} ms vs {d['hnsw']['query_ms']:.2f} / {d['ivf']['query_ms']:.2f} ms: "
         f"**{d['flat']['query_ms'] / d['hnsw']['query_ms']:.0f}x / {d['flat']['query_ms'] / d['ivf']['query_ms']:.0f}x**; "
         f"recall@10 vs exact {d['hnsw']['recall@10_vs_exact']:.3f} / {d['ivf']['recall@10_vs_exact']:.3f}", ""),
        ("hybrid query", f"BM25 + dense + RRF, top 3 ({h['chunks']:,} chunks)",
         f"{h['hybrid_query_ms']:.1f} ms (query embedding {h['query_embedding_ms']:.1f} ms of it); "
         f"{h['hybrid_query_cached_vector_ms']:.1f} ms with the query vector cached "
         f"(**{h['hybrid_query_ms'] / h['hybrid_query_cached_vector_ms']:.1f}x**)", ""),
        ("index build", f"embedding vs everything else ({n})",
         f"{d['embedding_s']:.0f} s ({d['chunks_per_s']:.0f} chunks/s) vs "
         f"{b['tokenize_s'] + b['bm25s_index_s'] + d['flat']['build_s']:.1f} s: "
         f"**{r['ratios']['embedding / indexing build time']:.0f}x**", ""),
    ]


def startup_rows(r: dict) -> list[tuple[str, str, str, str]]:
    a, s, i = r["ask"], r["first_token"][-1], r["index_load"]
    ph = s["phases"]
    return [
        ("memory", "peak RSS of `rigkit ask` (default model, CPU profile)",
         f"{a['peak_rss_mib']:,} MiB ({a['wall_s']:.1f} s for the whole answer)", ""),
        ("start-up", "time to first token, second start (converted model cached)",
         f"{s['time_to_first_token_s']:.1f} s: imports {ph['imports_s']:.1f}, model {ph['model_load_s']:.1f}, "
         f"index {ph['index_open_s']:.1f}, first token {ph['first_token_s']:.1f}", ""),
        *([("start-up / floor", "the same start beside transformers alone loading the cached model and "
            "writing one token, fresh processes, one after the other",
            f"{s['time_to_first_token_s']:.1f} s vs {s['floor']['time_to_first_token_s']:.1f} s: "
            f"**x{s['over_floor']:.2f}**", "<= 1.5x")] if "floor" in s else []),
        ("`Index.load`", f"{i['chunks']:,}-chunk index",
         f"{1e3 * i['load_s']:.0f} ms; first hybrid query {i['first_query_s']:.1f} s (reads BM25 + faiss, "
         f"loads MiniLM), then {1e3 * i['second_query_s']:.0f} ms", ""),
    ]


def compression_rows(r: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, modes in r["sets"].items():
        cells = "; ".join(f"{mode} {x(s['passage_tokens_vs_none'])} passage tokens, {x(s['prefilled_vs_none'])} "
                          f"pre-fill, {x(s['time_vs_none'])} time ({s['compress_s']:.1f} s compressing)"
                          for mode, s in modes.items() if mode != "none")
        rows.append((f"compression, {name}", f"plain RAG top-{r['top_k']}, {r['questions_per_set']} test "
                     "questions, vs uncompressed passages", cells, ""))
    return rows


def serve_rows(r: dict) -> list[tuple[str, str, str, str]]:
    alone, load, first = r["alone"], r["load"], r.get("first_token")
    backend = "vLLM on this CPU (prefix cache emptied before each phase)" if r.get("vllm") else "in-process model"
    rows = []
    if first:
        rows.append(("serve, first token", f"streamed `/chat` beside `rigkit ask`'s loop in one process, one "
                     f"client, {first['questions']} demo questions, both warm, taking turns",
                     f"p50 {first['chat_p50']:.2f} s vs {first['ask_p50']:.2f} s: **x{first['chat_vs_ask']:.2f}**",
                     f"<= 1.2x: {goal(first['chat_vs_ask'] <= 1.2)}"))
    throughput = load["throughput"] / alone["throughput"]
    rows.append((f"serve, 1 vs {load['clients']} clients", f"`rigkit serve --workers {r['workers']}`, {backend}; "
                 f"{alone['answers']} vs {load['answers']} answers of {r['max_tokens']} tokens to "
                 f"{r.get('questions', 'demo')} questions",
                 f"{alone['throughput'] * 60:.1f} vs {load['throughput'] * 60:.1f} answers/min: "
                 f"**x{throughput:.2f}**; p50 x{load['p50'] / alone['p50']:.2f}; answers under load identical to "
                 f"alone {r['answers_identical']} of {r['questions_asked']} questions; nothing lost",
                 f">= 2.5x: {goal(throughput >= 2.5)}" if r.get("vllm") else ""))
    return rows


def eval_throughput_rows(r: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, row in r["sets"].items():
        a, b = row["in-process"], row["vllm"]
        rows.append((f"eval throughput, {name}", f"`rigkit eval --systems {r['systems']}` on the test split "
                     f"({a['answers']} answers), in-process (one loop) vs vLLM on this CPU "
                     f"(`--concurrency {r['concurrency']}`)",
                     f"{a['per_minute']:.1f} vs {b['per_minute']:.1f} questions/min: **x{row['ratio']:.2f}**; "
                     f"Cover EM {a['cover_em']:.3f} vs {b['cover_em']:.3f}; identical answers "
                     f"{row['identical']} of {row['answers']}", ""))
    return rows


ROWS = {"cache": cache_rows, "overhead": overhead_rows, "cost": cost_rows, "latency": latency_rows,
        "stages": stages_rows, "retrieval": retrieval_rows, "startup": startup_rows,
        "compression": compression_rows, "serve": serve_rows, "serve_vllm": serve_rows,
        "eval_throughput": eval_throughput_rows}


def render(found: dict[str, dict[str, Any]]) -> str:
    if not found:
        return "no results: run `make bench` (or `make bench-quick`) first"
    first = found[next(iter(found))]
    m = first["machine"]
    dates = sorted(r["machine"]["date"][:16].replace("T", " ") for r in found.values())
    loads = sorted(r["machine"]["load_average"][0] for r in found.values() if r["machine"].get("load_average"))
    lines = [
        f"{first['mode'].capitalize()}-mode runs of the `bench/` scripts on {m['cpu']}, {m['cores']} cores, "
        f"{m['memory_gb']} GB, Python {m['python']}, torch {m['torch']} ({m['torch_threads']} threads), "
        f"transformers {m['transformers']}; {dates[0]} to {dates[-1]} UTC"
        + (f"; 1-minute load average at the start of each part {loads[0]:.1f}-{loads[-1]:.1f}" if loads else "")
        + ". Ratios are measured side by side in one run; `python bench/report.py` prints this table.",
        "",
        "| part | measurement | result | goal |",
        "| --- | --- | --- | --- |",
    ]
    for name in PARTS:
        if name not in found:
            lines.append(f"| {name} | not run | `{COMMANDS.get(name, f'python bench/{name}.py')}` | |")
            continue
        try:
            rows = ROWS[name](found[name])
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
            rows = [(name, "results file in an older format", f"rerun `python bench/{name}.py` ({err!r})", "")]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="read bench/results/quick/")
    p.add_argument("--dir", type=Path, default=None)
    args = p.parse_args(argv)
    folder = args.dir or (RESULTS / "quick" if args.quick else RESULTS)
    print(render(load(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
