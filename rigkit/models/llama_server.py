"""llama.cpp's OpenAI-compatible server (llama-cpp-python's `llama_cpp.server`) with one model
parameter changed: `use_extra_bufts` off. With it on (llama.cpp's default), weights are repacked
for the CPU's AMX units where the CPU has them, and on such CPUs llama-cpp-python 0.3.36 crashes
(segmentation fault in `llama_decode`) on the first prompt longer than one token.

`python -m rigkit.models.llama_server <llama_cpp.server arguments>` runs it; `rigkit models serve`
builds the arguments (`--interrupt_requests false` among them: by default the server ends a
streaming reply early whenever another request arrives, so concurrent callers get cut replies)."""

from __future__ import annotations

import sys

__all__ = ["main", "server_args", "without_repacking", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'llama-cpp-python[server]==0.3.36' (or: pip install -e '.[dev]')"


def server_args(gguf: str, alias: str, host: str, port: int, n_ctx: int = 4096, threads: int | None = None) -> list[str]:
    """The `llama_cpp.server` arguments rigkit serves a GGUF with."""
    args = ["--model", gguf, "--model_alias", alias, "--host", host, "--port", str(port),
            "--logits_all", "true", "--n_ctx", str(n_ctx),
            "--interrupt_requests", "false"]  # requests queue instead of cutting each other off
    if threads is not None:
        args += ["--n_threads", str(threads)]
    return args


def without_repacking() -> None:
    """Make every llama.cpp model this process loads keep its weights unrepacked (the AMX crash)."""
    from llama_cpp import llama_cpp as capi

    defaults = capi.llama_model_default_params
    if getattr(defaults, "_rigkit_no_repack", False):
        return

    def params():
        made = defaults()
        made.use_extra_bufts = False
        return made

    params._rigkit_no_repack = True
    capi.llama_model_default_params = params


def main() -> None:
    without_repacking()
    from llama_cpp.server.__main__ import main as serve

    sys.argv[0] = "llama_cpp.server"
    serve()


if __name__ == "__main__":
    main()
