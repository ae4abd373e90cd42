"""In-process decode speed of an offline Qwen model against llama.cpp on the same GGUF, in one run.

Three ways decode the same chat prompt greedily on the same threads:
    llama.cpp   llama-cpp-python's `Llama` on the installed GGUF (Q4 weights in place)
    fp32        rigkit's in-process backend, the GGUF converted to float32 (`--quantize none`)
    int8        the same with the Linear layers' weights in int8 (`--quantize int8`)
Decode speed is (tokens - 1) / (time of the last token - time of the first): prefill is left out.
Prints tokens/s and each in-process way's ratio to llama.cpp (goal: int8 >= 0.6x).

`--agree N` then answers the first N questions of MuSiQue's test split with their gold paragraphs
before the question, greedy, in fp32 and in int8, and prints how many answers are identical.

    python bench/qwen_speed.py                     # 0.5B, 64 tokens, 1 thread
    python bench/qwen_speed.py --agree 10          # plus the int8 / fp32 agreement check
    python bench/qwen_speed.py --quick             # 16 tokens
Needs the model installed (`rigkit models install qwen2.5-coder-0.5b-instruct`) and llama-cpp-python
(the dev extra).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from common import ROOT, parser, save, setup

PROMPT = ("Explain, step by step, what the Apache-2.0 licence requires when you ship software that "
          "includes code under it, and what it allows you to do with that code.")


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--tokens", type=int, default=None, help="tokens to decode (default 64; quick: 16)")
    p.add_argument("--agree", type=int, default=0, metavar="N",
                   help="also compare int8 with fp32 answers on the first N MuSiQue test questions")
    args = p.parse_args(argv)
    args.threads = args.threads or 1  # llama.cpp and torch on the same number of threads
    setup(args)
    started = time.perf_counter()
    import torch

    from rigkit.build import build_generator
    from rigkit.config import GeneratorConfig
    from rigkit.models.install import installed_path
    from rigkit.models.registry import get

    model = get(args.model)
    gguf = installed_path(model)
    if gguf is None:
        raise SystemExit(f"{model.name} is not installed; install it with: {model.install_command}")
    n = args.tokens or (16 if args.quick else 64)
    fp32 = build_generator(GeneratorConfig(model=model.name, device="cpu", dtype="float32"))
    int8 = build_generator(GeneratorConfig(model=model.name, device="cpu", dtype="float32", quantize="int8"))
    text = fp32.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                              add_generation_prompt=True)
    rates = {"llama.cpp": _llama_rate(gguf, text, n, args.threads)}
    for name, gen in (("fp32", fp32), ("int8", int8)):
        rates[name] = _torch_rate(gen, text, n)
    base = rates["llama.cpp"]["tokens_per_s"]
    print(f"\n{model.name}, {n} tokens greedy, {args.threads} thread(s), torch {torch.__version__}")
    print(f"{'way':<10} {'tokens':>6} {'tokens/s':>9} {'vs llama.cpp':>13}")
    for name, r in rates.items():
        r["vs_llama_cpp"] = round(r["tokens_per_s"] / base, 3)
        print(f"{name:<10} {r['tokens']:>6} {r['tokens_per_s']:>9.2f} {r['vs_llama_cpp']:>12.2f}x")
    payload = {"model": model.name, "tokens": n, "threads": args.threads, "rates": rates}
    if args.agree:
        payload["agreement"] = _agreement(fp32, int8, args.agree)
    save(args, "qwen_speed", payload, started)
    return 0


def _llama_rate(gguf: Path, text: str, n: int, threads: int) -> dict:
    from llama_cpp import Llama

    from rigkit.models.llama_server import without_repacking

    without_repacking()  # llama.cpp's AMX repacking crashes on this CPU (see rigkit.models.llama_server)
    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, verbose=False)
    times = [time.perf_counter()
             for chunk in llm.create_completion(text, max_tokens=n, temperature=0.0, stream=True)
             if chunk["choices"][0].get("finish_reason") is None]  # the closing chunk carries no token
    return _rate(times)


def _torch_rate(gen, text: str, n: int) -> dict:
    import torch
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        def __init__(self):
            self.times: list[float] = []
            self.prompt_seen = False

        def put(self, value):
            if not self.prompt_seen:  # the first call hands over the prompt
                self.prompt_seen = True
                return
            self.times.append(time.perf_counter())

        def end(self):
            pass

    ids = gen.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    clock = Clock()
    with torch.inference_mode():
        gen.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=clock,
                           pad_token_id=gen.tokenizer.eos_token_id)
    return _rate(clock.times)


def _rate(times: list[float]) -> dict:
    if len(times) < 2:
        return {"tokens": len(times), "tokens_per_s": 0.0}
    return {"tokens": len(times), "tokens_per_s": round((len(times) - 1) / (times[-1] - times[0]), 3)}


def _agreement(fp32, int8, limit: int) -> dict:
    """fp32 and int8 greedy answers to the first `limit` MuSiQue test questions, gold paragraphs first."""
    import torch

    from rigkit.eval.answers import cover_match

    split = set(json.loads((ROOT / "data" / "musique" / "splits.json").read_text())["test"])
    records = [json.loads(line) for line in (ROOT / "data" / "musique" / "qa.jsonl").read_text().splitlines()
               if line.strip()]
    questions = [r for r in records if r["id"] in split][:limit]
    same, rows = 0, []
    for r in questions:
        gold = "\n\n".join(f"{p['title']}: {p['text']}" for p in r["paragraphs"] if p.get("is_supporting"))
        text = fp32.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{gold}\n\nAnswer briefly: {r['question']}"}], tokenize=False,
            add_generation_prompt=True)
        ids = fp32.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        answers = []
        for gen in (fp32, int8):
            with torch.inference_mode():
                out = gen.model.generate(ids, max_new_tokens=32, do_sample=False,
                                         pad_token_id=gen.tokenizer.eos_token_id)
            answers.append(gen.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip())
        same += answers[0] == answers[1]
        golds = [r["answer"], *r.get("answer_aliases", [])]
        covers = [cover_match(a, golds) for a in answers]
        rows.append({"id": r["id"], "gold": r["answer"], "fp32": answers[0], "int8": answers[1],
                     "cover_fp32": covers[0], "cover_int8": covers[1]})
        print(f"{r['id']}: {'same' if answers[0] == answers[1] else 'DIFFERENT'} | fp32 {answers[0][:60]!r} "
              f"| int8 {answers[1][:60]!r}")
    cover = {way: sum(row[f"cover_{way}"] for row in rows) for way in ("fp32", "int8")}
    only = {way: sum(row[f"cover_{way}"] > row[f"cover_{other}"] for row in rows)
            for way, other in (("fp32", "int8"), ("int8", "fp32"))}
    print(f"int8 answers identical to fp32: {same}/{len(questions)}; gold answer covered: fp32 "
          f"{cover['fp32']:g}, int8 {cover['int8']:g} (only fp32 {only['fp32']}, only int8 {only['int8']})")
    return {"questions": len(questions), "identical": same, "covered": cover, "only": only, "answers": rows}


if __name__ == "__main__":
    raise SystemExit(main())
