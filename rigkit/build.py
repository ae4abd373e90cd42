"""Turn a config into the parts of a run: the one module that does.

`build_run(config)` builds the generator, retriever, decider, query builder, context manager and
the controller over them, and hands them back together as `Parts`; `build_controller(config)` is
their controller. The commands, the server, evaluation, trigger and marker training and the
widgets ask here for what they need: one part alone (`build_generator`, `build_retriever`,
`build_decider`) or a controller over parts they made themselves (`assemble`). Each part comes
from its package's explicit registry (`rigkit.generation`, `rigkit.retrieval.RETRIEVERS`,
`rigkit.deciders.DECIDERS`, `rigkit.queries`); nothing here sniffs a model name.

`build` sits below the commands and above the core: it imports no command package. The systems
an evaluation compares (closed book, plain RAG, RIG) are defined in `rigkit.eval.systems`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rigkit.config import (
    ContextConfig,
    DeciderConfig,
    GeneratorConfig,
    QueryConfig,
    RetrievalConfig,
    RunConfig,
)
from rigkit.context import ContextManager
from rigkit.controller import RIGController
from rigkit.deciders import Decider
from rigkit.deciders.calibration import calibrated_section
from rigkit.generation import Generator
from rigkit.markers import MarkerProtocol, resolve_protocol
from rigkit.queries import QueryBuilder
from rigkit.retrieval.base import Retriever

__all__ = [
    "Parts",
    "Serving",
    "build_run",
    "build_controller",
    "build_generator",
    "build_retriever",
    "build_decider",
    "build_index",
    "build_context",
    "build_queries",
    "with_reranker",
    "with_filters",
    "assemble",
    "uses_markers",
]


@dataclass(frozen=True)
class Parts:
    """Every part built from one config; `controller` runs the loop over the others."""

    config: RunConfig
    generator: Generator
    retriever: Retriever
    decider: Decider
    query_builder: QueryBuilder
    context: ContextManager
    controller: RIGController


@dataclass(frozen=True)
class Serving:
    """What a served request adds to the parts built from the config (`rigkit.serve`)."""

    queries: Callable[[QueryBuilder], QueryBuilder] | None = None  # wraps the query builder
    tools_prompt: Callable[[MarkerProtocol], str] | None = None  # the client's tools, in the run's marker tags
    check_stop: Callable[[], None] | None = None  # raises once the client has gone (before a summary call)


def build_run(
    config: RunConfig | None = None,
    generator: Generator | None = None,
    retriever: Retriever | None = None,
    callbacks: Sequence[Any] = (),
    serving: Serving | None = None,
) -> Parts:
    """Every part built from `config`; pass a loaded generator or retriever to share it across
    runs (a retriever reranked already, through any wrapper, is not reranked again)."""
    config = config or RunConfig()
    generator = generator if generator is not None else build_generator(config.generator)
    retriever = (build_retriever(config.retrieval, generator) if retriever is None
                 else with_reranker(retriever, config.retrieval, generator))
    # one marker protocol for the system prompt, the stop rule, the passages and the decider
    protocol = resolve_protocol(config.context.marker_protocol, config.context.marker_tag)
    decider_config = calibrated_section(_with_protocol(config.decider, protocol), config.generator.model)
    from rigkit.deciders import check_decider_support

    check_decider_support(decider_config, generator)  # what the decider's class needs of the model
    decider = build_decider(decider_config, generator)
    return _run(config, generator, retriever, decider, callbacks, uses_markers(config), serving=serving)


def build_controller(
    config: RunConfig | None = None,
    generator: Generator | None = None,
    retriever: Retriever | None = None,
    callbacks: Sequence[Any] = (),
    serving: Serving | None = None,
) -> RIGController:
    """The controller of `build_run(config, generator, retriever, callbacks, serving)`."""
    return build_run(config, generator, retriever, callbacks, serving).controller


def build_generator(config: GeneratorConfig | None = None) -> Generator:
    """The generator `config` describes: in-process (`hf`, device, dtype...) or served (`openai`, `chat`, `ollama`)."""
    from rigkit import generation  # looked up at each call, so a test can stand in for the loader

    return generation.generator_from_config(config or GeneratorConfig())


SERVED_CONCURRENCY = 8  # loops at once against a served model: its server batches their calls


def default_concurrency(config: GeneratorConfig) -> int:
    """How many loops run at once by default: one for an in-process model (one KV cache, and a
    copy per loop would cost its memory again), several for a served model."""
    return SERVED_CONCURRENCY if config.backend in ("openai", "chat", "ollama") else 1


def build_retriever(config: RetrievalConfig | None = None, generator: Generator | None = None) -> Retriever:
    """The retriever `config` describes (`retrieval.mode` picks it from `RETRIEVERS`), reranked
    when `retrieval.rerank` names a reranker (`upr` scores with `generator`). With
    `retrieval.sources`, one such retriever per source behind a router (`rigkit.retrieval.sources`)."""
    from rigkit import retrieval  # looked up at each call, as in build_generator

    config = config or RetrievalConfig()
    if config.sources:
        from rigkit.retrieval.sources import open_sources

        return open_sources(config, lambda one: build_retriever(one, generator))
    return with_reranker(with_filters(retrieval.open_retriever(config), config), config, generator)


def build_index(config: RetrievalConfig | None = None):
    """The saved or cached `Index` `config` describes (`retrieval.index`, else `corpus`), checked
    against the config's settings: for commands that measure an index's own retrievers."""
    from rigkit import retrieval

    return retrieval.open_index(config or RetrievalConfig())


def build_queries(config: QueryConfig | None = None, generator: Generator | None = None) -> QueryBuilder:
    """The query builder `config.mode` names (`rigkit.queries.QUERY_BUILDERS`)."""
    from rigkit.queries import build_query_builder

    return build_query_builder(config or QueryConfig(), generator)


def with_filters(retriever: Retriever, config: RetrievalConfig) -> Retriever:
    """`retriever` with `retrieval.filters` bound to every search, checked against its chunks
    now (an unknown key or a filter nothing passes fails before the run starts)."""
    from rigkit.retrieval.filters import FilteredRetriever, parse_filters

    filters = parse_filters(config.filters)
    return FilteredRetriever(retriever, filters) if filters else retriever


def with_reranker(retriever: Retriever, config: RetrievalConfig, generator: Generator | None = None) -> Retriever:
    """`retriever` behind the reranker `config.rerank` names (unchanged for "none" or when it is
    reranked already): `rerank_candidates` hits in, near-duplicates out, `top_k` kept."""
    from rigkit.retrieval.base import layers
    from rigkit.retrieval.rerank import RerankedRetriever, embedder_of, reranker_from_config
    from rigkit.retrieval.sources import SourcesRetriever

    if (config.rerank or "none").strip() == "none" or any(
            isinstance(layer, (RerankedRetriever, SourcesRetriever)) for layer in layers(retriever)):
        return retriever  # a router's sources are reranked each
    reranker = reranker_from_config(config, generator)
    assert reranker is not None
    return RerankedRetriever(retriever, reranker, config.rerank_candidates, embedder_of(retriever))


def build_decider(config: DeciderConfig, generator: Generator | None = None) -> Decider:
    """The decider `config` describes, a classifier's trained file (`trigger_model`) opened.

    The one way to build a decider from its config; `generator` goes to the deciders that read
    from it (attention, hidden states). Registering a class: `rigkit.deciders.DECIDERS`.
    """
    from rigkit.deciders import decider_from_config

    return decider_from_config(config, generator)


def assemble(
    config: RunConfig,
    generator: Generator,
    retriever: Retriever,
    decider: Decider,
    callbacks: Sequence[Any] = (),
    markers: bool = False,
    query_builder: QueryBuilder | None = None,
) -> RIGController:
    """A controller over ready parts (e.g. a decider of your own); the context and, unless one is
    given, the query builder come from `config`; `markers` says whether the system prompt teaches
    the marker protocol."""
    return _run(config, generator, retriever, decider, callbacks, markers, query_builder).controller


def build_context(
    config: ContextConfig, generator: Generator, markers: bool = False, **extras: Any,
) -> ContextManager:
    """The context manager `config` describes, over `generator`'s tokenizer, chat template and
    window, in the config's marker protocol; `markers`: the system prompt teaches it. `extras`:
    `ContextManager`'s compressor, summarizer, tools_prompt."""
    protocol = resolve_protocol(config.marker_protocol, config.marker_tag)
    return ContextManager(config, generator.count_tokens, generator.render_chat,
                          context_limit=generator.context_limit, use_markers=markers, protocol=protocol,
                          **extras)


