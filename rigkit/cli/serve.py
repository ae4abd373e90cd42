"""`rigkit serve` (HTTP: /chat, /v1/chat/completions, /rpc, /retrieve, /mcp) and `rigkit mcp` (stdio)."""

from __future__ import annotations

import argparse
import os
import sys

from rigkit.cli.flags import add_generator_flags, add_source_flags, deprecated_alias
from rigkit.errors import InputError
from rigkit.serve.shutdown import DRAIN_SECONDS  # a constant; the server itself loads lazily

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the RIG loop over HTTP (OpenAI-compatible, JSON-RPC, MCP)")
    # --api-key-env is the server's own key here until its deprecated spelling goes: the model
    # server's key is --set generator.api_key_env=VAR meanwhile
    _common(p, leave_out=("--api-key-env",))
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--max-queue", type=int, default=8, help="requests waiting for a free worker before 429")
    p.add_argument("--workers", type=_positive, metavar="N",
                   help="RIG loops run at once, each with its own generator (default: 1 for an "
                        "in-process model, 8 for a served one, whose server batches their calls)")
    p.add_argument("--shutdown-timeout", type=_seconds, default=DRAIN_SECONDS, metavar="SECONDS",
                   help="on SIGTERM, how long in-flight requests may run on before they are cut "
                        f"(default {DRAIN_SECONDS:g}; a second signal exits at once)")
    p.add_argument("--max-body-bytes", type=int, default=1_000_000, help="larger request bodies get 413")
    p.add_argument("--server-key-env", metavar="VAR",
                   help="require 'Authorization: Bearer $VAR' on every route (VAR: an environment variable)")
    deprecated_alias(p, "--api-key-env", "--server-key-env",
                     " for serve (it names the model server's key on other commands)")
    p.add_argument("--no-mcp", action="store_true", help="do not mount the MCP server under /mcp")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a browser origin allowed to call the API, e.g. http://localhost:3000 (repeatable; "
                        "other pages' requests get 403)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="another name this server answers to in the Host header, e.g. behind a proxy "
                        "(repeatable; other names get 421)")
    p.add_argument("--access-log", default="-", metavar="FILE|-|off",
                   help="one line per request (id, route, status, ms, retrievals, tokens): appended to FILE, "
                        "- for stderr (default), off for none; metrics are at GET /metrics")
    p.set_defaults(func=run_serve)
    m = sub.add_parser("mcp", help="an MCP server over stdio with the search and ask tools")
    _common(m)
    m.set_defaults(func=run_mcp)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1")
    return value


def _seconds(text: str) -> float:
    value = float(text)  # a ValueError is argparse's "invalid value" line
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (>= 0)")
    return value


def _common(p: argparse.ArgumentParser, leave_out: tuple[str, ...] = ()) -> None:
    from rigkit.cli import add_config_options

    add_config_options(p)
    add_source_flags(p)
    p.add_argument("--tool-result-tokens", type=int, help="cap on each tool result shown to the model "
                   "(default: the config's max_passage_tokens)")
    add_generator_flags(p, leave_out)


def _config(args: argparse.Namespace):
    """The run config: defaults < --config < --set < the flags."""
    from rigkit.cli import run_config

    return run_config(args)


def _service(args: argparse.Namespace, load_model: bool = True, config=None):
    from rigkit.serve.service import RigService

    return RigService(config or _config(args), max_queue=getattr(args, "max_queue", 8),
                      workers=getattr(args, "workers", None), tool_result_tokens=args.tool_result_tokens,
                      load_model=load_model)


def run_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401 - checked here so a missing extra is one line, before loading

        from rigkit.serve.app import create_app
        from rigkit.serve.exposure import Exposure, is_loopback
        from rigkit.serve.shutdown import draining_server
    except ImportError as err:
        raise InputError(f"rigkit serve needs the serve extra: pip install 'rigkit[serve]' ({err})") from err
    from rigkit.serve.options import check_not_own_retriever, check_serve_options

    check_serve_options(port=args.port, max_body_bytes=args.max_body_bytes, max_queue=args.max_queue,
                        tool_result_tokens=args.tool_result_tokens)
    api_key = None
    if args.server_key_env:
        api_key = os.environ.get(args.server_key_env)
        if not api_key:
            raise InputError(f"--server-key-env {args.server_key_env}: that environment variable is empty or unset")
    try:
        exposure = Exposure(bind=args.host, hosts=tuple(args.allow_host), origins=tuple(args.allow_origin))
    except ValueError as err:
        raise InputError(str(err)) from err
    if not is_loopback(args.host):
        _warn_wide_bind(exposure, api_key is not None)
    _access_log(args.access_log)
    from rigkit.cli import check_model_path

    check_model_path(args.model)
    config = _config(args)  # a bad --config or --set is refused before anything loads
    retrieval = config.retrieval
    check_not_own_retriever([retrieval.index, *(s.index for s in retrieval.sources)], args.host, args.port)
    print(f"loading {config.generator.model} and the index...", file=sys.stderr)
    service = _service(args, config=config)
    app = create_app(service, api_key=api_key, max_body_bytes=args.max_body_bytes, mcp=not args.no_mcp,
                     host=args.host, exposure=exposure)
    server = draining_server(app, service, host=args.host, port=args.port, drain_seconds=args.shutdown_timeout)
    print(f"rigkit serve: http://{args.host}:{args.port} (model {service.model_name}, "
          f"{service.worker.workers} worker{'s' * (service.worker.workers > 1)})", file=sys.stderr, flush=True)
    server.run()
    return 0


def _access_log(where: str) -> None:
    """Where `rigkit.serve.access` lines go: a file (appended), stderr (-), or nowhere (off)."""
    import logging

    from rigkit.serve.metrics import ACCESS_LOG

    if where == "off":
        ACCESS_LOG.disabled = True
        return
    try:
        handler = logging.StreamHandler(sys.stderr) if where == "-" else logging.FileHandler(where, encoding="utf-8")
    except OSError as err:
        raise InputError(f"--access-log {where}: cannot write there ({err.strerror})") from None
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    ACCESS_LOG.addHandler(handler)
    ACCESS_LOG.setLevel(logging.INFO)
    ACCESS_LOG.propagate = False


def _warn_wide_bind(exposure, authenticated: bool) -> None:
    """Say loudly what binding beyond loopback exposes (the corpus, the model's time)."""
    names = ", ".join(sorted(exposure.served_names))
    lines = [f"rigkit serve: WARNING: binding to {exposure.bind}: reachable from other machines",
             f"  Host names served: {names}" + (" and IP addresses" if exposure.wildcard else "")
             + " (add others with --allow-host)"]
    if not authenticated:
        lines.append("  WARNING: no authentication: anyone who can reach this port can read the corpus and "
                     "run the model; set a key with --server-key-env VAR")
    print("\n".join(lines), file=sys.stderr)


def run_mcp(args: argparse.Namespace) -> int:
    try:
        from rigkit.serve.mcp_server import build_mcp
    except ImportError as err:
        raise InputError(f"rigkit mcp needs the serve extra: pip install 'rigkit[serve]' ({err})") from err
    # stdout is the protocol channel: nothing else may be printed there
    service = _service(args, load_model=False)  # the model loads at the first `ask`
    build_mcp(service).run("stdio")
    return 0

