"""Shared fixtures. Tests never reach a model hub: the offline packages provide the models."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def default_generator():
    """The real default model (SmolLM2-135M-Instruct), loaded once per test session."""
    from rigkit.generation import load_generator

    return load_generator()


@pytest.fixture(scope="session")
def demo_retriever():
    """The hybrid retriever over the demo corpus (indexed on first use, cached)."""
    from rigkit.config import RetrievalConfig
    from rigkit.retrieval import open_retriever

    return open_retriever(RetrievalConfig())
