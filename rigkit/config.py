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
    backend: str = "hf"  # hf (in-process transformers) | openai (an OpenAI-compatible server)
    # in-process placement (backend hf)
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps (auto: cuda, then mps, then cpu)
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (auto: float32 on cpu, bf16 on cuda)
    device_map: str | None = None  # e.g. "auto" to shard a model larger than one GPU
    attn_implementation: str = "sdpa"  # eager is switched on only for the attention pass
    trust_remote_code: bool = False  # run a hub model's own Python code (only if you trust it)
    # served model (backend openai)
    base_url: str | None = None  # e.g. http://127.0.0.1:8000/v1
    api_key_env: str | None = None  # name of the environment variable holding the API key
    tokenizer: str | None = None  # the served model's tokenizer (name or path); None = model
    top_logprobs: int = 20  # top-k log-probabilities per token (vLLM caps at --max-logprobs)
    request_timeout: float = 120.0  # seconds per request
    max_retries: int = 4  # on connection errors, 429 and 503, with exponential backoff


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
    marker_tag: str = "retrieve"  # shorthand: a custom <tag> for the openrig protocol
    marker_protocol: str = "openrig"  # openrig | search-r1 | r1-searcher | self-rag | a .yaml/.json file
    system_prompt: str | None = None  # None = the built-in prompt for the decider


@dataclass(frozen=True)
class ControllerConfig:
    max_rounds: int = 3  # retrieval rounds; then the answer is finished from context
    policy: str = "auto"  # auto | continue | regenerate (auto: the policy the decider declares)


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
    def from_yaml(cls, text: str, source: str = "config") -> RunConfig:
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{source}, line {mark.line + 1}" if mark is not None else source
            problem = getattr(err, "problem", None) or "not valid YAML"
            raise ConfigError(f"{where}: malformed YAML ({problem})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: a run config must be a mapping of sections")
        try:
            return _from_plain(cls, data, "config")
        except ConfigError as err:
            raise ConfigError(f"{source}: {str(err).removeprefix('config.')}") from None

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
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: cannot read the config file ({err})") from None
        config = RunConfig.from_yaml(text, str(path))
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
        low = _MINIMUMS.get(key)
        if low is not None and isinstance(kwargs[key], (int, float)) and kwargs[key] < low:
            raise ConfigError(f"{where}.{key}: must be at least {low}, got {kwargs[key]!r}")
    return cls(**kwargs)


# Counts that make no sense below a bound (a negative max_rounds would loop on no budget).
_MINIMUMS = {"max_rounds": 0, "top_k": 1, "max_answer_tokens": 1, "max_segment_tokens": 1,
             "max_retrieval_tokens": 0, "max_passage_tokens": 1, "max_history_tokens": 0,
             "overlap": 0, "bm25_top_k": 1, "dense_top_k": 1, "rrf_k": 0}


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
        if value is not None and not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {_shown(value)}")
        items = list(value or [])
        return tuple(_coerce(args[0], v, where) for v in items) if args else tuple(items)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    expected = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint)
    if origin is dict or hint is dict:
        expected = "a mapping"
        hint = dict
    if expected and (not isinstance(value, hint) or (hint is int and isinstance(value, bool))):
        raise ConfigError(f"{where}: expected {expected}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"
