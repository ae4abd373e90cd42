"""The systems an evaluation compares, named by short strings and built from one `RunConfig`.

Grammar (one name per system, comma-separated on the command line):

    closed_book            no retrieval at all
    rag[:K]                retrieve once with the question (top K, default retrieval.top_k), then answer
    rig[:DECIDER[:QUERY]]  the RIG controller with that decider and query mode
    rig:oracle             ceiling: retrieve when the next hop's gold paragraph is missing, with its
                           gold sub-question as the query (rigkit.eval.oracle; needs the gold data)
    rig:oracle~norestore   control: rig:oracle with controller.restore off
    rag:gold               ceiling: the gold paragraphs before the question, nothing retrieved
    rag:gold+distractors   control: rag:gold among the distractors rig:oracle's searches bring
    question_only, echo    no model at all (rigkit.eval.baselines): the first option the question
                           names or "yes"; the question itself. The floor a system must clear
    ...@append|@prefix     optional suffix: passage layout for this system (default: --layout)

`answer_closed_book` and `answer_with_passages` are the two baselines without a retrieval loop.
Every system shares one generator, one retriever and the config's prompts, so differences come
from when and what was retrieved. Budgets are matched too: plain RAG's passages pass through the
same context manager as RIG's, so the same `max_retrieval_tokens` (ids, titles and headers
included) and per-passage cap apply; `rag:K` keeps its best-ranked passages that fit and records
the rest in `RIGResult.upfront`. `rig:<decider>` uses that decider with its own defaults unless
the config's `decider` section names the same decider, in which case the whole section (threshold,
params, composite members, classifier model file) is used: systems that need more than a name
come from `--config`. Bare `rig` is exactly the config's decider.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rigkit.config import RunConfig
from rigkit.errors import InputError
from rigkit.trace import Hit, RIGResult

__all__ = ["SystemSpec", "System", "parse_system", "parse_systems", "system_config", "build_system",
           "build_systems", "load_parts", "answer_closed_book", "answer_with_passages", "answer_with_gold",
           "needs_gold", "needs_model", "MODEL_FREE"]

LAYOUTS = ("append", "prefix")
GOLD_KINDS = ("oracle", "gold", "gold_distractors")
MODEL_FREE = ("question_only", "echo")  # systems that load neither a generator nor an index


@dataclass(frozen=True)
class SystemSpec:
    """A parsed system name. `name` is the canonical string used as the results key."""

    name: str
    kind: str  # closed_book | rag | rig | oracle | gold (read the gold data) | question_only | echo
    decider: str | None = None
    query_mode: str | None = None
    top_k: int | None = None
    layout: str | None = None  # None = the run's default layout
    restore: bool = True  # rig:oracle~norestore: controller.restore off


@dataclass
class System:
    """A named way to answer a question: `answer(question, seed) -> RIGResult`."""

    spec: SystemSpec
    config: RunConfig
    answer: Callable[[str, int], RIGResult]

    @property
    def name(self) -> str:
        return self.spec.name


def parse_system(text: str) -> SystemSpec:
    """Parse one system name; raises InputError naming what is allowed."""
    raw = text.strip()
    base, _, layout = raw.partition("@")
    if layout and layout not in LAYOUTS:
        raise InputError(f"system {raw!r}: layout must be one of {', '.join(LAYOUTS)}")
    parts = base.split(":")
    kind, args = parts[0].strip().lower(), [p.strip() for p in parts[1:]]
    layout = layout or None
    if kind in ("closed_book", *MODEL_FREE) and not args:
        if kind in MODEL_FREE and layout:
            raise InputError(f"system {raw!r}: {kind} has no passages to lay out; drop @{layout}")
        return SystemSpec(raw, kind, layout=layout)
    if kind == "rag" and args == ["gold"]:
        return SystemSpec(raw, "gold", layout=layout)
    if kind == "rag" and args == ["gold+distractors"]:
        return SystemSpec(raw, "gold_distractors", layout=layout)
    if kind == "rig" and args in (["oracle"], ["oracle~norestore"]):
        return SystemSpec(raw, "oracle", layout=layout, restore=args[0] == "oracle")
    if kind == "rag" and len(args) <= 1:
        if args and not (args[0].isdigit() and int(args[0]) > 0):
            raise InputError(f"system {raw!r}: rag takes a positive top_k, e.g. rag:5")
        return SystemSpec(raw, "rag", top_k=int(args[0]) if args else None, layout=layout)
    if kind == "rig" and len(args) <= 2:
        decider = args[0] if args and args[0] else None
        query = args[1] if len(args) > 1 and args[1] else None
        from rigkit.deciders import check_decider_name
        from rigkit.queries import check_query_mode

        try:
            if decider:
                check_decider_name(decider)
            if query:
                check_query_mode(query)
        except InputError as err:
            raise InputError(f"system {raw!r}: {err}") from None
        return SystemSpec(raw, "rig", decider=decider, query_mode=query, layout=layout)
    raise InputError(
        f"unknown system {raw!r}: use closed_book, rag[:K], rig[:DECIDER[:QUERY_MODE]], rig:oracle, "
        "rig:oracle~norestore, rag:gold, rag:gold+distractors, question_only or echo, "
        "optionally with @append or @prefix"
    )


def parse_systems(text: str | list[str]) -> list[SystemSpec]:
    names = text.split(",") if isinstance(text, str) else list(text)
    specs = [parse_system(n) for n in names if n.strip()]
    if not specs:
        raise InputError("no systems given: e.g. --systems closed_book,rag,rig:prob")
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise InputError(f"system {spec.name!r} is listed twice")
        seen.add(spec.name)
    return specs


def system_config(spec: SystemSpec, config: RunConfig, layout: str | None = None) -> RunConfig:
    """The run config this system answers with (decider, query mode, top_k, layout replaced)."""
    layout = spec.layout or layout or config.context.layout
    config = dataclasses.replace(config, context=dataclasses.replace(config.context, layout=layout))
    if spec.top_k is not None:
        config = config.override(retrieval={"top_k": spec.top_k})
    config = config.with_decider(spec.decider)
    if not spec.restore:
        config = config.override(controller={"restore": False})
    if spec.query_mode:
        config = config.override(query={"mode": spec.query_mode})
    return config


def answer_closed_book(generator: Any, question: str, config: RunConfig | None = None) -> RIGResult:
    """The model alone: no retrieval at all."""
    return _no_loop(generator, config).run(question)


def answer_with_passages(
    generator: Any, question: str, hits: Sequence[Hit], config: RunConfig | None = None
) -> RIGResult:
    """Plain RAG (or gold passages): the passages go before the question, one generation."""
    return _no_loop(generator, config).run(question, passages=hits)


def answer_with_gold(generator: Any, question: str, gold: Mapping[str, Any],
                     config: RunConfig | None = None) -> RIGResult:
    """`rag:gold`: the gold paragraphs of `question` (from `gold`, question text -> `GoldChain`)
    before the question, one generation."""
    from rigkit.eval.oracle import chain_for, gold_hits

    result = answer_with_passages(generator, question, gold_hits(chain_for(gold, question)), config)
    result.used_retrieval_times = max(result.used_retrieval_times, 1)
    return result


def _no_loop(generator: Any, config: RunConfig | None):
    """The controller with a decider that never fires and a retriever that finds nothing."""
    from rigkit.build import assemble
    from rigkit.deciders.baselines import NeverRetrieve
    from rigkit.retrieval.base import NoRetriever

    return assemble(config or RunConfig(), generator, NoRetriever(), NeverRetrieve())


def _seeded(config: RunConfig, seed: int) -> RunConfig:
    # The controller reseeds the generator from generator.seed at each question, so a run's seed
    # has to travel in the config.
    return dataclasses.replace(config, generator=dataclasses.replace(config.generator, seed=seed))


def build_system(spec: SystemSpec, config: RunConfig, generator: Any, retriever: Any,
                 layout: str | None = None, gold: dict[str, Any] | None = None) -> System:
    """Wire one system to the shared generator and retriever (lazy import of rigkit.build).

    `gold` (question text -> `rigkit.eval.gold.GoldChain`) is read by the oracle systems only."""
    cfg = system_config(spec, config, layout)
    if spec.kind in MODEL_FREE:
        from rigkit.eval import baselines

        return System(spec, cfg, baselines.answer_question_only if spec.kind == "question_only"
                      else baselines.answer_echo)
    from rigkit import build

    if spec.kind == "closed_book":
        return System(spec, cfg, lambda q, seed: answer_closed_book(generator, q, _seeded(cfg, seed)))
    if spec.kind in GOLD_KINDS:
        return _gold_system(spec, cfg, generator, retriever, gold)
    if retriever is None:
        raise InputError(f"system {spec.name!r} needs an index (--index or retrieval.index)")
    if spec.kind == "rag":

        def rag(question: str, seed: int) -> RIGResult:
            start = time.perf_counter()
            hits = retriever.search(question, cfg.retrieval.top_k)
            seconds = time.perf_counter() - start
            result = answer_with_passages(generator, question, hits, _seeded(cfg, seed))
            result.timings["retrieve"] = result.timings.get("retrieve", 0.0) + seconds
            result.timings["total"] = result.timings.get("total", 0.0) + seconds
            result.used_retrieval_times = max(result.used_retrieval_times, 1)
            return result

        return System(spec, cfg, rag)
    # One controller per run seed; the first is built now so a bad decider setup fails early.
    controllers = {cfg.generator.seed: build.build_controller(cfg, generator=generator,
                                                              retriever=retriever)}

    def rig(question: str, seed: int) -> RIGResult:
        if seed not in controllers:
            controllers[seed] = build.build_controller(
                _seeded(cfg, seed), generator=generator, retriever=retriever)
        return controllers[seed].run(question)

    return System(spec, cfg, rig)


def _gold_system(spec: SystemSpec, cfg: RunConfig, generator: Any, retriever: Any,
                 gold: dict[str, Any] | None) -> System:
    """`rag:gold` or `rig:oracle` over the gold chains they were given."""
    from rigkit.eval import oracle

    if not gold:
        raise InputError(f"system {spec.name!r} reads the gold data: evaluate it on a QA file "
                         "with supporting paragraphs (rigkit eval --qa data/<set>/qa.jsonl)")
    if spec.kind == "gold":
        return System(spec, cfg, lambda q, seed: answer_with_gold(generator, q, gold, _seeded(cfg, seed)))
    if retriever is None:
        raise InputError(f"system {spec.name!r} needs an index (--index or retrieval.index)")
    if spec.kind == "gold_distractors":

        def gold_distractors(question: str, seed: int) -> RIGResult:
            hits = oracle.gold_with_distractors(oracle.chain_for(gold, question), retriever, cfg.retrieval.top_k)
            result = answer_with_passages(generator, question, hits, _seeded(cfg, seed))
            result.used_retrieval_times = max(result.used_retrieval_times, 1)
            return result

        return System(spec, cfg, gold_distractors)
    controllers: dict[int, Any] = {}

    def rig_oracle(question: str, seed: int) -> RIGResult:
        if seed not in controllers:
            controllers[seed] = oracle.oracle_controller(_seeded(cfg, seed), generator, retriever, gold)
        return controllers[seed].run(question)

    return System(spec, cfg, rig_oracle)


def needs_model(specs: Sequence[SystemSpec]) -> bool:
    """Whether any of `specs` answers with the generator (question_only and echo do not)."""
    return any(s.kind not in MODEL_FREE for s in specs)


def needs_gold(specs: Sequence[SystemSpec]) -> bool:
    """Whether any of `specs` reads the gold data."""
    return any(s.kind in GOLD_KINDS for s in specs)


def build_systems(specs: list[SystemSpec], config: RunConfig, generator: Any, retriever: Any,
                  layout: str | None = None, gold: dict[str, Any] | None = None) -> list[System]:
    return [build_system(s, config, generator, retriever, layout, gold) for s in specs]


def load_parts(cfg: RunConfig, specs: list, generator: Any = None, retriever: Any = None) -> tuple[Any, Any]:
    """The generator and retriever the systems of `specs` need (those given are kept); both None
    when every system answers without a model."""
    from rigkit.build import build_generator, build_retriever

    if not needs_model(specs):
        return generator, retriever
    if generator is None:
        generator = build_generator(cfg.generator)  # backend, device, dtype from the config
    needs_index = any(s.kind not in ("closed_book", *MODEL_FREE) for s in specs)
    if retriever is None and needs_index:
        if cfg.retrieval.index is None and cfg.retrieval.corpus is None and not cfg.retrieval.sources:
            # the retriever would fall back to the demo corpus: wrong passages, silently.
            raise InputError("systems that retrieve need an index: pass --index DIR (build one "
                             "with `rigkit index build`) or set retrieval.index / retrieval.corpus")
        retriever = build_retriever(cfg.retrieval, generator)  # the generator: for a upr rerank
    return generator, retriever
