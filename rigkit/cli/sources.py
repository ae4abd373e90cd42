"""Where a command's passages come from: `--corpus`, `--index` and `--retriever`.

`--index PATH` (or `--retriever URL`) given once is the run's one knowledge base. Named, as
`--index NAME=PATH` / `--retriever NAME=URL`, each may be given several times: every one is a
source of `retrieval.sources`, searched as that file section describes.
"""

from __future__ import annotations

import argparse
from typing import Any

from rigkit.errors import InputError

__all__ = ["add_source_flags", "source_overrides"]


def add_source_flags(p: argparse.ArgumentParser, index_help: str = "a saved index folder") -> None:
    p.add_argument("--corpus", help="JSONL or folder of .md/.txt (indexed on first use, cached)")
    p.add_argument("--index", action="append", metavar="[NAME=]PATH",
                   help=f"{index_help}; NAME=PATH, repeatable, for several knowledge bases")
    p.add_argument("--retriever", action="append", metavar="[NAME=]URL",
                   help="a retrieval server's URL, e.g. http://127.0.0.1:8100/retrieve; NAME=URL, "
                        "repeatable, beside other sources")


def source_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The retrieval section's `corpus`, `index` or `sources` the flags give (None: not given)."""
    from rigkit.retrieval.sources import check_names, parse_named

    given = [("--index", v) for v in args.index or []] + [("--retriever", v) for v in args.retriever or []]
    if args.corpus and given:
        raise InputError(f"--corpus and {given[0][0]} both name where passages come from: give one")
    named = [(flag, *parse_named(value, flag)) for flag, value in given]
    if len(named) == 1 and named[0][1] is None:
        return {"corpus": args.corpus, "index": named[0][2]}
    plain = [f"{flag} {location}" for flag, name, location in named if name is None]
    if plain:
        raise InputError(f"{plain[0]}: with several sources, name each one (NAME=PATH or NAME=URL)")
    if named:
        check_names([name for _, name, _ in named])  # two sources of one name: refused now
    return {"corpus": args.corpus, "sources": [{"name": n, "index": loc} for _, n, loc in named] or None}
