"""The tiny randomly initialised Llama the tests use for model machinery (cache reuse, crop,
segment ends) that does not need model quality; it lives in `rigkit.generation.random_model`
so bench/cuda_check.py builds the same model."""

from rigkit.generation.random_model import CHAT_TEMPLATE, WORDS, tiny_generator

__all__ = ["CHAT_TEMPLATE", "WORDS", "tiny_generator"]
