"""The loop's own cost: RIG with the `never` decider vs one bare `model.generate` of the same tokens.

With `never`, RIG writes the closed-book answer one sentence at a time: same prompt, same greedy
tokens, same end rule (end of turn or the answer's token limit) as a single `model.generate` call.
Wall-time differences are what the loop costs. Forward passes are counted and timed with torch
module hooks, so the run splits into the model's forward passes and everything else:

    loop overhead = (RIG wall - RIG forward time) - (bare wall - bare forward time)

i.e. what rigkit adds beyond the forward passes and beyond `generate`'s own per-token work,
reported as a share of the bare `generate` wall time (the goal: <= 5%). Forward passes the loop
makes beyond the bare `generate` are model work and are counted separately (there was one per
segment boundary until a stopped segment's look-ahead token was carried into the next call).

Then the per-round cost of each stage that is not the model, from `always` and `prob` runs with
retrieval (decide, query, inject, trace building = round total minus its stages), and micro
timings of the pieces inside a segment call: the stop rule's check after every token and the
per-token text split of a finished segment.

    python bench/overhead.py [--quick]
"""

from __future__ import annotations

import time
from typing import Any

from common import (
    CPU_CONFIG,
    ForwardMeter,
    demo_questions,
    fmt_ratio,
    median,
    parser,
    ratio,
    save,
    setup,
)

from rigkit.build import build_controller, build_generator, build_retriever
from rigkit.config import load_config
from rigkit.controller import STAGES


def rig_vs_bare(generator, retriever, question: str, answer_tokens: int, bare_first: bool = False) -> dict[str, Any]:
    """One question both ways: RIG with `never`, and one bare `generate` from the same prompt with
    the same end rule. `bare_first` swaps the order (callers alternate it, so drift in the
    machine's load does not favour one side)."""
    config = load_config(CPU_CONFIG, decider={"name": "never"},
                         generator={"max_answer_tokens": answer_tokens})
    controller = build_controller(config, generator, retriever)
    controller.context.start(question)
    prompt = generator.encode(controller.context.pieces())  # what the first round will read
    if bare_first:
        bare = _bare(generator, prompt, answer_tokens)
        rig = _rig(generator, controller, question)
    else:
        rig = _rig(generator, controller, question)
        bare = _bare(generator, prompt, answer_tokens)
    result = rig.pop("result")
    rig_ids = [t for r in result.rounds for t in r.segment.token_ids]
    stage = {k: result.timings.get(k, 0.0) for k in STAGES}
    return {
        "question": question, "answer_tokens": answer_tokens, "bare_first": bare_first,
        "generated": len(rig_ids), "segments": len(result.rounds),
        "same_tokens": rig_ids == bare.pop("ids"), **rig, **bare,
        "rig_stages": stage, "rig_other_s": rig["rig_s"] - sum(stage.values()),
        "_segments": [list(r.segment.token_ids) for r in result.rounds],  # for the micro timings
    }


def _rig(generator, controller, question: str) -> dict[str, Any]:
    with ForwardMeter(generator.model) as meter:
        start = time.perf_counter()
        result = controller.run(question)
        seconds = time.perf_counter() - start
    calls, fwd_s, fwd_tokens = meter.snapshot()
    return {"result": result, "rig_s": seconds, "rig_forward_passes": calls, "rig_forward_s": fwd_s,
            "rig_forward_tokens": fwd_tokens}


def _bare(generator, prompt: list[int], answer_tokens: int) -> dict[str, Any]:
    import torch

    eos = generator.eos_token_ids
    with ForwardMeter(generator.model) as meter, torch.no_grad():
        start = time.perf_counter()
        out = generator.model.generate(
            input_ids=torch.tensor([prompt], device=generator.device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=generator.device),
            max_new_tokens=answer_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
            eos_token_id=eos, pad_token_id=eos[0],
        )
        seconds = time.perf_counter() - start
    calls, fwd_s, fwd_tokens = meter.snapshot()
    return {"ids": [t for t in out[0, len(prompt):].tolist() if t not in eos], "bare_s": seconds,
            "bare_forward_passes": calls, "bare_forward_s": fwd_s, "bare_forward_tokens": fwd_tokens}


