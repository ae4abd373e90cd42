"""The `rigkit` command line: one module per command group, each with `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from rigkit.errors import RigkitError

__all__ = ["main", "add_config_options", "run_config", "check_config", "check_text", "check_model_path",
           "check_out", "safe_terminal"]

# Each module adds its sub-commands and sets `func(args) -> int` on its parsers.
COMMAND_MODULES = ("ask", "compare", "index", "trigger", "evaluate", "markers", "serve", "config", "models")


class RigkitParser(argparse.ArgumentParser):
    """argparse without prefix matching: `--mode` must not be read as `--model`. Sub-command
    parsers are made with the parent's class, so every parser of the command line is one."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = RigkitParser(prog="rigkit", description="Retrieval-Interleaved Generation workbench")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback when a command fails")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"rigkit.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Input errors exit 2, any other failure 1, both as one line on stderr."""
    raw = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in raw  # anywhere on the line, so it works after a sub-command too
    if raw[:2] == ["eval", "merge"]:  # `rigkit eval merge` reads better; `eval` itself takes no verbs
        raw = ["eval-merge", *raw[2:]]
    args = build_parser().parse_args([a for a in raw if a != "--debug"])
    # rigkit shows its own progress; transformers' per-load "Loading weights" bars would break
    # into the streamed answer on the terminal.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        return int(args.func(args) or 0)
    except RigkitError as err:
        if debug:
            traceback.print_exc()
        print(f"rigkit: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rigkit: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the command-level guard: a bug is reported, not a traceback
        if debug:
            traceback.print_exc()
            return 1
        print(f"rigkit: error: {type(err).__name__}: {_one_line(err)} (run with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


if __name__ == "__main__":
    sys.exit(main())


# -- the run config: one pair of options for every command that loads a model or an index ---------

def add_config_options(parser: argparse.ArgumentParser, what: str = "") -> None:
    """`--config FILE` and repeatable `--set section.key=value`; `run_config(args)` reads them."""
    parser.add_argument("--config", metavar="FILE",
                        help=f"a YAML run config, e.g. configs/cpu.yaml{what} (docs/config.md)")
    parser.add_argument("--set", dest="settings", action="append", default=[],
                        metavar="SECTION.KEY=VALUE",
                        help="set one config key, e.g. --set retrieval.top_k=5 or --set "
                             "decider.params.threshold=0.3 (repeatable; over --config, under the "
                             "command's own flags)")


def run_config(args: argparse.Namespace, leave_out: tuple[str, ...] = ()):
    """Defaults < the `--config` file < `--set` < the command's table flags (rigkit/cli/flags.py,
    as settings; `leave_out`: flags the command applies itself), checked by `check_config`."""
    from rigkit.cli.flags import flag_settings
    from rigkit.config import apply_settings, load_config

    settings = [*getattr(args, "settings", []), *flag_settings(args, leave_out)]
    config = apply_settings(load_config(getattr(args, "config", None)), settings)
    check_config(config)
    return config


# -- checks every command runs before loading a model or an index ---------------------------------

def check_text(text: str, what: str = "the question") -> str:
    """Refuse text that is not valid UTF-8 (argv decoded with surrogateescape) or is empty."""
    from rigkit.text import check_question

    return check_question(text, what)


def check_model_path(spec: str | None) -> None:
    """A `--model` that is a local folder must hold a transformers model (config + weights) or a
    LoRA adapter (`adapter_config.json`, onto the base it names); `BASE+ADAPTER` must name the
    adapter's own base."""
    from pathlib import Path

    from rigkit.errors import InputError
    from rigkit.generation.adapters import adapter_spec, is_adapter_dir
    from rigkit.generation.loading import model_folder_problem

    if spec and ("+" in spec or is_adapter_dir(spec)):
        if adapter_spec(spec) is not None:  # refuses an unknown adapter or another base here
            return
    if not spec or not Path(spec).exists():
        return
    folder = Path(spec)
    if not folder.is_dir():
        raise InputError(f"--model {spec}: not a folder (expected a transformers model folder)")
    problem = model_folder_problem(folder)
    if problem:
        raise InputError(f"--model {spec} is not a model folder: {problem}")


def check_out(path: str, kind: str = "folder") -> None:
    """`--out` must be creatable and writable before any work starts (`kind`: folder | file)."""
    import os
    from pathlib import Path

    from rigkit.errors import InputError

    target = Path(path)
    if kind == "folder" and target.exists() and not target.is_dir():
        raise InputError(f"--out {path} exists and is not a folder")
    if kind == "file" and target.is_dir():
        raise InputError(f"--out {path} is a folder; give a file name")
    probe = target if kind == "folder" else target.parent
    existing = probe
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"--out {path}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"--out {path}: {existing} is not writable")


def safe_terminal(text: str) -> str:
    """Text from documents made safe to print: control characters (escape sequences) escaped."""
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in str(text))


def check_config(config) -> None:
    """What every command checks in a run config before anything loads: the decider's and the
    query mode's names, and the decider's params (named and typed as its constructor says)."""
    from rigkit.deciders import check_decider_name
    from rigkit.queries import check_query_mode

    check_decider_name(config.decider.name)
    check_query_mode(config.query.mode)
    check_decider_params(config.decider)


def check_decider_params(config) -> None:
    """Decider params named and typed as the decider's constructor says, before anything loads.

    `config` is a DeciderConfig; composite members are checked too. Only plain annotated types
    (int, float, bool, str and their optionals) are type-checked; other options pass through."""
    import inspect
    import types
    import typing

    from rigkit.config import ConfigError
    from rigkit.deciders import DECIDERS

    for member in config.members:
        check_decider_params(member)
    cls = DECIDERS.get(config.name)
    if cls is None:
        return
    accepted = inspect.signature(cls).parameters
    if any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        return
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: names are still checked
        hints = {}
    for key, value in config.params.items():
        if key not in accepted and not (config.trigger_model and key in ("embedder",)):
            known = [k for k in accepted if k not in ("self", "members", "generator", "model")]
            raise ConfigError(f"decider.params.{key}: decider {config.name!r} does not take it; "
                              f"its options: {', '.join(known)}")
        hint = hints.get(key)
        allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        plain = [t for t in allowed if t in (int, float, bool, str)]
        if not plain or (value is None and type(None) in allowed):
            continue
        ok = any(isinstance(value, t) and not (t is not bool and isinstance(value, bool))
                 for t in plain) or (float in plain and isinstance(value, int) and not isinstance(value, bool))
        if not ok:
            names = " or ".join(t.__name__ for t in plain)
            raise ConfigError(f"decider.params.{key}: expected {names}, got "
                              f"{type(value).__name__} {value!r}")


def check_index(path: str | None) -> None:
    """Open a local saved index (manifest, tokenizer version, file sizes and checksums) now, so
    a missing or damaged index is reported before a model spends seconds loading."""
    if not path:
        return
    from rigkit.retrieval.remote import is_remote

    if is_remote(path):
        return
    from rigkit.retrieval.index import Index

    Index.load(path)
