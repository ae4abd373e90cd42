"""Run configuration: one frozen dataclass per component, nested in `RunConfig`.

Precedence is defaults < YAML file < keyword overrides. Unknown keys are an error, so a typo in a
config file never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rigkit.errors import RigkitError

__all__ = [
    "ConfigError",
    "GeneratorConfig",
    "RetrievalConfig",
    "DeciderConfig",
    "QueryConfig",
    "ContextConfig",
    "ControllerConfig",
    "RunConfig",
    "load_config",
]


class ConfigError(RigkitError, ValueError):
    """A configuration file or override that rigkit cannot use."""


@dataclass(frozen=True)
class GeneratorConfig:
    model: str = "smollm2-135m-instruct"  # short name, hub id or local path
    max_segment_tokens: int = 48  # a segment pauses here if no sentence end came first
    max_answer_tokens: int = 256  # the whole answer's token limit
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    use_cache: bool = True  # reuse the KV cache across rounds
    dtype: str = "float32"


@dataclass(frozen=True)
class RetrievalConfig:
    corpus: str | None = None  # JSONL or folder; None with no index = the demo corpus
    index: str | None = None  # a saved index folder
    mode: str = "hybrid"  # bm25 | dense | hybrid
    top_k: int = 3  # hits handed to the context manager per retrieval
    embedding_model: str = "all-MiniLM-L6-v2"
    chunk_size: int | None = None  # None = the embedding model's max_seq_length
    overlap: int = 64
    bm25_backend: str = "bm25s"  # bm25s | rank_bm25
    bm25_method: str = "lucene"
    k1: float = 1.5
    b: float = 0.75
    dense_index: str = "flat"  # flat (exact) | hnsw | ivf
    rrf_k: int = 60
    bm25_top_k: int = 20
    dense_top_k: int = 20
    bm25_weight: float = 1.0
    dense_weight: float = 1.0


@dataclass(frozen=True)
class DeciderConfig:
    name: str = "prob"  # see rigkit.deciders.DECIDERS
    threshold: float | None = None  # None = the decider's own default
    params: dict[str, Any] = field(default_factory=dict)  # decider-specific options
    members: tuple[DeciderConfig, ...] = ()  # for composite
    combine: str = "any"  # composite: any | all | vote
    weights: tuple[float, ...] = ()  # composite vote weights
    trigger_model: str | None = None  # classifier decider: path of the trained model file
    entity_checklist: bool = False  # keep retrieving while a question entity is uncovered
    skip_if_no_entity: bool = False


@dataclass(frozen=True)
class QueryConfig:
    mode: str = "masked"  # marker | masked | rewrite | keywords | attention
    min_marker_words: int = 2  # marker phrases shorter than this fall back to rewrite
    max_words: int = 30  # rewrite output limit (words, or CJK characters)
    include_question: bool = True  # prefix masked/keyword queries with the question's key terms


@dataclass(frozen=True)
class ContextConfig:
    layout: str = "append"  # append (KV-cache friendly) | prefix (FLARE/DRAGIN style)
    max_retrieval_tokens: int = 4096
    max_passage_tokens: int = 256
    max_history_tokens: int = 2048
    language: str = "auto"  # auto | en | zh (injection template language)
    citations: bool = True  # render [[citation:ID]] in the answer
    marker_tag: str = "retrieve"
    system_prompt: str | None = None  # None = the built-in prompt for the decider


@dataclass(frozen=True)
class ControllerConfig:
    max_rounds: int = 3  # retrieval rounds; then the answer is finished from context
    policy: str = "auto"  # auto | continue | regenerate (auto: continue for marker, else regenerate)


@dataclass(frozen=True)
class RunConfig:
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    decider: DeciderConfig = field(default_factory=DeciderConfig)
    query: QueryConfig = field(default_factory=QueryConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        return _from_plain(cls, data, "config")

    @classmethod
    def from_yaml(cls, text: str) -> RunConfig:
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ConfigError("a run config must be a mapping of sections")
        return cls.from_dict(data)

    def override(self, **sections: dict[str, Any]) -> RunConfig:
        """A copy with some fields replaced: `cfg.override(decider={"name": "entropy"})`."""
        merged = self.to_dict()
        for section, values in sections.items():
            if section not in merged:
                raise ConfigError(f"unknown config section {section!r}")
            merged[section].update({k: v for k, v in values.items() if v is not None})
        return RunConfig.from_dict(merged)


def load_config(path: str | Path | None = None, **overrides: dict[str, Any]) -> RunConfig:
    """Defaults, then the YAML file at `path` (if any), then keyword overrides per section."""
    config = RunConfig()
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file not found: {path}")
        config = RunConfig.from_yaml(path.read_text(encoding="utf-8"))
    return config.override(**overrides) if overrides else config


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


def _from_plain(cls: type, data: Any, where: str) -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {sorted(names)}")
    kwargs = {}
    for key, value in data.items():
        kwargs[key] = _coerce(hints[key], value, f"{where}.{key}")
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _from_plain(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where) if len(inner) == 1 else value
    if origin is tuple:
        items = list(value or [])
        return tuple(_coerce(args[0], v, where) for v in items) if args else tuple(items)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
