"""Assemble a run from its config: one explicit registry per extension point, no sniffing."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rigkit.config import RunConfig
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.generation import Generator
from rigkit.retrieval.base import Retriever
from rigkit.testing import DictRetriever, NeverDecider
from rigkit.trace import Hit, RIGResult

__all__ = ["build_controller", "answer_closed_book", "answer_with_passages", "context_limit"]


def build_controller(
    config: RunConfig | None = None,
    generator: Generator | None = None,
    retriever: Retriever | None = None,
    callbacks: Sequence[Any] = (),
) -> RIGController:
    """A controller with every part built from `config`; pass parts to share them across runs."""
    from rigkit.deciders import build_decider

    config = config or RunConfig()
    if generator is None:
        from rigkit.generation import load_generator

        g = config.generator
        generator = load_generator(g.model, use_cache=g.use_cache, temperature=g.temperature, top_p=g.top_p, dtype=g.dtype)
    if retriever is None:
        from rigkit.retrieval import open_retriever

        retriever = open_retriever(config.retrieval)
    decider_config = config.decider
    if decider_config.name == "marker" and "tag" not in decider_config.params:
        # one tag for the system prompt, the stop rule and the decider
        params = {**decider_config.params, "tag": config.context.marker_tag}
        decider_config = dataclasses.replace(decider_config, params=params)
    decider = build_decider(decider_config, generator)
    return _controller(config, generator, retriever, decider, callbacks, uses_markers(config))


def answer_closed_book(generator: Generator, question: str, config: RunConfig | None = None) -> RIGResult:
    """The model alone: no retrieval at all."""
    config = config or RunConfig()
    return _controller(config, generator, DictRetriever({}), NeverDecider(), (), False).run(question)


def answer_with_passages(
    generator: Generator, question: str, hits: Sequence[Hit], config: RunConfig | None = None
) -> RIGResult:
    """Plain RAG (or gold passages): the passages go before the question, one generation."""
    config = config or RunConfig()
    return _controller(config, generator, DictRetriever({}), NeverDecider(), (), False).run(question, passages=hits)


def uses_markers(config: RunConfig) -> bool:
    """Whether the system prompt must teach the marker protocol."""
    names = [config.decider.name] + [m.name for m in config.decider.members]
    return "marker" in names


def context_limit(generator: Generator) -> int:
    """The model's context length, or 4096 when the generator does not say."""
    model_config = getattr(getattr(generator, "model", None), "config", None)
    return int(getattr(model_config, "max_position_embeddings", 4096) or 4096)


def _controller(
    config: RunConfig, generator: Generator, retriever: Retriever, decider: Any, callbacks: Sequence[Any], markers: bool
) -> RIGController:
    from rigkit.queries import build_query_builder

    context = ContextManager(
        config.context, generator.count_tokens, generator.render_chat,
        context_limit=context_limit(generator), use_markers=markers,
    )
    controller = RIGController(
        generator, retriever, decider, build_query_builder(config.query, generator), context,
        config=config.controller, generation=config.generator, top_k=config.retrieval.top_k,
        callbacks=callbacks, citations=config.context.citations,
    )
    controller.run_config = config.to_dict()
    return controller
