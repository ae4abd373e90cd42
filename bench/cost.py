"""RIG's time per answer over a floor, and where the rest goes.

The floor is what any system must pay to read what one RIG answer read and write what it kept:
every prompt token pre-filled once (system, question and every passage the run saw, in one
forward pass), the kept answer tokens decoded one at a time through the KV cache, and the
retrieval the run did. It is measured, not modelled: after each RIG answer, the same model runs
that prompt in one pass and then is fed the kept tokens one by one.

RIG's own forward passes are timed with torch hooks (`ForwardMeter`) and split by their width: passes over more
than one token are pre-fill, one-token passes are decoding. Over the floor:

    re-prefill   RIG's pre-fill seconds - the floor's (prompts read again after a retrieval,
                 rewrite prompts, the append layout's passages after the answer so far)
    discarded    RIG's decoding seconds - the floor's (tokens written and then not kept: taken
                 back before a retrieval, rewritten, cut as a repeat)
    loop         what is neither a forward pass nor retrieval: decider, query, injection,
                 generate's per-token work, traces
    retrieval    the same seconds in both; it is not overlapped with decoding, so it is also
                 what overlapping could save at most (shown as its share of the floor)

Runs `rig:prob` (configs/cpu.yaml, the in-process default model) on the stored test split of both
shipped multi-hop sets, three ways: `append` (the default), `prefix` (passages rebuilt before the
question, the FLARE way) and `pause` (append, the segment ending at the first flagged word,
`controller.pause_at_flag`: DRAGIN's way of not writing the rest of a sentence that is rewritten) and
`rewind` (prefix layout, paused at the flagged word, `controller.policy: rewind`: the words before
it are kept and the model writes on from them, so only the flagged word is written twice):

    python bench/cost.py [--quick] [--questions N] [--ways append,prefix,pause,rewind]
"""

from __future__ import annotations

import time
from typing import Any

from common import (
    CPU_CONFIG,
    SETS,
    ForwardMeter,
    demo_questions,
    fmt_ratio,
    parser,
    ratio,
    save,
    set_retriever,
    setup,
    test_questions,
)

from rigkit.build import build_context, build_controller, build_generator, build_retriever
from rigkit.config import load_config

GOAL = 1.3  # RIG's time per answer over the floor
NOISE = 0.05  # an excess over the floor below this share of it is not split into parts
WAYS = {  # name -> config sections over configs/cpu.yaml
    "append": {},
    "prefix": {"context": {"layout": "prefix"}},
    "pause": {"controller": {"pause_at_flag": True}},
    "rewind": {"context": {"layout": "prefix"}, "controller": {"pause_at_flag": True, "policy": "rewind"}},
}


def rig_answer(generator, controller, question: str) -> dict[str, Any]:
    """One RIG answer, its wall time split by forward-pass width, and what the floor must read."""
    with ForwardMeter(generator.model) as meter:
        start = time.perf_counter()
        result = controller.run(question)
        wall = time.perf_counter() - start
    context = controller.context
    kept = generator.tokenizer(context.draft, add_special_tokens=False).input_ids
    return {
        "result": result, "seen": list(context.seen_passages), "kept_ids": kept,
        "rig_s": wall, "prefill_s": meter.prefill_s, "decode_s": meter.decode_s,
        "prefilled": meter.prefill_tokens, "decoded": meter.decode_tokens,
        "retrieve_s": result.timings.get("retrieve", 0.0), "retrievals": result.used_retrieval_times,
    }


def floor_answer(generator, config, question: str, seen: list, kept_ids: list[int]) -> dict[str, Any]:
    """The floor's model work: one pass over system + question + every passage seen, then the kept
    tokens fed one at a time through the cache (each step's next-token choice made, as decoding does)."""
    import torch

    context = build_context(config.context, generator)
    context.start(question, passages=seen)
    prompt = generator.encode(context.pieces())
    model = generator.model
    with torch.no_grad():
        start = time.perf_counter()
        out = model(input_ids=torch.tensor([prompt], device=generator.device), use_cache=True)
        out.logits[0, -1].argmax().item()
        prefill = time.perf_counter() - start
        past = out.past_key_values
        start = time.perf_counter()
        for token in kept_ids:
            out = model(input_ids=torch.tensor([[token]], device=generator.device), past_key_values=past,
                        use_cache=True)
            past = out.past_key_values
            out.logits[0, -1].argmax().item()
        decode = time.perf_counter() - start
    return {"floor_prefill_s": prefill, "floor_decode_s": decode, "floor_prompt_tokens": len(prompt),
            "floor_passages": len(context.passages), "seen_passages": len(seen)}


