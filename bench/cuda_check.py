"""Check the in-process RIG loop on a GPU (or any device), with no download.

    python bench/cuda_check.py --device cuda --dtype bfloat16,float32   # against CPU float32
    python bench/cuda_check.py --device cpu --dtype float32 --models tiny

Random weights, real machinery: each model (`tiny`, a 2-layer Llama with a word tokenizer;
`default`, the default model's architecture, 135M parameters, with its real tokenizer and chat
template when config.json and tokenizer.json are found in --model-dir, weights never read) is
drawn once on the CPU, saved as a model folder and loaded through `build_generator` with
`generator.device` / `generator.dtype`, exactly as `--model DIR,device=cuda,dtype=bfloat16` does.
The loop then answers a few questions greedily with the `prob` and `entropy` deciders (entropy
reads last-layer attention: one eager pass per segment) over an in-memory retriever, on the
device and again on --device-compare in float32. It checks that the loop runs there, that the
deciders fire, that later rounds reuse the KV cache, and that the first segment's greedy tokens
match the float32 comparison run: required in float32, reported as a share otherwise (random
weights leave near-ties that half precision breaks either way). It prints one row per model and
dtype and exits 1 when a check fails or a run raises.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import common  # noqa: F401  (puts the source tree on sys.path, keeps the hub offline)

from rigkit.build import build_controller, build_generator
from rigkit.config import load_config
from rigkit.trace import Hit

QUESTIONS = (
    "can you ship apache code in a commercial product ?",
    "what must you include with mit code ?",
    "which licence may grant a patent ?",
)
PASSAGES = [
    Hit("apache#0", "apache", "Apache", "the apache licence may grant a patent and you must include the notice file", 1.0),
    Hit("mit#0", "mit", "MIT", "the mit licence is short and you must include a copy of it", 1.0),
    Hit("gpl#0", "gpl", "GPL", "the gpl licence is a copyleft and you must ship the source with the binary", 1.0),
]
DECIDERS = ("prob", "entropy")


class WordOverlap:
    """An in-memory retriever: the passages sharing the most words with the query."""

    def search(self, query: str, top_k: int = 5) -> list[Hit]:
        words = set(query.lower().split())
        return sorted(PASSAGES, key=lambda h: -len(words & set(h.text.split())))[:top_k]


@dataclass
class Run:
    """One model on one device in one dtype: what the loop did, and how fast."""

    device: str
    dtype: str
    answers: int = 0
    rounds: int = 0
    retrievals: dict[str, int] = field(default_factory=dict)  # decider -> rounds that retrieved
    reused: int = 0  # prompt tokens served from the cache in rounds after the first
    prefilled: int = 0  # ... and run through the model
    tokens: int = 0
    seconds: float = 0.0
    first: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (decider, question) -> ids

    @property
    def reused_share(self) -> float:
        return self.reused / max(1, self.reused + self.prefilled)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(1e-9, self.seconds)


def run_loop(folder: Path, device: str, dtype: str, questions: list[str]) -> Run:
    """Load `folder` on `device` in `dtype` and answer `questions` with each decider."""
    overrides = {"model": str(folder), "device": device, "dtype": dtype,
                 "max_answer_tokens": 48, "max_segment_tokens": 16}
    generator = build_generator(load_config(generator=overrides).generator)
    placed = (generator.device.type, generator.dtype)
    if placed != (device.split(":")[0], dtype):
        raise RuntimeError(f"asked for {device}/{dtype}, the model is on {placed[0]}/{placed[1]}")
    run = Run(device, dtype)
    for name in DECIDERS:
        params = {"threshold": 0.5} if name == "prob" else {}  # random weights: fires anyway
        config = load_config(generator=overrides, decider={"name": name, **params},
                             # random weights repeat one phrase: the repeat guard would end every answer
                             controller={"max_rounds": 2, "short_answer": "none", "repeat_guard": False})
        controller = build_controller(config, generator, WordOverlap())
        controller.run(questions[0])  # untimed: first kernels and lazy imports
        for question in questions:
            start = time.perf_counter()
            result = controller.run(question)
            run.seconds += time.perf_counter() - start
            run.answers += 1
            run.rounds += len(result.rounds)
            run.retrievals[name] = run.retrievals.get(name, 0) + result.used_retrieval_times
            run.tokens += sum(len(r.segment.token_ids) for r in result.rounds)
            run.reused += sum(r.tokens_reused or 0 for r in result.rounds[1:])
            run.prefilled += sum(r.tokens_prefilled for r in result.rounds[1:])
            run.first[name, question] = list(result.rounds[0].segment.token_ids)
    return run


def problems(run: Run, base: Run) -> tuple[list[str], float]:
    """What `run` got wrong, and the share of first segments equal to `base`'s."""
    wrong = [f"{name} never retrieved" for name in DECIDERS if not run.retrievals.get(name)]
    if run.rounds > run.answers and run.reused == 0:
        wrong.append("no round after the first reused the KV cache")
    same = sum(run.first[key] == base.first[key] for key in base.first) / len(base.first)
    if run.dtype == "float32" and same < 1:
        wrong.append(f"float32 first segments differ from {base.device} float32 ({same:.0%} equal)")
    return wrong, same


