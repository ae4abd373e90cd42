"""Cost of the DRAGIN attention pass per decision: the previous deep copy of the KV cache vs
re-using the run's cache (crop + append), side by side in one run, as a ratio.

    .venv/bin/python bench/attention_cache.py [--model smollm2-135m-instruct] [--context 1500] [--quick]

`before` reproduces the previous implementation (copy.deepcopy of the whole cache, crop the copy,
eager pass over the segment); `after` is `HFGenerator.segment_attention` as it is now. Both
compute the same attention (checked). Prints per-decision milliseconds and the ratio.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time


def _before(generator, prefix, segment):
    """The previous `_prefix_cache` + pass: a private deep copy of the run's cache."""
    import torch

    from rigkit.generation.hf import crop_cache

    cache = copy.deepcopy(generator.kv.cache)
    crop_cache(cache, len(prefix))
    previous = generator.model.config._attn_implementation
    generator.model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = generator.model(
                input_ids=torch.tensor([segment.token_ids], device=generator.device), use_cache=True,
                output_attentions=True, **{generator.kv.kwarg: cache},
            )
    finally:
        generator.model.set_attn_implementation(previous)
    n = len(segment.token_ids)
    return out.attentions[-1][0, :, :, -n:].mean(0).float().tolist()


def main() -> None:
    from rigkit.build import build_generator
    from rigkit.config import GeneratorConfig
    from rigkit.transcript import Piece, StopRule

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=1500, help="prompt tokens before the segment")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="300 prompt tokens, one trial (a smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.context, args.trials = 300, 1

    generator = build_generator(GeneratorConfig(model=args.model))
    filler = "The Apache License 2.0 lets you use, modify and ship the code, also commercially. " * 400
    ids = generator.tokenizer(filler, add_special_tokens=False).input_ids[: args.context]
    text = generator.tokenizer.decode(ids)
    chat = generator.render_chat([{"role": "user", "content": text + "\nSummarise."}], True)
    prompt = [Piece(chat)]
    before_ms, after_ms = [], []
    for _ in range(args.trials):
        segment = generator.next_segment(prompt, StopRule(), 24)  # the run's state at a decision
        prefix = generator.internals.prompt_of(segment)
        t = time.perf_counter()
        old = _before(generator, prefix, segment)
        before_ms.append((time.perf_counter() - t) * 1000)
        generator.internals.key = None  # no memo: measure the pass itself
        t = time.perf_counter()
        new = generator.segment_attention(segment)
        after_ms.append((time.perf_counter() - t) * 1000)
        worst = max(abs(a - b) for ra, rb in zip(old, new) for a, b in zip(ra, rb))
        assert worst < 1e-3, f"attention differs by {worst}"
    b, a = statistics.median(before_ms), statistics.median(after_ms)
    cache_mb = sum(t.numel() * t.element_size() for layer in generator.kv.cache.layers
                   for t in (layer.keys, layer.values)) / 2**20
    print(f"model {args.model} on {generator.device}, prompt {len(generator.encode(prompt))} tokens, "
          f"segment {len(segment.token_ids)} tokens, KV cache {cache_mb:.0f} MiB")
    print(f"attention pass per decision (median of {args.trials}): before (deep copy) {b:.0f} ms, "
          f"after (cache re-use) {a:.0f} ms, ratio before/after {b / a:.2f}x")


if __name__ == "__main__":
    main()
