"""KV-cache reuse against retrieval rounds: append layout vs no cache vs the prefix layout.

The same questions at 1, 3 and 5 retrieval rounds, with the `always` decider and the `continue`
policy (every segment retrieves and is kept, so the rounds are spread over the answer), four ways:

    append + cache     rigkit's default: every round only appends, the cache is kept
    append, no cache   the same prompts, each call pre-fills everything (answers must be identical)
    prefix + cache     passages rebuilt in front of the question (FLARE/DRAGIN layout); the cache
                       still reuses the longest common prefix (system prompt, earlier passages)
    prefix, no cache   FLARE/DRAGIN as published: the whole prompt re-encoded at every call

Two modes, both reported:
    free     a way writes its own answer (the layouts read different contexts, so answers and
             their lengths differ): append + cache, append without cache, prefix + cache
    replay   the append + cache run's tokens and retrievals are forced through the prefix ways
             (bench/replay.py: real forward passes through the real cache), so pre-filled
             tokens and seconds compare like with like; the cache-off append run needs no replay
             (it reads the reference's prompts and must write its tokens)

Two profiles: `cpu` (configs/cpu.yaml: 1024 passage tokens, top-k 2, 96-token answers; the demo
questions and corpus; 1, 3 and 5 rounds) and `default` (the library defaults: 4096 passage
tokens, top-k 3, 256-token answers; a 2WikiMultihopQA test question over its paragraphs; 5 rounds).

    python bench/cache.py            # full: cpu profile 2 questions at 1/3/5 rounds, default 1 at 5
    python bench/cache.py --quick    # one question, 3 rounds, 64-token answers, cpu profile
"""

from __future__ import annotations

import time
from typing import Any

from common import (
    CPU_CONFIG,
    demo_questions,
    fmt_ratio,
    out_dir,
    parser,
    plot,
    ratio,
    save,
    set_retriever,
    setup,
    test_questions,
)
from replay import same_run, scripted_generator

from rigkit.build import build_controller, build_generator, build_retriever
from rigkit.config import load_config

WAYS = {  # name -> (layout, use_cache)
    "append + cache": ("append", True),
    "append, no cache": ("append", False),
    "prefix + cache": ("prefix", True),
    "prefix, no cache": ("prefix", False),
}
REFERENCE = "append + cache"


def profile_config(profile: str, layout: str, use_cache: bool, rounds: int, answer_tokens: int | None):
    overrides: dict[str, Any] = {
        "decider": {"name": "always"},
        "controller": {"max_rounds": rounds, "policy": "continue"},
        "context": {"layout": layout},
        "generator": {"use_cache": use_cache, "max_answer_tokens": answer_tokens},
    }
    return load_config(CPU_CONFIG if profile == "cpu" else None, **overrides)


def run_way(base, retriever, config, question: str, script=None):
    """One answer; returns (result, seconds, the recorded generate calls)."""
    generator, model = scripted_generator(base, use_cache=config.generator.use_cache, script=script)
    controller = build_controller(config, generator, retriever)
    start = time.perf_counter()
    result = controller.run(question)
    return result, time.perf_counter() - start, model.calls


def measure(profile: str, questions: list[str], rounds_list: list[int], ways: list[str],
            replay_ways: list[str], answer_tokens: int | None, base, retriever) -> dict[str, Any]:
    rows = []
    for rounds in rounds_list:
        for qi, question in enumerate(questions):
            configs = {w: profile_config(profile, WAYS[w][0], WAYS[w][1], rounds, answer_tokens) for w in WAYS}
            ref, ref_s, script = run_way(base, retriever, configs[REFERENCE], question)
            ref_ids = [r.segment.token_ids for r in ref.rounds]
            for way in WAYS:
                runs = {}
                if way == REFERENCE:
                    runs = {"free": (ref, ref_s), "replay": (ref, ref_s)}
                if way != REFERENCE and way in ways:
                    runs["free"] = run_way(base, retriever, configs[way], question)[:2]
                if way != REFERENCE and way in replay_ways:
                    runs["replay"] = run_way(base, retriever, configs[way], question, script)[:2]
                for mode, (result, seconds) in runs.items():
                    row = {
                        "profile": profile, "rounds": rounds, "question": qi, "way": way, "mode": mode,
                        "prefilled": result.tokens["prefilled"], "reused": result.tokens["reused"],
                        "generated": result.tokens["generated"], "retrievals": result.used_retrieval_times,
                        "segments": len(result.rounds), "seconds": seconds,
                        "same_answer": result.answer == ref.answer,
                        "same_tokens": [r.segment.token_ids for r in result.rounds] == ref_ids,
                    }
                    if mode == "replay":
                        row["faithful"] = same_run(result, ref)
                    rows.append(row)
                    print(f"{profile:7s} R={rounds} q{qi} {way:17s} {mode:6s} pre-filled {row['prefilled']:6d}"
                          f"  reused {row['reused']:6d}  generated {row['generated']:4d}  retrievals "
                          f"{row['retrievals']}  {seconds:6.1f}s  same answer {row['same_answer']}", flush=True)
    return {"rows": rows, "summary": summarize(rows, profile, rounds_list, list(WAYS))}


