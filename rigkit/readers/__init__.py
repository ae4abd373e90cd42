"""Readers: a corpus file or folder becomes `Document`s, one well-kept parser per format.

| suffix | library | structure kept |
| --- | --- | --- |
| `.pdf` | pypdf | page of every paragraph |
| `.docx` | python-docx | Heading styles, lists, tables |
| `.html`, `.htm` | trafilatura | h1-h6, lists, tables; navigation and footers dropped |
| `.md` | - | `#` headings |
| `.txt` | - | - |
| `.jsonl` | - | one document per line, its other fields as metadata |

Every document's metadata gains `source` (the file's path relative to the corpus root; a JSONL
line's own `source` field wins) and `modified` (the file's mtime, ISO 8601 UTC). A folder is read
recursively in sorted order; a file that cannot be read (encrypted or image-only PDF, corrupt
Word file, binary data, empty file) is skipped with one line naming it and why, and the read
reports it. A corpus that is a single file, or a folder where nothing could be read, is an error.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rigkit.corpus import Document, check_doc_id
from rigkit.errors import CorpusError
from rigkit.readers.pdf import read_pdf
from rigkit.readers.text import read_jsonl, read_markdown, read_text
from rigkit.readers.web import read_html
from rigkit.readers.word import read_docx

__all__ = ["READERS", "FileRead", "CorpusRead", "source_files", "read_files", "load_documents",
           "skip_summary"]

log = logging.getLogger(__name__)

Reader = Callable[[bytes, str], list[Document]]  # (file bytes, relative name) -> documents
READERS: dict[str, Reader] = {
    ".pdf": read_pdf,
    ".docx": read_docx,
    ".html": read_html,
    ".htm": read_html,
    ".md": read_markdown,
    ".txt": read_text,
    ".jsonl": read_jsonl,
}


@dataclass
class FileRead:
    """One corpus file: its content hash, its documents, or why it was skipped."""

    name: str  # path relative to the corpus root (a single-file corpus: the file name)
    sha256: str
    modified: str  # mtime, ISO 8601 UTC
    documents: list[Document] = field(default_factory=list)
    skipped: str | None = None  # the reason, when no document could be read
    kept: bool = False  # an incremental build keeps the old index's chunks of this file


@dataclass
class CorpusRead:
    files: list[FileRead]

    @property
    def documents(self) -> list[Document]:
        return [doc for f in self.files for doc in f.documents]

    @property
    def skipped(self) -> list[FileRead]:
        return [f for f in self.files if f.skipped]


def source_files(corpus: str | Path) -> list[tuple[Path, str]]:
    """(path, name relative to the corpus root) of every readable file, sorted."""
    corpus = Path(corpus)
    if corpus.is_dir():
        files = sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix.lower() in READERS)
        if not files:
            raise CorpusError(f"{corpus}: folder holds no {', '.join(READERS)} files")
        return [(p, p.relative_to(corpus).as_posix()) for p in files]
    if not corpus.exists():
        raise CorpusError(f"{corpus}: corpus not found")
    return [(corpus, corpus.name)]


def read_files(corpus: str | Path) -> CorpusRead:
    """Read every file of `corpus`, skipping the unreadable ones of a folder (one warning each).

    A single-file corpus that cannot be read raises its `CorpusError`."""
    corpus = Path(corpus)
    folder = corpus.is_dir()
    files: list[FileRead] = []
    for path, name in source_files(corpus):
        data = path.read_bytes()  # hashed and parsed from these bytes: never a later edit
        sha = hashlib.sha256(data).hexdigest()
        modified = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat(timespec="seconds")
        read = FileRead(name, sha, modified)
        try:
            read.documents = _read_one(path, data, name, modified, folder)
        except CorpusError as err:
            if not folder:
                raise
            read.skipped = _reason(str(err), name)
            log.warning("skipped %s: %s", name, read.skipped)
        files.append(read)
    if not any(f.documents for f in files):
        raise CorpusError(f"{corpus}: nothing could be indexed; skipped {skip_summary(files)}")
    _check_unique_ids(files)
    return CorpusRead(files)


def load_documents(path: str | Path) -> list[Document]:
    """Documents of a corpus file or folder (`read_files`; sorted, recursive).

    A file that cannot be read is an error; in a folder it is skipped with a warning."""
    return read_files(path).documents


def skip_summary(files: list[FileRead]) -> str:
    """`a.pdf (encrypted), b.docx (not a Word file)` for the skipped files."""
    return ", ".join(f"{f.name} ({f.skipped})" for f in files if f.skipped)


def _read_one(path: Path, data: bytes, name: str, modified: str, folder: bool) -> list[Document]:
    if not data.strip():
        raise CorpusError(f"{name}: empty file")
    reader = READERS.get(path.suffix.lower(), read_jsonl)  # a single file of another name: JSONL
    if reader is read_jsonl:  # errors name the file as given on a single-file corpus
        docs = read_jsonl(data, name, None if folder else path)
    else:
        problem = check_doc_id(name)
        if problem:
            raise CorpusError(f"{name}: file name as document id {name!r} {problem}")
        docs = reader(data, name)
    for doc in docs:
        doc.metadata.setdefault("source", name)
        doc.metadata.setdefault("modified", modified)
    return docs


def _reason(message: str, name: str) -> str:
    """The reason part of a reader's error: `name: reason` -> `reason`."""
    return message[len(name) + 2 :] if message.startswith(f"{name}: ") else message


def _check_unique_ids(files: list[FileRead]) -> None:
    seen: dict[str, str] = {}
    for f in files:
        for doc in f.documents:
            if seen.setdefault(doc.id, f.name) != f.name:
                raise CorpusError(
                    f"{f.name}: document id {doc.id!r} is also used in {seen[doc.id]}; "
                    "ids must be unique across the corpus"
                )