def stage_costs(generator, retriever, questions: list[str], deciders: list[str]) -> dict[str, Any]:
    """Per-round seconds of decide / query / retrieve / inject / trace building, from real runs."""
    out = {}
    for name in deciders:
        rounds = 0
        totals = dict.fromkeys([*STAGES, "trace"], 0.0)
        wall = 0.0
        for question in questions:
            config = load_config(CPU_CONFIG, controller={"policy": "continue"} if name == "always" else {})
            config = config.with_decider(name)  # another decider starts from its own defaults
            result = build_controller(config, generator, retriever).run(question)
            rounds += len(result.rounds)
            for k in STAGES:
                totals[k] += result.timings.get(k, 0.0)
            totals["trace"] += result.timings["total"] - sum(result.timings.get(k, 0.0) for k in STAGES)
            wall += result.timings["total"]
        out[name] = {
            "rounds": rounds, "wall_s": wall,
            "per_round_ms": {k: 1e3 * v / rounds for k, v in totals.items()},
            "share_of_wall": {k: v / wall for k, v in totals.items()},
        }
    return out


def stop_rule_cost(generator, samples: list[list[int]], prompt_len: int = 64) -> dict[str, Any]:
    """Seconds the stop rule spends per generated token, called as `generate` calls it (after
    every token, on the whole sequence so far), and the per-token text split of a segment."""
    import torch

    from rigkit.generation.hf import StopOnText, token_texts
    from rigkit.transcript import StopRule

    checks, steps, split_s, segments = 0.0, 0, 0.0, 0
    for ids in samples:
        seq = torch.tensor([[0] * prompt_len + ids])
        criterion = StopOnText(generator.tokenizer, prompt_len, StopRule(sentence=True))
        start = time.perf_counter()
        for n in range(1, len(ids) + 1):
            criterion(seq[:, : prompt_len + n], None)
        checks += time.perf_counter() - start
        steps += len(ids)
        start = time.perf_counter()
        token_texts(generator.tokenizer, ids)
        split_s += time.perf_counter() - start
        segments += 1
    return {"per_token_us": 1e6 * checks / max(1, steps), "tokens": steps,
            "segment_split_ms": 1e3 * split_s / max(1, segments), "segments": segments}


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--questions", type=int, default=None)
    args = p.parse_args(argv)
    setup(args)
    started = time.perf_counter()
    generator = build_generator()
    retriever = build_retriever(load_config(CPU_CONFIG).retrieval)
    questions = demo_questions(args.questions or (1 if args.quick else 4))
    lengths = [48] if args.quick else [96, 256]
    # warm-up: the model, the embedder and the index load before anything is timed
    rig_vs_bare(generator, retriever, questions[0], 8)
    retriever.search(questions[0], 2)
    pairs = []
    for length in lengths:
        for question in questions if length <= 96 else questions[:1]:
            row = rig_vs_bare(generator, retriever, question, length, bare_first=len(pairs) % 2 == 1)
            pairs.append(row)
            print(f"{length:4d} tokens  RIG {row['rig_s']:6.2f}s ({row['rig_forward_passes']} passes, "
                  f"{row['segments']} segments)  bare {row['bare_s']:6.2f}s ({row['bare_forward_passes']} "
                  f"passes)  same tokens {row['same_tokens']}", flush=True)
    summary = {}
    for length in lengths:
        rows = [r for r in pairs if r["answer_tokens"] == length]
        rig = sum(r["rig_s"] for r in rows)
        bare = sum(r["bare_s"] for r in rows)
        rig_non_fwd = sum(r["rig_s"] - r["rig_forward_s"] for r in rows)
        bare_non_fwd = sum(r["bare_s"] - r["bare_forward_s"] for r in rows)
        rig_passes = sum(r["rig_forward_passes"] for r in rows)
        bare_passes = sum(r["bare_forward_passes"] for r in rows)
        per_pass = sum(r["bare_forward_s"] for r in rows) / max(1, bare_passes)
        summary[str(length)] = {
            "questions": len(rows), "generated": sum(r["generated"] for r in rows),
            "segments": sum(r["segments"] for r in rows),
            "same_tokens": sum(r["same_tokens"] for r in rows),
            "rig_s": rig, "bare_s": bare, "rig_vs_bare": ratio(rig, bare),
            "loop_overhead_s": rig_non_fwd - bare_non_fwd,
            "loop_overhead_share": ratio(rig_non_fwd - bare_non_fwd, bare),
            "extra_forward_passes": rig_passes - bare_passes,
            "extra_forward_share": ratio(rig_passes - bare_passes, bare_passes),
            "extra_forward_s_est": (rig_passes - bare_passes) * per_pass,
            "rig_non_forward_s": rig_non_fwd, "bare_non_forward_s": bare_non_fwd,
            # the stricter reading: all of RIG's time outside forward passes, generate's own included
            "rig_non_forward_share": ratio(rig_non_fwd, bare),
            "trace_and_stages_s": sum(r["rig_other_s"] + r["rig_stages"]["decide"] for r in rows),
        }
    print("\nnever-decider RIG vs one bare model.generate of the same tokens:")
    for length, s in summary.items():
        print(f"  {length:>3s}-token answers, {s['questions']} question(s), {s['generated']} tokens in "
              f"{s['segments']} segments, same tokens {s['same_tokens']}/{s['questions']}")
        print(f"     wall RIG / bare                 {fmt_ratio(s['rig_vs_bare'])}  "
              f"({s['rig_s']:.2f} s vs {s['bare_s']:.2f} s)")
        print(f"     loop overhead (non-forward)     {100 * s['loop_overhead_share']:+.1f}% of bare "
              f"({s['loop_overhead_s']:+.3f} s)  goal <= 5%")
        print(f"     all non-forward time of RIG     {100 * s['rig_non_forward_share']:.1f}% of bare "
              f"(bare generate's own: {100 * ratio(s['bare_non_forward_s'], s['bare_s']):.1f}%)")
        print(f"     extra forward passes            {s['extra_forward_passes']} "
              f"(+{100 * s['extra_forward_share']:.1f}%, ~{s['extra_forward_s_est']:.2f} s)")
    stage_qs = questions[: 1 if args.quick else 2]
    stages = stage_costs(generator, retriever, stage_qs, ["always"] if args.quick else ["always", "prob", "entropy"])
    print("\nper-round cost of the stages that are not the model (ms per round; share of wall):")
    for name, s in stages.items():
        parts = "  ".join(f"{k} {s['per_round_ms'][k]:.2f} ({100 * s['share_of_wall'][k]:.1f}%)"
                          for k in ("decide", "query", "retrieve", "inject", "trace"))
        print(f"  {name:8s} {s['rounds']:3d} rounds  {parts}")
    samples = [ids for r in pairs for ids in r.pop("_segments") if ids]
    stop = stop_rule_cost(generator, samples)
    per_token_fwd = median([r["bare_forward_s"] / max(1, r["bare_forward_passes"]) for r in pairs])
    stop["share_of_forward"] = ratio(stop["per_token_us"] * 1e-6, per_token_fwd)
    print(f"\nstop rule: {stop['per_token_us']:.1f} us per generated token "
          f"({100 * stop['share_of_forward']:.2f}% of one forward pass, {per_token_fwd * 1e3:.1f} ms); "
          f"per-token text split of a segment {stop['segment_split_ms']:.2f} ms")
    goal = {s_len: {"share": s["loop_overhead_share"], "met": s["loop_overhead_share"] <= 0.05}
            for s_len, s in summary.items()}
    save(args, "overhead", {"pairs": pairs, "summary": summary, "stages": stages, "stop_rule": stop,
                            "goal_loop_overhead_le_5pct": goal,
                            "model": {"spec": generator.spec, "source": generator.source}}, started)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