def summarize(rows: list[dict], profile: str, rounds_list: list[int], ways: list[str]) -> list[dict]:
    """Totals per (rounds, way, mode) over the questions, with ratios against append + cache."""
    out = []
    for rounds in rounds_list:
        for mode in ("free", "replay"):
            group = [r for r in rows if r["rounds"] == rounds and r["mode"] == mode]
            ref = [r for r in group if r["way"] == REFERENCE]
            base_pre = sum(r["prefilled"] for r in ref)
            base_s = sum(r["seconds"] for r in ref)
            for way in ways:
                mine = [r for r in group if r["way"] == way]
                if not mine:
                    continue
                entry = {
                    "profile": profile, "rounds": rounds, "mode": mode, "way": way,
                    "questions": len(mine),
                    "prefilled": sum(r["prefilled"] for r in mine),
                    "reused": sum(r["reused"] for r in mine),
                    "generated": sum(r["generated"] for r in mine),
                    "retrievals": sum(r["retrievals"] for r in mine),
                    "seconds": sum(r["seconds"] for r in mine),
                    "same_answer": sum(r["same_answer"] for r in mine),
                    "same_tokens": sum(r["same_tokens"] for r in mine),
                }
                entry["prefill_vs_append"] = ratio(entry["prefilled"], base_pre)
                entry["time_vs_append"] = ratio(entry["seconds"], base_s)
                if mode == "replay":
                    entry["faithful"] = sum(r.get("faithful", False) for r in mine)
                out.append(entry)
    return out


def print_summary(summary: list[dict]) -> None:
    print("\nratios against append + cache (higher = more work), per rounds and mode:")
    print(f"{'profile':8s}{'R':>2s}  {'mode':6s} {'way':17s} {'pre-filled':>10s} {'reused':>8s} "
          f"{'gen':>5s} {'seconds':>8s} {'pre-fill':>9s} {'time':>7s}  same tokens / answer text")
    for e in summary:
        extra = f"  (replay faithful {e['faithful']}/{e['questions']})" if "faithful" in e else ""
        print(f"{e['profile']:8s}{e['rounds']:>2d}  {e['mode']:6s} {e['way']:17s} {e['prefilled']:10d} "
              f"{e['reused']:8d} {e['generated']:5d} {e['seconds']:8.1f} {fmt_ratio(e['prefill_vs_append']):>9s} "
              f"{fmt_ratio(e['time_vs_append']):>7s}  {e['same_tokens']}/{e['questions']} / "
              f"{e['same_answer']}/{e['questions']}{extra}")


