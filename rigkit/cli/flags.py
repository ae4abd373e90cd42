"""Every command-line flag that sets a config key, listed once: its name, its `section.key`, its help.

How to add a flag that sets a config value:
  1. Add one `Flag` to `FLAGS` below: the name, the `section.key` it sets (the key must exist in
     rigkit/config.py), a short help without the default (`--help` appends the default read from
     the config), and `type` / `choices` / `metavar` as argparse takes them. A switch sets fixed
     values instead: `sets=(("generator.use_cache", False),)`.
  2. Give it to each command that takes it: `add_flags(parser, "--name", ...)`; a generator flag
     goes into `GENERATOR`, which every command that generates adds with `add_generator_flags`.
  3. Nothing else: `run_config(args)` turns every table flag given into a setting applied after
     the `--config` file and `--set` (so precedence lives in `rigkit.config.apply_settings`).
A flag name means one thing on every command; tests/test_cli_flags.py walks every parser to check
it and that each table flag's help shows the config's default. A renamed flag keeps its old
spelling for one release with `deprecated_alias` (hidden from --help, warns on stderr).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rigkit.config import Setting, config_default, default_text

__all__ = ["Flag", "FLAGS", "GENERATOR", "add_flags", "add_generator_flags", "add_source_flags",
           "flag_settings", "deprecated_alias"]


@dataclass(frozen=True)
class Flag:
    """One flag that sets a config key (or, a switch, fixed values of several)."""

    name: str
    key: str | None  # the section.key it sets; None for a switch (`sets`)
    help: str
    type: Any = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    sets: tuple[tuple[str, Any], ...] = ()  # a switch: the settings it stands for
    const: Any = None  # a value the flag takes when given bare (`--rerank`)
    repeat: bool = False  # repeatable: the values form a list (`--filter`)

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


_FLAGS = [
    # generator: what model, and where it runs
    Flag("--model", "generator.model", "short name, hub id or local path"),
    Flag("--backend", "generator.backend", "hf: in-process transformers; openai: a served model over "
         "/v1/completions (its tokenizer here); chat: any /v1/chat/completions server, no tokenizer here; "
         "ollama: chat at http://localhost:11434/v1", choices=("hf", "openai", "chat", "ollama")),
    Flag("--base-url", "generator.base_url", "the server's OpenAI API root, e.g. http://127.0.0.1:8000/v1"),
    Flag("--api-key-env", "generator.api_key_env", "environment variable holding the model server's API key",
         metavar="VAR"),
    Flag("--tokenizer", "generator.tokenizer", "the served model's tokenizer (hub id or path; null: --model)"),
    Flag("--top-logprobs", "generator.top_logprobs", "top-k log-probabilities per token from the server",
         type=int),
    Flag("--continuation", "generator.continuation", "chat server: how a partial answer goes on: the final "
         "assistant message where the server can (auto), always, or a new turn", choices=("auto", "continue", "new_turn")),
    Flag("--device", "generator.device", "auto|cpu|cuda|cuda:N|mps (in-process)"),
    Flag("--dtype", "generator.dtype", "weights' dtype (in-process)",
         choices=("auto", "float32", "bfloat16", "float16")),
    Flag("--quantize", "generator.quantize", "in-process on the CPU: int8 weights for the Linear layers "
         "(faster decode, answers may differ from float32)", choices=("none", "int8")),
    Flag("--device-map", "generator.device_map", "e.g. auto: shard a model over several GPUs (accelerate)"),
    Flag("--attn-implementation", "generator.attn_implementation", "sdpa | eager | flash_attention_2 ..."),
    Flag("--trust-remote-code", None, "run the model repository's own code (only for repositories you trust)",
         sets=(("generator.trust_remote_code", True),)),
    Flag("--no-cache", None, "do not reuse the KV cache across rounds", sets=(("generator.use_cache", False),)),
    Flag("--max-answer-tokens", "generator.max_answer_tokens", "the whole answer's token limit", type=int),
    # retrieval
    Flag("--corpus", "retrieval.corpus", "a JSONL file, a document (.pdf .docx .html .md .txt) or a folder "
         "of them; a command that needs an index builds one on first use (cached)"),
    Flag("--index", "retrieval.index", "a saved index folder (rigkit index build)", metavar="PATH"),
    Flag("--mode", "retrieval.mode", "bm25 | dense | hybrid", choices=("bm25", "dense", "hybrid")),
    Flag("--top-k", "retrieval.top_k", "hits per search", type=int),
    Flag("--bm25-backend", "retrieval.bm25_backend", "bm25s (sparse matrix) | rank_bm25 (reference)",
         choices=("bm25s", "rank_bm25")),
    Flag("--rerank", "retrieval.rerank", "rerank retrieval.rerank_candidates hits and keep top-k: upr (the "
         "generator scores log p(query | passage); a bare --rerank), none, or a cross-encoder hub id / path",
         metavar="upr|MODEL", const="upr"),
    Flag("--filter", "retrieval.filters", "search only chunks whose metadata passes, repeatable: lang=en, "
         "year>=1990, modified<2024-01-01, source=a.pdf,b.pdf (docs/retrieval.md)", metavar="KEY=VALUE",
         repeat=True),
    Flag("--embedding-model", "retrieval.embedding_model", "the dense model (an index built with another is "
         "refused)"),
    Flag("--chunk-size", "retrieval.chunk_size", "tokens per chunk (null and maximum: the embedding "
         "model's input limit, 256 for MiniLM)", type=int),
    Flag("--dense-backend", "retrieval.dense_backend", "where the vectors live: faiss (a file in the "
         "index folder) | milvus (a Milvus collection, docs/retrieval.md#milvus)", choices=("faiss", "milvus")),
    Flag("--milvus-uri", "retrieval.milvus_uri", "the Milvus server (null: http://127.0.0.1:19530)",
         metavar="URI"),
    Flag("--milvus-collection", "retrieval.milvus_collection", "the alias a build points at its collection "
         "(null: rigkit_ + the index folder's name)", metavar="NAME"),
    # decider, query, context, controller
    Flag("--decider", "decider.name", "marker|prob|entropy|keyword|classifier|composite|always|every_n|never "
         "(another decider starts the decider section from its defaults)"),
    Flag("--threshold", "decider.threshold", "the decider's threshold (null: its own default)", type=float),
    Flag("--calibration", "decider.calibration", "a `rigkit trigger calibrate --out` file: each decider it "
         "calibrated runs at the threshold chosen there on dev for this model (wins over --threshold)",
         metavar="FILE"),
    Flag("--trigger-model", "decider.trigger_model", "a trained trigger classifier file (.skops)"),
    Flag("--query-mode", "query.mode", "auto|marker|masked|rewrite|keywords|attention|multi "
         "(multi: up to query.max_subqueries searches, merged by RRF)"),
    Flag("--marker-protocol", "context.marker_protocol", "openrig | search-r1 | r1-searcher | self-rag | a "
         ".yaml/.json protocol file", metavar="NAME|PATH"),
    Flag("--layout", "context.layout", "passages after the draft (append, cache-friendly) or rebuilt in front "
         "of the question each round (prefix, FLARE/DRAGIN)", choices=("append", "prefix")),
    Flag("--grounded", None, "answer only from the passages and cite them as [n]; unseen citations are removed",
         sets=(("context.grounding", "strict"), ("context.cite", "model"))),
    Flag("--max-rounds", "controller.max_rounds", "retrieval rounds before finishing from context", type=int),
    Flag("--policy", "controller.policy", "after retrieval keep the sentence and continue, regenerate it, or "
         "rewind it to its first flagged word (needs --layout prefix; auto: the decider's own policy)",
         choices=("auto", "continue", "regenerate", "rewind")),
]
FLAGS: dict[str, Flag] = {flag.name: flag for flag in _FLAGS}

# where the model runs: on every command that generates
GENERATOR = ("--model", "--backend", "--base-url", "--api-key-env", "--tokenizer", "--top-logprobs",
             "--continuation", "--device", "--dtype", "--quantize", "--device-map", "--attn-implementation", "--trust-remote-code")


def help_text(flag: Flag) -> str:
    """The flag's help with what it sets and the config's default (never a literal)."""
    if flag.sets:
        return f"{flag.help} (sets {', '.join(f'{k}={default_text(v)}' for k, v in flag.sets)})"
    return f"{flag.help} ({flag.key}, default: {default_text(config_default(flag.key))})"


def add_flags(parser: argparse.ArgumentParser | Any, *names: str) -> None:
    """Add the table's flags `names` to `parser` (or an argument group of it); `run_config` reads them."""
    for name in names:
        flag = FLAGS[name]
        kwargs: dict[str, Any] = {"dest": flag.dest, "help": help_text(flag)}
        if flag.sets:
            kwargs.update(action="store_true", default=None)
        elif flag.repeat:
            kwargs.update(action="append", metavar=flag.metavar)
        else:
            kwargs.update(type=flag.type, choices=flag.choices, metavar=flag.metavar)
            if flag.const is not None:
                kwargs.update(nargs="?", const=flag.const)
        action = parser.add_argument(name, **kwargs)
        action.config_key = flag.key or ", ".join(k for k, _ in flag.sets)  # for tests/test_cli_flags.py
    # a group shares its parser's defaults, so this lands on the parser
    parser.set_defaults(table_flags=(*(parser.get_default("table_flags") or ()), *names))


