"""Check a model on your GPU (or CPU): KV-cache reuse across rounds, decode tokens/s, peak memory.

    python bench/gpu_check.py MODEL_ID [--device auto] [--dtype auto] [--rounds 4] [--quick]
    python bench/gpu_check.py meta-llama/Llama-3.1-8B-Instruct --dtype bfloat16   # needs network + GPU
    python bench/gpu_check.py smollm2-135m-instruct --quick                       # offline, any CPU

Runs the append-only transcript the RIG loop uses (a segment, injected passages, the next
segment...) with the cache on and off, and prints: pre-filled vs reused prompt tokens per
round, whether cache on/off give the same tokens, decode tokens/s, and peak memory (CUDA
allocator peak on a GPU, peak RSS on CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import time

PASSAGE = (
    "Passage: The Apache License 2.0 is a permissive licence. It allows commercial use, modification "
    "and distribution, provided that a copy of the licence and any NOTICE file are included."
)


def _rounds(generator, rounds: int, segment_tokens: int):
    from rigkit.transcript import Piece, StopRule

    chat = generator.render_chat(
        [{"role": "user", "content": "Can I ship Apache-2.0 code in a commercial product? What must I include?"}],
        True,
    )
    prompt, segments, decode_s = [Piece(chat)], [], 0.0
    for i in range(rounds):
        t = time.perf_counter()
        segment = generator.next_segment(prompt, StopRule(), segment_tokens)
        decode_s += time.perf_counter() - t
        segments.append(segment)
        prompt.append(Piece(segment.text, tuple(segment.token_ids)))
        if i % 2 == 0:  # every other round retrieval injects a passage, as the loop does
            prompt.append(Piece(f"\n\n{PASSAGE}\n\n"))
        if segment.finished:
            break
    return segments, decode_s


def _peak_memory(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (CUDA allocator peak)"
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return f"{rss_kib / 2**20:.2f} GiB (peak RSS of this process)"


def main(argv: list[str] | None = None) -> int:
    from rigkit.build import build_generator
    from rigkit.config import GeneratorConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a hub id, a local path, or smollm2-135m-instruct (offline)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device-map", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--segment-tokens", type=int, default=48)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 16 tokens (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.segment_tokens = 2, 16

    t = time.perf_counter()
    config = GeneratorConfig(model=args.model, device=args.device, dtype=args.dtype, device_map=args.device_map)
    cached = build_generator(config)
    load_s = time.perf_counter() - t
    fresh = build_generator(dataclasses.replace(config, use_cache=False))
    device = str(cached.device)
    print(f"model {args.model} ({cached.source}) on {device}, {cached.dtype}, loaded in {load_s:.1f} s")
    on, on_s = _rounds(cached, args.rounds, args.segment_tokens)
    off, off_s = _rounds(fresh, args.rounds, args.segment_tokens)
    print("round  generated  pre-filled  reused (cache on)  pre-filled (cache off)")
    for i, (a, b) in enumerate(zip(on, off)):
        print(f"{i:>5}  {len(a.token_ids):>9}  {a.tokens_prefilled:>10}  {a.tokens_reused:>17}  {b.tokens_prefilled:>22}")
    generated = sum(len(s.token_ids) for s in on)
    prefilled_on = sum(s.tokens_prefilled for s in on)
    prefilled_off = sum(s.tokens_prefilled for s in off)
    same = [s.token_ids for s in on] == [s.token_ids for s in off]
    print(f"pre-filled tokens, cache off / on: {prefilled_off} / {prefilled_on} = "
          f"{prefilled_off / max(1, prefilled_on):.2f}x fewer with the cache")
    print(f"same tokens with cache on and off: {same}")
    print(f"decode: {generated} tokens in {on_s:.2f} s = {generated / on_s:.1f} tokens/s (cache on, "
          f"incl. pre-fill); cache off {generated / off_s:.1f} tokens/s; ratio {off_s / on_s:.2f}x")
    print(f"peak memory: {_peak_memory(device)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
