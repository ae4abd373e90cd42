"""The `rigkit` command line: one module per command group, each with `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import sys

from rigkit.errors import RigkitError

__all__ = ["main"]

# Each module adds its sub-commands and sets `func(args) -> int` on its parsers.
COMMAND_MODULES = ("ask", "index", "trigger", "evaluate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rigkit", description="Retrieval-Interleaved Generation workbench"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"rigkit.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except RigkitError as err:
        print(f"rigkit: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rigkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
