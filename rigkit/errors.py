"""Typed, user-facing errors. The CLI prints their message on one line and exits with 2."""

from __future__ import annotations

__all__ = [
    "RigkitError",
    "InputError",
    "RunStateError",
    "CorpusError",
    "IndexMismatchError",
    "ModelNotFoundError",
    "IndexCorruptError",
    "UpstreamError",
]


class RigkitError(Exception):
    """Base class for errors caused by input, files or environment, not by a bug."""


class InputError(RigkitError, ValueError):
    """A question, option or request that cannot be used (empty question, unknown decider...)."""


class RunStateError(InputError):
    """A saved run that cannot be restored: malformed, tampered with, or saved by another controller
    or for another question."""


class CorpusError(RigkitError, ValueError):
    """A corpus file that cannot be read; the message names the file and line."""


class IndexMismatchError(RigkitError, ValueError):
    """A saved index built with other settings (embedding model, chunking) than asked for."""


class ModelNotFoundError(RigkitError, FileNotFoundError):
    """A model that is not installed here; the message says how to install it."""


class IndexCorruptError(RigkitError, ValueError):
    """A saved index whose files do not match its manifest (truncated, deleted, reordered, swapped).

    The message names the file and says how to rebuild; rigkit never answers from such an index."""


class UpstreamError(RigkitError):
    """A server rigkit calls (a model or retrieval server) failed; the message names it and its URL.

    `timed_out`: it missed the call's deadline (a service answers 504), else it failed (502);
    `status`: the HTTP status it answered, when it answered one."""

    def __init__(self, message: str, *, timed_out: bool = False, status: int | None = None):
        super().__init__(message)
        self.timed_out, self.status = timed_out, status