def one_question(generator, retriever, config, question: str) -> dict[str, Any]:
    """RIG and then its floor on one question (the floor needs what RIG read and kept)."""
    rig = rig_answer(generator, build_controller(config, generator, retriever), question)
    floor = floor_answer(generator, config, question, rig.pop("seen"), rig["kept_ids"])
    result = rig.pop("result")
    kept = len(rig.pop("kept_ids"))
    floor_s = floor["floor_prefill_s"] + floor["floor_decode_s"] + rig["retrieve_s"]
    forward = rig["prefill_s"] + rig["decode_s"]
    return {
        "question": question, "kept_tokens": kept, "generated": result.tokens["generated"], **rig, **floor,
        "floor_s": floor_s,
        "re_prefill_s": rig["prefill_s"] - floor["floor_prefill_s"],
        "discarded_s": rig["decode_s"] - floor["floor_decode_s"],
        "loop_s": rig["rig_s"] - forward - rig["retrieve_s"],
        "rig_vs_floor": ratio(rig["rig_s"], floor_s),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over questions: the ratio of summed times (a question's weight is its length)."""
    total = {k: sum(r[k] for r in rows) for k in (
        "rig_s", "floor_s", "re_prefill_s", "discarded_s", "loop_s", "retrieve_s", "prefill_s", "decode_s",
        "floor_prefill_s", "floor_decode_s", "prefilled", "floor_prompt_tokens", "decoded", "kept_tokens",
        "retrievals")}
    over = total["rig_s"] - total["floor_s"]
    return {
        "questions": len(rows), **total, "rig_vs_floor": ratio(total["rig_s"], total["floor_s"]),
        "goal_met": ratio(total["rig_s"], total["floor_s"]) <= GOAL,
        "over_floor_s": over,
        # RIG below or within 5% above its floor: shares of a near-zero or negative excess mean nothing
        "over_floor_share": ({k: ratio(total[f"{k}_s"], over) for k in ("re_prefill", "discarded", "loop")}
                             if over > NOISE * total["floor_s"] else None),
        "retrieval_share_of_floor": ratio(total["retrieve_s"], total["floor_s"]),
        "prefilled_vs_floor": ratio(total["prefilled"], total["floor_prompt_tokens"]),
        "decoded_vs_kept": ratio(total["decoded"], total["kept_tokens"]),
        "per_question_ratio": sorted(r["rig_vs_floor"] for r in rows),
    }


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--questions", type=int, default=None, help="per set (default 10; quick: 1 demo question)")
    p.add_argument("--ways", default=None, help="of: " + ", ".join(WAYS) + " (default: all; quick: append,rewind)")
    args = p.parse_args(argv)
    args.ways = args.ways or ("append,rewind" if args.quick else ",".join(WAYS))
    setup(args)
    started = time.perf_counter()
    generator = build_generator()
    ways = args.ways.split(",")
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        p.error(f"unknown way(s) {', '.join(unknown)}; known: {', '.join(WAYS)}")
    if args.quick:
        sets = {"demo": (build_retriever(load_config(CPU_CONFIG).retrieval), demo_questions(1), {})}
    else:
        n = args.questions or 10
        sets = {name: (set_retriever(name, load_config(CPU_CONFIG)), [q.question for q in test_questions(name, n)],
                       {"retrieval": {"corpus": f"data/{name}/corpus.jsonl"}}) for name in SETS}
    runs: dict[str, dict[str, Any]] = {}
    for name, (retriever, questions, overrides) in sets.items():
        one_question(generator, retriever, load_config(CPU_CONFIG, **overrides), questions[0])  # warm-up: model, index, embedder
        for way in ways:
            config = load_config(CPU_CONFIG, **WAYS[way], **overrides)
            rows = []
            for i, question in enumerate(questions):
                row = one_question(generator, retriever, config, question)
                rows.append(row)
                print(f"{name:16s} {way:7s} q{i:<2d} RIG {row['rig_s']:6.2f}s  floor {row['floor_s']:6.2f}s  "
                      f"{fmt_ratio(row['rig_vs_floor'])}  ({row['retrievals']} retrievals, {row['prefilled']} "
                      f"pre-filled vs {row['floor_prompt_tokens']}, {row['decoded']} decoded vs "
                      f"{row['kept_tokens']} kept)", flush=True)
            runs[f"{name}/{way}"] = {"summary": summarise(rows), "rows": rows}
    print(f"\nrig:prob (configs/cpu.yaml) over the floor, per answer (goal <= {GOAL}x):")
    for key, run in runs.items():
        s = run["summary"]
        shares = (", ".join(f"{k} {100 * v:.0f}%" for k, v in s["over_floor_share"].items())
                  if s["over_floor_share"] else f"under {100 * NOISE:.0f}% of it, not split")
        print(f"  {key:24s} {fmt_ratio(s['rig_vs_floor'])}  ({s['rig_s']:.1f} s vs {s['floor_s']:.1f} s, "
              f"{s['questions']} q, {s['retrievals']} retrievals); over the floor: {shares}; "
              f"pre-filled {fmt_ratio(s['prefilled_vs_floor'])} the floor's tokens, decoded "
              f"{fmt_ratio(s['decoded_vs_kept'])} the kept; retrieval {100 * s['retrieval_share_of_floor']:.0f}% "
              f"of the floor")
    save(args, "cost", {"goal": GOAL, "noise": NOISE, "runs": runs, "ways": {w: WAYS[w] for w in ways}}, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
