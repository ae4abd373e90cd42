"""Generators: produce the answer one segment at a time, with per-token evidence.

`protocol` holds the `Generator` protocol and the optional capabilities, `hf` the in-process
transformers backend, `stops` the stop rule every backend shares, `loading` model loading.
"""

from rigkit.generation.hf import HFGenerator
from rigkit.generation.loading import (
    DEFAULT_HUB_ID,
    DEFAULT_MODEL,
    converted_model_dir,
    load_generator,
)
from rigkit.generation.protocol import (
    Generator,
    SupportsAttention,
    SupportsHiddenStates,
    SupportsReset,
)
from rigkit.generation.stops import SENTENCE_END, find_stop

__all__ = [
    "Generator",
    "SupportsAttention",
    "SupportsHiddenStates",
    "SupportsReset",
    "HFGenerator",
    "load_generator",
    "converted_model_dir",
    "find_stop",
    "DEFAULT_MODEL",
    "DEFAULT_HUB_ID",
    "SENTENCE_END",
]
