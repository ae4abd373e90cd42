"""llama.cpp's OpenAI-compatible server (llama-cpp-python's `llama_cpp.server`) for the tests.

`python -m tests.llama_server <llama_cpp.server arguments>` runs `rigkit.models.llama_server`:
the server's own `main()` with weight repacking for AMX off (it crashes on AMX CPUs).
`running(gguf, alias, log)` starts it on a free loopback port and yields its `/v1` URL, with
`--interrupt_requests false`: by default the server ends a streaming reply early (`[DONE]` with no
finish reason, often before the first word) whenever another request arrives, so concurrent
callers (`rigkit eval` / `rigkit ladder` with `--concurrency` above 1) would get cut replies.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["running"]

START_LIMIT = 120  # seconds until /v1/models answers


@contextmanager
def running(gguf: str | Path, alias: str, log: Path, *extra: str) -> Iterator[str]:
    """The server on `gguf` serving it as `alias`, healthy; stopped on exit. RuntimeError (with the
    log's tail) when it exits or does not answer within START_LIMIT seconds."""
    from tests.conftest import free_port, stop_process, why_not_started

    port = free_port()
    cmd = [sys.executable, "-m", "tests.llama_server", "--model", str(gguf), "--model_alias", alias,
           "--host", "127.0.0.1", "--port", str(port), "--logits_all", "true", "--n_ctx", "4096",
           "--n_threads", "1",  # one thread: OpenMP workers spin badly on a shared 2-core machine
           "--interrupt_requests", "false", *extra]  # requests queue instead of cutting each other off
    root = Path(__file__).resolve().parents[1]
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        problem = why_not_started(url, process, START_LIMIT, lambda: log.read_text(errors="replace")[-2000:],
                                  name="llama.cpp's server", path="/models")
        if problem is not None:
            raise RuntimeError(problem)
        yield url
    finally:
        stop_process(process)


def main() -> None:
    from rigkit.models.llama_server import main as serve  # llama.cpp's server, AMX repacking off

    serve()


if __name__ == "__main__":
    main()
