"""`rigkit config`: the run config a command would use (defaults < --config < --set), as YAML."""

from __future__ import annotations

import argparse
import sys

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    from rigkit.cli import add_config_options

    p = sub.add_parser("config", help="print the merged run config (or every key's reference)",
                       description="Print the run config that --config and --set give, as YAML "
                       "(a file other commands take with --config); checked as they check it.")
    add_config_options(p)
    p.add_argument("--markdown", action="store_true",
                   help="print the reference of every key instead (docs/config.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rigkit.cli import run_config
    from rigkit.config import config_reference

    if args.markdown:
        sys.stdout.write(config_reference())
        return 0
    sys.stdout.write(run_config(args).to_yaml())
    return 0
