"""`rigkit serve` (HTTP: /chat, /v1/chat/completions, /rpc, /retrieve, /mcp) and `rigkit mcp` (stdio)."""

from __future__ import annotations

import argparse
import os
import sys

from rigkit.errors import InputError

__all__ = ["register"]

_LOCAL = ("127.0.0.1", "localhost", "::1")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the RIG loop over HTTP (OpenAI-compatible, JSON-RPC, MCP)")
    _common(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--max-queue", type=int, default=8, help="requests waiting for the model before 429")
    p.add_argument("--max-body-bytes", type=int, default=1_000_000, help="larger request bodies get 413")
    p.add_argument("--api-key-env", metavar="VAR", help="require 'Authorization: Bearer $VAR' on every route")
    p.add_argument("--no-mcp", action="store_true", help="do not mount the MCP server under /mcp")
    p.set_defaults(func=run_serve)
    m = sub.add_parser("mcp", help="an MCP server over stdio with the search and ask tools")
    _common(m)
    m.set_defaults(func=run_mcp)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a YAML run config (e.g. configs/cpu.yaml)")
    p.add_argument("--model", help="smollm2-135m-instruct (default), a hub id or a local path")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--corpus", help="JSONL or folder of .md/.txt (indexed on first use, cached)")
    source.add_argument("--index", help="a saved index folder")
    source.add_argument("--retriever", help="another retrieval server's URL, e.g. http://host:8100/retrieve")
    p.add_argument("--tool-result-tokens", type=int, help="cap on each tool result shown to the model "
                   "(default: the config's max_passage_tokens)")


def _service(args: argparse.Namespace, load_model: bool = True):
    from rigkit.config import load_config
    from rigkit.serve.service import RigService

    config = load_config(args.config).override(
        generator={"model": args.model},
        retrieval={"corpus": args.corpus, "index": args.index or args.retriever},
    )
    return RigService(config, max_queue=getattr(args, "max_queue", 8), tool_result_tokens=args.tool_result_tokens,
                      load_model=load_model)


def run_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from rigkit.serve.app import create_app
    except ImportError as err:
        raise InputError(f"rigkit serve needs the serve extra: pip install 'rigkit[serve]' ({err})") from err
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise InputError(f"--api-key-env {args.api_key_env}: that environment variable is empty or unset")
    if args.host not in _LOCAL:
        print(f"rigkit serve: binding to {args.host}: reachable from other machines"
              + ("" if api_key else " without authentication (see --api-key-env)"), file=sys.stderr)
    print(f"loading {args.model or 'the configured model'} and the index...", file=sys.stderr)
    service = _service(args)
    app = create_app(service, api_key=api_key, max_body_bytes=args.max_body_bytes, mcp=not args.no_mcp,
                     host=args.host)
    server = _draining_server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                             access_log=False, timeout_graceful_shutdown=None), service)
    print(f"rigkit serve: http://{args.host}:{args.port} (model {service.model_name})", file=sys.stderr, flush=True)
    server.run()
    return 0


def run_mcp(args: argparse.Namespace) -> int:
    try:
        from rigkit.serve.mcp_server import build_mcp
    except ImportError as err:
        raise InputError(f"rigkit mcp needs the serve extra: pip install 'rigkit[serve]' ({err})") from err
    # stdout is the protocol channel: nothing else may be printed there
    service = _service(args, load_model=False)  # the model loads at the first `ask`
    build_mcp(service).run("stdio")
    return 0


def _draining_server(config, service):
    """A uvicorn server that, on SIGTERM/SIGINT, refuses new requests (503), finishes in-flight
    ones (uvicorn waits for open connections), then exits."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            service.worker.drain()
            super().handle_exit(sig, frame)

    return DrainingServer(config)