def goals(summary: list[dict]) -> dict[str, Any]:
    """The issue's goals, read off this run: append pre-fills >= 3x fewer than prefix at 5 rounds,
    >= 2x at 3; cache on/off identical."""
    def get(profile, rounds, mode, way):
        return next((e for e in summary if (e["profile"], e["rounds"], e["mode"], e["way"]) ==
                     (profile, rounds, mode, way)), None)

    out: dict[str, Any] = {}
    for profile in sorted({e["profile"] for e in summary}):
        for rounds, want in ((5, 3.0), (3, 2.0)):
            for way in ("prefix + cache", "prefix, no cache"):
                e = get(profile, rounds, "replay", way)
                if e:
                    out[f"{profile} R={rounds} replay: {way} / append pre-fill (goal >= {want:.0f}x)"] = {
                        "ratio": e["prefill_vs_append"], "met": e["prefill_vs_append"] >= want}
        for e in summary:
            if e["profile"] == profile and e["way"] == "append, no cache" and e["mode"] == "free":
                out[f"{profile} R={e['rounds']}: cache on/off identical answers"] = {
                    "ratio": e["same_tokens"] / e["questions"], "met": e["same_tokens"] == e["questions"]}
    return out


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--profiles", default=None, help="comma-separated: cpu,default")
    p.add_argument("--rounds", default=None, help="comma-separated retrieval rounds, e.g. 1,3,5")
    p.add_argument("--questions", type=int, default=None, help="questions per profile")
    p.add_argument("--answer-tokens", type=int, default=None,
                   help="the answer's token limit (default: the profile's; quick: 64)")
    args = p.parse_args(argv)
    setup(args)
    started = time.perf_counter()
    profiles = (args.profiles or ("cpu" if args.quick else "cpu,default")).split(",")
    rounds_list = [int(r) for r in (args.rounds or ("3" if args.quick else "1,3,5")).split(",")]
    # 256-token answers over thousands of passage tokens cost minutes per cache-off run on two
    # cores: the default profile is measured where the strictest goal is set, at 5 rounds
    default_rounds = [max(rounds_list)]
    base = build_generator()
    results: dict[str, Any] = {"profiles": {}}
    for profile in profiles:
        if profile == "cpu":
            n = args.questions or (1 if args.quick else 2)
            questions = demo_questions(n)
            retriever = build_retriever(load_config(CPU_CONFIG).retrieval)
            # The cache-off append run reads the same prompts as the reference: its free run is
            # its replay (and must write the same tokens), so only the prefix ways are replayed.
            # Re-encoding is replayed only: its free run would add a second divergent answer and
            # the costliest run of all, while prefix + cache already shows how free answers drift.
            ways = [REFERENCE, "append, no cache", "prefix + cache"]
            replay_ways = ["prefix + cache", "prefix, no cache"]
            answer_tokens = args.answer_tokens or (64 if args.quick else None)
        elif profile == "default":
            n = args.questions or 1
            questions = [q.question for q in test_questions("2wikimultihopqa", n)]
            retriever = set_retriever("2wikimultihopqa")
            # Without a cache every call re-fills thousands of tokens: at 256-token answers a
            # cache-off run costs minutes, so the default profile compares the prefix ways in
            # replay only, and cache on/off identity is checked on the cpu profile.
            ways = [REFERENCE, "prefix + cache"]
            replay_ways = ["prefix + cache", "prefix, no cache"]
            answer_tokens = args.answer_tokens
        else:
            raise SystemExit(f"unknown profile {profile!r}; choose cpu or default")
        # Warm-up: the model, the embedder and the index load before anything is timed.
        run_way(base, retriever, profile_config(profile, "append", True, 1, 8), questions[0])
        rounds_here = default_rounds if profile == "default" else rounds_list
        print(f"\nprofile {profile}: {len(questions)} question(s), rounds {rounds_here}", flush=True)
        results["profiles"][profile] = measure(profile, questions, rounds_here, ways, replay_ways,
                                               answer_tokens, base, retriever)
        used = profile_config(profile, "append", True, 1, answer_tokens)
        results["profiles"][profile]["setting"] = {
            "questions": "demo" if profile == "cpu" else "2wikimultihopqa test", "n": len(questions),
            "max_retrieval_tokens": used.context.max_retrieval_tokens, "top_k": used.retrieval.top_k,
            "max_answer_tokens": used.generator.max_answer_tokens,
        }
    summary = [e for prof in results["profiles"].values() for e in prof["summary"]]
    print_summary(summary)
    results["goals"] = goals(summary)
    print("\ngoals:")
    for name, g in results["goals"].items():
        print(f"  {'met ' if g['met'] else 'MISS'} {name}: {g['ratio']:.2f}")
    results["model"] = {"spec": base.spec, "source": base.source}
    folder = out_dir(args)
    panels = []
    for profile in profiles:
        for metric, label in (("prefilled", "pre-filled tokens"), ("seconds", "seconds")):
            series = {}
            for way in WAYS:
                mine = [e for e in summary if e["profile"] == profile and e["way"] == way]
                mode = "replay" if any(e["mode"] == "replay" for e in mine) else "free"  # cache off: same tokens
                pts = [(e["rounds"], e[metric]) for e in mine if e["mode"] == mode]
                if pts:
                    series[way] = ([x for x, _ in pts], [y for _, y in pts])
            panels.append({"title": f"{profile}: {label} (replay)", "x": "retrieval rounds", "y": label,
                           "series": series})
    note = plot(folder / "cache.png", "KV-cache reuse vs retrieval rounds", panels)
    print(note)
    results["plot"] = note
    save(args, "cache", results, started)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