def uses_markers(config: RunConfig) -> bool:
    """Whether the system prompt must teach the marker protocol."""
    names = [config.decider.name] + [m.name for m in config.decider.members]
    return "marker" in names


def _run(
    config: RunConfig,
    generator: Generator,
    retriever: Retriever,
    decider: Decider,
    callbacks: Sequence[Any],
    markers: bool,
    query_builder: QueryBuilder | None = None,
    serving: Serving | None = None,
) -> Parts:
    serving = serving or Serving()
    query_builder = query_builder or build_queries(config.query, generator)
    if serving.queries is not None:
        query_builder = serving.queries(query_builder)
    protocol = resolve_protocol(config.context.marker_protocol, config.context.marker_tag)
    context = build_context(
        config.context, generator, markers,
        compressor=_compressor(config, generator, retriever),
        summarizer=_summarizer(config, generator, serving.check_stop),
        tools_prompt=serving.tools_prompt(protocol) if serving.tools_prompt is not None else "",
    )
    controller = RIGController(
        generator, retriever, decider, query_builder, context,
        config=config.controller, generation=config.generator, top_k=config.retrieval.top_k,
        callbacks=callbacks, citations=config.context.citations, run_config=config.to_dict(),
        embed=_support_embed(config, retriever), query_config=config.query,
    )
    return Parts(config, generator, retriever, decider, query_builder, context, controller)


