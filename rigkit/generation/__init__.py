"""Generators: produce the answer one segment at a time, with per-token evidence.

`protocol` holds the `Generator` protocol and the optional capabilities, `hf` the in-process
transformers backend, `openai` the OpenAI-compatible server backend (imported on first use: it
needs `httpx`), `stops` the stop rule every backend shares, `loading` model loading (internal: a run builds its
generator with `rigkit.build.build_generator(config.generator)`), `default_model` the default
model's names, offline copies and tokenizer, `adapters` LoRA adapters named
in a model spec, `random_model` models with random weights built from a config (offline checks of
the machinery: tests, bench/cuda_check.py).
"""

from rigkit.generation.hf import HFGenerator
from rigkit.generation.loading import (
    DEFAULT_HUB_ID,
    DEFAULT_MODEL,
    Placement,
    converted_model_dir,
    generator_from_config,
)
from rigkit.generation.protocol import (
    Generator,
    SupportsAttention,
    SupportsHiddenStates,
    SupportsReset,
    check_needs,
)
from rigkit.generation.stops import SENTENCE_END, find_stop

__all__ = [
    "Generator",
    "SupportsAttention",
    "SupportsHiddenStates",
    "SupportsReset",
    "HFGenerator",
    "generator_from_config",
    "Placement",
    "check_needs",
    "OpenAIGenerator",
    "converted_model_dir",
    "find_stop",
    "DEFAULT_MODEL",
    "DEFAULT_HUB_ID",
    "SENTENCE_END",
]


def __getattr__(name: str):
    if name == "OpenAIGenerator":
        from rigkit.generation.openai import OpenAIGenerator

        return OpenAIGenerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
