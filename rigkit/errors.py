"""Typed, user-facing errors. The CLI prints their message on one line and exits with 2."""

from __future__ import annotations

__all__ = [
    "RigkitError",
    "InputError",
    "CorpusError",
    "IndexMismatchError",
    "ModelNotFoundError",
    "IndexCorruptError",
]


class RigkitError(Exception):
    """Base class for errors caused by input, files or environment, not by a bug."""


class InputError(RigkitError, ValueError):
    """A question, option or request that cannot be used (empty question, unknown decider...)."""


class CorpusError(RigkitError, ValueError):
    """A corpus file that cannot be read; the message names the file and line."""


class IndexMismatchError(RigkitError, ValueError):
    """A saved index built with other settings (embedding model, chunking) than asked for."""


class ModelNotFoundError(RigkitError, FileNotFoundError):
    """A model that is not installed here; the message says how to install it."""


class IndexCorruptError(RigkitError, ValueError):
    """A saved index whose files do not match its manifest (truncated, deleted, reordered, swapped).

    The message names the file and says how to rebuild; rigkit never answers from such an index."""