def model_parts(name: str, model_dir: Path):
    from rigkit.generation.random_model import random_parts, tiny_parts

    return tiny_parts(seed=0) if name == "tiny" else random_parts(model_dir, seed=0)


def main(argv: list[str] | None = None) -> int:
    from transformers.utils import logging

    from rigkit.generation import converted_model_dir
    from rigkit.generation.random_model import save_model

    logging.disable_progress_bar()  # the table is the output

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N, mps or cpu")
    p.add_argument("--dtype", default="bfloat16", help="comma-separated: bfloat16,float32,float16")
    p.add_argument("--device-compare", default="cpu", help="the float32 reference device")
    p.add_argument("--models", default="tiny,default", help="tiny and/or default")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="config.json + tokenizer files of the default model (default: its converted copy)")
    p.add_argument("--questions", type=int, default=len(QUESTIONS))
    args = p.parse_args(argv)
    models = args.models.split(",")
    model_dir = args.model_dir or (converted_model_dir() if "default" in models else Path())
    if "default" in models and not (model_dir / "config.json").exists():
        print(f"default: skipped, no config.json in {model_dir}")
        models.remove("default")
    questions = list(QUESTIONS[: args.questions])
    rows, failed = [], False
    with tempfile.TemporaryDirectory(prefix="cuda-check-") as tmp:
        for name in models:
            try:
                folder = save_model(*model_parts(name, model_dir), Path(tmp) / name)
                base = run_loop(folder, args.device_compare, "float32", questions)
                for dtype in args.dtype.split(","):
                    run = run_loop(folder, args.device, dtype, questions)
                    wrong, same = problems(run, base)
                    failed |= bool(wrong)
                    rows.append((name, run, base, same, "; ".join(wrong) or "ok"))
            except Exception:  # report it, go on with the next model, exit 1 at the end
                traceback.print_exc()
                rows.append((name, Run(args.device, args.dtype), Run(args.device_compare, "float32"), 0.0, "raised"))
                failed = True
    print_table(rows, args.device_compare)
    return 1 if failed else 0


def print_table(rows, compare: str) -> None:
    print(f"| model | device | dtype | answers | rounds | retrievals (prob/entropy) | reused share | "
          f"tokens/s | vs {compare} float32 | first segments equal | check |")
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for name, run, base, same, check in rows:
        retrievals = "/".join(str(run.retrievals.get(d, 0)) for d in DECIDERS)
        print(f"| {name} | {run.device} | {run.dtype} | {run.answers} | {run.rounds} | {retrievals} | "
              f"{run.reused_share:.0%} | {run.tokens_per_s:.1f} | "
              f"{run.tokens_per_s / max(1e-9, base.tokens_per_s):.2f}x | {same:.0%} | {check} |")


if __name__ == "__main__":
    sys.exit(main())
