"""How an index folder reaches disk and is checked when read back.

Swap: the new index is written into a temporary sibling folder, every file and the folder are
fsync'ed, then the folder is *exchanged* with the old one in one `renameat2(RENAME_EXCHANGE)`
call, so a reader opening the path at any instant finds the old index or the new one, whole.
Where the exchange is not available (not Linux, or a file system without it) the old folder is
renamed aside and the new one renamed in; a kill between those two renames leaves the old index
beside the path, and `recover()` (run by every build and load) puts it back. Leftovers of
builds whose process is gone are removed by the next build.

Integrity: the manifest lists every file with its size and SHA-256. Sizes are checked at every
load; full hashes at the first load of an index in a process when the index is small enough to
hash quickly (`HASH_ON_LOAD_BYTES`), and always by `rigkit index verify`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rigkit.errors import IndexCorruptError
from rigkit.files import fault_point, fsync_dir

__all__ = ["HASH_ON_LOAD_BYTES", "file_table", "verify_files", "atomic_dir", "recover"]

# SHA-256 runs at roughly 0.5-1 GB/s on one core here: 256 MB hash in well under a second.
HASH_ON_LOAD_BYTES = 256 * 1024 * 1024
_VERIFIED: set[tuple[str, str]] = set()  # (index path, manifest digest) hashed in this process
_RENAME_EXCHANGE = 2


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_table(folder: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {"bytes", "sha256"}} for every file under `folder` but the manifest."""
    return {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def verify_files(folder: Path, manifest: dict[str, Any], full: bool | None = None) -> None:
    """Raise IndexCorruptError naming the first file that is missing, resized or changed.

    `full=None`: hash on the first load in this process if the index is small enough."""
    table = manifest.get("files")
    if not isinstance(table, dict) or not table:
        raise IndexCorruptError(f"{folder}/manifest.json lists no files; {rebuild_hint(folder, manifest)}")
    for name, entry in table.items():
        path = folder / name
        if not path.is_file():
            raise IndexCorruptError(f"{path} is missing; {rebuild_hint(folder, manifest)}")
        if path.stat().st_size != entry.get("bytes"):
            raise IndexCorruptError(
                f"{path} has {path.stat().st_size} bytes, the manifest says {entry.get('bytes')}; "
                f"{rebuild_hint(folder, manifest)}"
            )
    key = (str(folder.resolve()), hashlib.sha256(repr(sorted(table.items())).encode()).hexdigest())
    if full is None:
        full = key not in _VERIFIED and sum(e["bytes"] for e in table.values()) <= HASH_ON_LOAD_BYTES
    if not full:
        return
    for name, entry in table.items():
        if _sha256(folder / name) != entry.get("sha256"):
            raise IndexCorruptError(
                f"{folder / name} does not match its checksum in the manifest (edited, reordered "
                f"or swapped); {rebuild_hint(folder, manifest)}"
            )
    _VERIFIED.add(key)


def rebuild_hint(folder: Path, manifest: dict[str, Any]) -> str:
    if manifest.get("kind") == "attached":  # it references a faiss file and a corpus: attach again
        from rigkit.retrieval.attach import reattach_hint

        return reattach_hint(folder, manifest)
    corpus = (manifest.get("corpus") or {}).get("name", "CORPUS")
    milvus = (manifest.get("dense") or {}).get("milvus")
    backend = f" --dense-backend milvus --milvus-uri {milvus.get('uri')}" if isinstance(milvus, dict) else ""
    return f"rebuild with `rigkit index build --corpus {corpus} --out {folder}{backend}`"


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    done = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    return done == 0


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover(target: Path) -> None:
    """Put back an index left beside `target` by a kill mid-swap; drop dead builds' leftovers."""
    parent = target.parent
    if not parent.is_dir():
        return
    for side in sorted(parent.glob(f".{target.name}.old-*")):
        if not target.exists() and (side / "manifest.json").exists():
            os.replace(side, target)  # the fallback swap was killed between its two renames
        elif not _pid_alive(_pid_of(side)):
            shutil.rmtree(side, ignore_errors=True)
    for side in parent.glob(f".{target.name}.building-*"):
        if not _pid_alive(_pid_of(side)):
            shutil.rmtree(side, ignore_errors=True)


def _pid_of(side: Path) -> int:
    try:
        return int(side.name.rsplit("-", 2)[-2])
    except (IndexError, ValueError):
        return -1


class atomic_dir:
    """Context manager: yields a temp folder beside `target`; on success it replaces `target`."""

    def __init__(self, target: Path, overwrite: bool = True):
        self.target = target
        self.overwrite = overwrite

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        recover(self.target)
        self.tmp = Path(tempfile.mkdtemp(dir=self.target.parent,
                                         prefix=f".{self.target.name}.building-{os.getpid()}-"))
        os.chmod(self.tmp, 0o755)  # mkdtemp makes it private; an index is an ordinary folder
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        try:
            self._swap()
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def _swap(self) -> None:
        for path in sorted(self.tmp.rglob("*")):
            if path.is_file():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
            fault_point("index:fsync-file")
        for folder in [*sorted(p for p in self.tmp.rglob("*") if p.is_dir()), self.tmp]:
            fsync_dir(folder)
        fault_point("index:fsync-dir")
        if not self.overwrite and (self.target / "manifest.json").exists():
            shutil.rmtree(self.tmp, ignore_errors=True)  # another process finished first
            return
        parent = self.target.parent
        if self.target.exists() and _exchange(self.tmp, self.target):
            fault_point("index:exchanged")
            fsync_dir(parent)
            fault_point("index:fsync-parent")
            shutil.rmtree(self.tmp, ignore_errors=True)  # the old index, now at the temp name
            return
        old = None
        if self.target.exists():  # no exchange here: swap aside; recover() undoes a kill now
            old = parent / f".{self.target.name}.old-{os.getpid()}-{time.time_ns()}"
            os.replace(self.target, old)
            fault_point("index:old-aside")
        try:
            os.replace(self.tmp, self.target)
        except BaseException:
            if old is not None:
                os.replace(old, self.target)
            raise
        fault_point("index:renamed")
        fsync_dir(parent)
        fault_point("index:fsync-parent")
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
