"""Assemble a run from its config: one explicit registry per extension point, no sniffing.

`build` only puts parts together; the systems an evaluation compares (closed book, plain RAG,
RIG) are defined in `rigkit.eval.systems`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rigkit.config import DeciderConfig, RunConfig
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.deciders import Decider
from rigkit.generation import Generator
from rigkit.markers import MarkerProtocol, resolve_protocol
from rigkit.retrieval.base import Retriever

__all__ = ["build_controller", "build_decider", "assemble", "uses_markers", "context_limit"]


def build_controller(
    config: RunConfig | None = None,
    generator: Generator | None = None,
    retriever: Retriever | None = None,
    callbacks: Sequence[Any] = (),
) -> RIGController:
    """A controller with every part built from `config`; pass parts to share them across runs."""
    config = config or RunConfig()
    if generator is None:
        from rigkit.generation import generator_from_config

        generator = generator_from_config(config.generator)
    if retriever is None:
        from rigkit.retrieval import open_retriever

        retriever = open_retriever(config.retrieval)
    # one marker protocol for the system prompt, the stop rule, the passages and the decider
    protocol = resolve_protocol(config.context.marker_protocol, config.context.marker_tag)
    decider_config = _with_protocol(config.decider, protocol)
    from rigkit.generation import check_decider_support

    check_decider_support(decider_config, generator)
    decider = build_decider(decider_config, generator)
    return assemble(config, generator, retriever, decider, callbacks, uses_markers(config))


def build_decider(config: DeciderConfig, generator: Generator | None = None) -> Decider:
    """`rigkit.deciders.build_decider`, with trained trigger files (`trigger_model`) loaded."""
    from rigkit.deciders import build_decider as from_registry

    def load(path: str, embedder: Any | None = None):
        from rigkit.trigger.model import load_trigger

        return load_trigger(path, embedder=embedder)

    return from_registry(config, generator, load_trigger=load)


def _with_protocol(config: DeciderConfig, protocol: MarkerProtocol) -> DeciderConfig:
    """`config` with the run's marker protocol given to every marker decider in it that names
    neither a tag nor a protocol of its own."""
    members = tuple(_with_protocol(m, protocol) for m in config.members)
    params = config.params
    if config.name == "marker" and not {"tag", "protocol"} & set(params):
        params = {**params, "protocol": protocol}
    return dataclasses.replace(config, params=params, members=members)


def uses_markers(config: RunConfig) -> bool:
    """Whether the system prompt must teach the marker protocol."""
    names = [config.decider.name] + [m.name for m in config.decider.members]
    return "marker" in names


def context_limit(generator: Generator) -> int:
    """The model's context length, or 4096 when the generator does not say."""
    model_config = getattr(getattr(generator, "model", None), "config", None)
    return int(getattr(model_config, "max_position_embeddings", 4096) or 4096)


def assemble(
    config: RunConfig,
    generator: Generator,
    retriever: Retriever,
    decider: Decider,
    callbacks: Sequence[Any] = (),
    markers: bool = False,
) -> RIGController:
    """A controller from ready parts; context and query builder come from `config`."""
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