def _compressor(config: RunConfig, generator: Generator, retriever: Retriever):
    """`context.compress`: extractive scores sentences with the dense retriever's own model (the
    default embedder where the retriever has none), abstractive asks the generator."""
    from rigkit.compression import AbstractiveCompressor, ExtractiveCompressor

    mode = config.context.compress
    if mode == "extractive":
        from rigkit.retrieval.rerank import embedder_of

        return ExtractiveCompressor(embedder_of(retriever) or _default_embed, generator.count_tokens)
    return AbstractiveCompressor(generator) if mode == "abstractive" else None


def _support_embed(config: RunConfig, retriever: Retriever):
    """`controller.check_support`: the dense retriever's own model, else the default embedder."""
    if not config.controller.check_support:
        return None
    from rigkit.retrieval.rerank import embedder_of

    return embedder_of(retriever) or _default_embed


def _default_embed(texts: list[str]):
    """Unit vectors from the default embedding model (loaded once per process, on first use)."""
    from rigkit.embeddings import load_embedder
    from rigkit.retrieval.dense import embed_texts

    return embed_texts(load_embedder(), texts)


def _summarizer(config: RunConfig, generator: Generator, check_stop: Callable[[], None] | None = None):
    """`context.summarize_history`: the generator summarises turns beyond max_history_tokens."""
    from rigkit.compression import HistorySummarizer

    if not config.context.summarize_history:
        return None
    return HistorySummarizer(generator, input_tokens=config.context.summary_input_tokens, check_stop=check_stop)


def _with_protocol(config: DeciderConfig, protocol: MarkerProtocol) -> DeciderConfig:
    """`config` with the run's marker protocol given to every marker decider in it that names
    neither a tag nor a protocol of its own."""
    members = tuple(_with_protocol(m, protocol) for m in config.members)
    params = config.params
    if config.name == "marker" and not {"tag", "protocol"} & set(params):
        params = {**params, "protocol": protocol}
    return dataclasses.replace(config, params=params, members=members)
