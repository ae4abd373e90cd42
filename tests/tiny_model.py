"""A tiny randomly initialised Llama with a word-level tokenizer, built in-process for tests of
model machinery (cache reuse, crop, segment ends) that do not need model quality. Its parts come
from `rigkit.generation.random_model`, so bench/cuda_check.py builds the same model."""

from __future__ import annotations

from rigkit.generation.random_model import CHAT_TEMPLATE, WORDS, tiny_parts

__all__ = ["CHAT_TEMPLATE", "WORDS", "tiny_generator"]


def tiny_generator(seed: int = 0, use_cache: bool = True, layers: int = 2, device: str = "cpu", dtype: str = "float32"):
    """`tiny_parts` on `device` in `dtype`: the same weights for a seed on every device (drawn on
    the CPU in float32, then moved)."""
    import torch

    from rigkit.generation import HFGenerator

    model, tokenizer = tiny_parts(seed, layers)
    model = model.to(device=device, dtype=getattr(torch, dtype))
    return HFGenerator(model, tokenizer, spec="tiny-random", source="test", use_cache=use_cache)
