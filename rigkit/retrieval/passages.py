"""Passages read in place from a JSONL corpus, one passage a line, by byte offset.

A FlashRAG / Search-R1 corpus (`{"id", "contents": "\\"Title\\"\\ntext"}` a line; 21M lines for
wiki-18) is larger than memory is worth spending on it. `scan_lines` reads the file once, checks
every line as `rigkit.readers` does (a JSON object with text, a usable and unique id; an error names
the file and line) and returns the byte offset where each passage line starts: passage i is the
i-th non-blank line, as FlashRAG's `datasets` loader numbers its rows. `LinePassages` is then a
`Sequence[Chunk]` of any length holding only those offsets (memory-mapped) and reading a passage
with one `pread` when a hit needs it. Each line is one chunk: its id is the line's own id (so
`/retrieve` answers Search-R1's ids as they are), its title and text as the readers split them.
"""

from __future__ import annotations

import json
import os
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from rigkit.corpus import Chunk
from rigkit.errors import CorpusError, IndexCorruptError
from rigkit.readers.text import jsonl_document

__all__ = ["LineScan", "scan_lines", "LinePassages"]


@dataclass
class LineScan:
    """`offsets` (n + 1,) int64: where passage i starts, then the file size, so passage i's
    bytes are offsets[i]:offsets[i + 1] (blank lines after it included). `lines` (n,) int64:
    each passage's 1-based line number, or None when no blank line shifts them (line i + 1)."""

    offsets: np.ndarray
    lines: np.ndarray | None


def scan_lines(path: str | Path, progress: bool = False) -> LineScan:
    """Check every line of the JSONL file at `path` and note where each passage starts."""
    from tqdm.auto import tqdm

    path = Path(path)
    offsets, lines, ids = array("q"), array("q"), array("q")
    at, blank = 0, False
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="scanning",
                                     disable=not progress, dynamic_ncols=True) as bar:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                doc_id = _document(line, path, lineno).id
                offsets.append(at)
                lines.append(lineno)
                ids.append(hash(doc_id))  # duplicates are found by sorting these, not by a 21M-id set
            else:
                blank = True
            at += len(line)
            if lineno % 65536 == 0:
                bar.update(at - bar.n)
        bar.update(at - bar.n)
    if not offsets:
        raise CorpusError(f"{path}: no passages")
    offsets.append(at)
    scan = LineScan(np.frombuffer(offsets, dtype=np.int64),
                    np.frombuffer(lines, dtype=np.int64) if blank else None)
    _check_unique(path, np.frombuffer(ids, dtype=np.int64), scan)
    return scan


def _document(data: bytes, path: Path, lineno: int):
    try:
        obj = json.loads(data)
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path}, line {lineno}: not UTF-8 text ({err.reason})") from None
    except json.JSONDecodeError as err:
        raise CorpusError(f"{path}, line {lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(obj, dict):
        raise CorpusError(f"{path}, line {lineno}: expected a JSON object")
    return jsonl_document(obj, path, lineno)


def _check_unique(path: Path, hashes: np.ndarray, scan: LineScan) -> None:
    """A duplicate id is an error naming both lines; equal hashes of different ids are not."""
    ordered = np.sort(hashes)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if not repeated.size:
        return
    passages = LinePassages(path, scan.offsets, scan.lines)
    first: dict[str, int] = {}
    for row in np.flatnonzero(np.isin(hashes, repeated)):
        chunk = passages[int(row)]
        lineno = passages.line_of(int(row))
        if chunk.chunk_id in first:
            raise CorpusError(f"{path}, line {lineno}: duplicate id {chunk.chunk_id!r} "
                              f"(first on line {first[chunk.chunk_id]})")
        first[chunk.chunk_id] = lineno


class LinePassages(Sequence[Chunk]):
    """The passages of a JSONL corpus as chunks, each read from the file when asked for."""

    def __init__(self, path: str | Path, offsets: np.ndarray, lines: np.ndarray | None = None):
        self.path = Path(path)
        self.offsets, self.lines = offsets, lines
        self._fd: int | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> Chunk: ...

    @overload
    def __getitem__(self, i: slice) -> list[Chunk]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"passage {i} of {n}")
        i %= n
        doc = self._read(i)
        return Chunk(chunk_id=doc.id, doc_id=doc.id, title=doc.title, text=doc.text, position=0, start=0,
                     end=len(doc.text), metadata=doc.metadata)

    def line_of(self, i: int) -> int:
        return int(self.lines[i]) if self.lines is not None else i + 1

    def row(self, i: int) -> dict[str, Any]:
        """Passage i's JSON object as the file has it (FlashRAG embeds its `contents` as they are)."""
        return json.loads(self._bytes(i))

    def _bytes(self, i: int) -> bytes:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        if self._fd is None:
            with self._lock:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self._fd, end - start, start)  # no shared file position: safe across threads
        if len(data) != end - start:
            raise IndexCorruptError(f"{self.path} ends before passage {i} (line {self.line_of(i)}): it "
                                    "changed since the index was attached")
        return data

    def _read(self, i: int):
        try:
            return _document(self._bytes(i), self.path, self.line_of(i))
        except CorpusError as err:
            raise IndexCorruptError(f"{err}: the corpus changed since the index was attached") from None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()
