"""`rigkit serve`: the RIG loop as a service (HTTP, OpenAI-compatible, JSON-RPC, MCP).

`RigService` holds the loaded model and index and runs every question through the usual
controller on one worker thread; `create_app` is the FastAPI app over it; `build_mcp` the MCP
server (stdio or mounted under `/mcp`). Needs the `serve` extra: `pip install rigkit[serve]`.
"""

from __future__ import annotations

__all__ = ["RigService", "create_app", "build_mcp"]


def __getattr__(name: str):
    # lazy: importing rigkit.serve must not need FastAPI until an app is built
    if name == "RigService":
        from rigkit.serve.service import RigService

        return RigService
    if name == "create_app":
        from rigkit.serve.app import create_app

        return create_app
    if name == "build_mcp":
        from rigkit.serve.mcp_server import build_mcp

        return build_mcp
    raise AttributeError(name)