def add_generator_flags(parser: argparse.ArgumentParser, leave_out: Iterable[str] = ()) -> None:
    """The generator flags (`GENERATOR`) in a group of their own; `leave_out`: names this command
    still gives another, deprecated meaning for one release."""
    group = parser.add_argument_group("generator", "what model, and where it runs (docs/models.md)")
    add_flags(group, *(n for n in GENERATOR if n not in set(leave_out)))


def add_source_flags(parser: argparse.ArgumentParser, index_help: str = "a saved index folder") -> None:
    """`--corpus`, `--index [NAME=]PATH`, `--retriever [NAME=]URL` (rigkit/cli/sources.py): one
    knowledge base, or several named ones (retrieval.sources); `flag_settings` reads them."""
    from rigkit.cli import sources

    sources.add_source_flags(parser, index_help)
    parser.set_defaults(source_flags=True)


def flag_settings(args: argparse.Namespace, leave_out: Iterable[str] = ()) -> list[Setting]:
    """The table flags given on the command line as settings, in the table's order."""
    settings: list[Setting] = []
    if getattr(args, "source_flags", False):
        from rigkit.cli.sources import source_overrides

        settings += [(f"retrieval.{key}", value, "--corpus" if key == "corpus" else "--index / --retriever")
                     for key, value in source_overrides(args).items() if value is not None]
    given = set(getattr(args, "table_flags", ())) - set(leave_out)
    for flag in _FLAGS:
        value = getattr(args, flag.dest, None) if flag.name in given else None
        if value is None:
            continue
        if flag.sets:
            settings += [(key, v, flag.name) for key, v in flag.sets]
        else:
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            settings.append((flag.key, value, f"{flag.name} {shown}"))
    return settings


class _Deprecated(argparse.Action):
    """An old spelling: warns on stderr, then stores into the new flag's destination."""

    def __init__(self, option_strings, dest, new: str = "", note: str = "", append: bool = False, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.note, self.append = new, note, append

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"rigkit: warning: {option_string} is deprecated{self.note}; use {self.new}",
              file=sys.stderr)
        if self.append:  # a repeatable flag: each use adds one, as the new spelling does
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, note: str = "") -> None:
    """Accept `old` for one release as `new` (already on `parser`), hidden from --help."""
    target = next(a for a in parser._actions if new in a.option_strings)
    nargs = 0 if isinstance(target, (argparse._StoreTrueAction, argparse._StoreConstAction)) else target.nargs
    parser.add_argument(old, action=_Deprecated, dest=target.dest, new=new, note=note, nargs=nargs,
                        const=target.const, type=target.type, choices=target.choices,
                        metavar=target.metavar, help=argparse.SUPPRESS,
                        append=isinstance(target, argparse._AppendAction))
