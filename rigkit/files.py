"""Files in and out: JSON Lines with file-and-line errors, and atomic writes (temp file + rename)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rigkit.errors import CorpusError, RigkitError

__all__ = ["cache_root", "iter_jsonl", "jsonl_objects", "atomic_write", "atomic_write_text", "write_jsonl_atomic",
           "default_mode", "fault_point", "fsync_dir", "FAULT_ENV"]

# Fault injection for the kill tests: `RIGKIT_FAULT_AT=<step>[@<n>]` SIGKILLs the process the
# n-th time (default 1st) it reaches `fault_point("<step>")`. Unset, a fault point costs a lookup.
FAULT_ENV = "RIGKIT_FAULT_AT"
_fault_hits: dict[str, int] = {}


def fault_point(step: str) -> None:
    """Die here, as a kill would, if the environment asks for it (tests only)."""
    wanted = os.environ.get(FAULT_ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition("@")
    if name != step:
        return
    _fault_hits[step] = _fault_hits.get(step, 0) + 1
    if _fault_hits[step] >= int(nth or 1):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def fsync_dir(folder: str | Path) -> None:
    """Make a rename or new file in `folder` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def iter_jsonl(
    path: str | Path, error: type[RigkitError] = CorpusError, skip_bad: bool = False
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; a bad line raises `error` naming file and line.

    `skip_bad` skips lines that are not a JSON object instead (and reads undecodable bytes as
    U+FFFD): for files appended to while a process may be killed, whose last line can be torn."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace" if skip_bad else "strict")
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err
    yield from jsonl_objects(text, path, error, skip_bad)


def jsonl_objects(
    text: str, where: str | Path, error: type[RigkitError] = CorpusError, skip_bad: bool = False
) -> Iterator[tuple[int, dict[str, Any]]]:
    """`iter_jsonl` over text already read; `where` names the file in errors."""
    path = where
    # split at "\n" only: `str.splitlines` also splits at U+2028 or U+0085 inside a JSON string
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            if skip_bad:
                continue
            raise error(f"{path}, line {lineno}: not valid JSON ({err.msg})") from err
        if not isinstance(obj, dict):
            if skip_bad:
                continue
            raise error(f"{path}, line {lineno}: expected a JSON object")
        yield lineno, obj


def cache_root() -> Path:
    """Where rigkit keeps converted models and implicit indexes (`$RIGKIT_CACHE_DIR` overrides)."""
    override = os.environ.get("RIGKIT_CACHE_DIR")
    if override:
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("rigkit"))


@contextmanager
def atomic_write(path: str | Path, binary: bool = False) -> Iterator[Any]:
    """A file handle whose content replaces `path` only if the block finishes without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        fault_point("atomic:fsync")
        os.chmod(tmp, default_mode())  # mkstemp makes 0600; these are ordinary, shareable files
        os.replace(tmp, path)
        fault_point("atomic:renamed")
        fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Replace `path` with `text` atomically."""
    with atomic_write(path) as f:
        f.write(text)
    return Path(path)


def default_mode() -> int:
    """0o666 minus the process umask: the mode `open()` would have given a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_jsonl_atomic(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Write all records to a temporary file beside `path`, then rename it into place."""
    with atomic_write(path) as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
