"""Corpus loading and chunking: one chunk file feeds both the BM25 and the vector index.

Documents come from JSONL (`{"id", "title", "text", ...metadata}`) or a folder of `.md` / `.txt`
files. Markdown is split on headings first (each chunk keeps its heading path); sections longer
than the budget fall back to overlapping fixed windows. Sizes are counted in the *embedding
model's* tokens and include what the model sees around the body (`[CLS]`, `[SEP]`, the
"title > heading. " prefix), so no chunk is ever silently truncated by the embedder
(all-MiniLM-L6-v2 stops at 256 tokens). Window edges snap back to a word start where one is near.

Document ids are checked at load (`check_doc_id`): at most 256 printable characters, no
control, format or line-separator characters (no newlines, no terminal escape sequences), no
`[[` or `]]` (ids are printed inside citation tags), no leading or trailing space. A bad id is an
error naming the file and line, so nothing downstream has to encode ids.
"""

from __future__ import annotations

import hashlib
import logging
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rigkit.config import RetrievalConfig
from rigkit.errors import CorpusError, InputError
from rigkit.files import iter_jsonl, write_jsonl_atomic

__all__ = [
    "Document",
    "Chunk",
    "load_documents",
    "check_doc_id",
    "corpus_fingerprint",
    "markdown_sections",
    "chunk_documents",
    "write_chunks",
    "read_chunks",
]

log = logging.getLogger(__name__)
_SPECIAL_TOKENS = 2  # [CLS] and [SEP] count against the embedding model's limit
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass
class Document:
    id: str
    title: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    markdown: bool = False  # split on headings before windows


@dataclass
class Chunk:
    chunk_id: str  # "<doc_id>#<position>"
    doc_id: str
    title: str
    text: str
    position: int  # 0-based order within the document
    start: int  # character span of `text` in the source document: [start, end)
    end: int
    headings: list[str] = field(default_factory=list)  # Markdown heading path below the title
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return " > ".join(p for p in [self.title, *self.headings] if p)

    @property
    def index_text(self) -> str:
        """What both indexes see: `title + ". " + text` (the reference recipe), headings included."""
        return f"{self.prefix}. {self.text}" if self.prefix else self.text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Chunk:
        return cls(**data)


# ---------------------------------------------------------------- loading


def load_documents(path: str | Path) -> list[Document]:
    """Documents from a JSONL file, a `.md`/`.txt` file, or a folder of them (sorted, recursive)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in (".md", ".txt"))
        if not files:
            raise CorpusError(f"{path}: folder holds no .md or .txt files")
        docs = [_text_file(p, p.relative_to(path).as_posix()) for p in files]
        for doc in docs:
            problem = check_doc_id(doc.id)
            if problem:
                raise CorpusError(f"{path / doc.id}: file name as document id {doc.id!r} {problem}")
        return docs
    if not path.exists():
        raise CorpusError(f"{path}: corpus not found")
    if path.suffix.lower() in (".md", ".txt"):
        return [_text_file(path, path.name)]
    return _jsonl_documents(path)


MAX_ID_LENGTH = 256


def check_doc_id(doc_id: str) -> str | None:
    """Why `doc_id` is not a usable document id, or None when it is."""
    if len(doc_id) > MAX_ID_LENGTH:
        return f"is longer than {MAX_ID_LENGTH} characters"
    if doc_id != doc_id.strip():
        return "starts or ends with white space"
    bad = next((ch for ch in doc_id if unicodedata.category(ch)[0] in "CZ" and ch != " "), None)
    if bad is not None:
        return f"contains the control or separator character {bad!r}"
    if "[[" in doc_id or "]]" in doc_id:
        return "contains '[[' or ']]' (reserved for citation tags)"
    return None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err


def _text_file(path: Path, doc_id: str) -> Document:
    text = _read_text(path)
    markdown = path.suffix.lower() == ".md"
    title = path.stem
    if markdown:
        first = next((m for m in map(_HEADING.match, text.splitlines()) if m), None)
        if first is not None and len(first.group(1)) == 1:
            title = first.group(2).strip()
    return Document(id=doc_id, title=title, text=text, markdown=markdown)


def _jsonl_documents(path: Path) -> list[Document]:
    docs: list[Document] = []
    seen: dict[str, int] = {}
    for lineno, obj in iter_jsonl(path):
        text = obj.get("text")
        if not isinstance(text, str) or not text.strip():
            raise CorpusError(f"{path}, line {lineno}: missing or empty 'text'")
        doc_id = str(obj["id"]) if obj.get("id") not in (None, "") else f"{path.stem}-{lineno}"
        problem = check_doc_id(doc_id)
        if problem:
            raise CorpusError(f"{path}, line {lineno}: document id {doc_id!r} {problem}")
        if doc_id in seen:
            raise CorpusError(
                f"{path}, line {lineno}: duplicate id {doc_id!r} (first on line {seen[doc_id]})"
            )
        seen[doc_id] = lineno
        title = obj.get("title") or ""
        meta = {k: v for k, v in obj.items() if k not in ("id", "title", "text")}
        markdown = meta.get("format") == "markdown"
        docs.append(
            Document(id=doc_id, title=str(title), text=text, metadata=meta, markdown=markdown)
        )
    if not docs:
        raise CorpusError(f"{path}: no documents")
    return docs


def corpus_fingerprint(path: str | Path) -> str:
    """sha256 of the corpus bytes (a folder: of its relative paths and file bytes, in order)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


# ---------------------------------------------------------------- chunking


def markdown_sections(text: str) -> list[tuple[list[str], int, int]]:
    """(heading path, start, end) of each section body; headings inside code fences are text."""
    sections: list[tuple[list[str], int, int]] = []
    stack: list[tuple[int, str]] = []
    body_start, offset, in_fence = 0, 0, False
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else _HEADING.match(line.rstrip("\r\n"))
        if match:
            sections.append(([t for _, t in stack], body_start, offset))
            level = len(match.group(1))
            stack = [(lv, t) for lv, t in stack if lv < level] + [(level, match.group(2).strip())]
            body_start = offset + len(line)
        offset += len(line)
    sections.append(([t for _, t in stack], body_start, len(text)))
    return [(path, s, e) for path, s, e in sections if text[s:e].strip()]


def chunk_documents(
    docs: Sequence[Document],
    tokenizer: Any,
    chunk_size: int,
    overlap: int = RetrievalConfig.overlap,
    split: bool = True,
    progress: bool = False,
) -> list[Chunk]:
    """Chunks of every document, in document order. `split=False`: one chunk per document.

    `progress`: a tqdm bar over documents (a widget in a notebook)."""
    if chunk_size <= _SPECIAL_TOKENS or overlap < 0:
        raise InputError(f"chunk_size must exceed {_SPECIAL_TOKENS} and overlap be >= 0")
    from tqdm.auto import tqdm

    chunks: list[Chunk] = []
    for doc in tqdm(docs, desc="chunking", unit="doc", disable=not progress, dynamic_ncols=True):
        chunks.extend(_chunk_document(doc, tokenizer, chunk_size, overlap, split))
    return chunks


def _chunk_document(doc: Document, tokenizer, chunk_size: int, overlap: int, split: bool):
    if not split:
        return [_make_chunk(doc, [], 0, 0, len(doc.text))]
    sections = markdown_sections(doc.text) if doc.markdown else [([], 0, len(doc.text))]
    chunks: list[Chunk] = []
    for headings, s_start, s_end in sections:
        headings = [h for h in headings if h != doc.title]  # the H1 is usually the title itself
        probe = Chunk("", doc.id, doc.title, "", 0, 0, 0, headings)
        used = len(tokenizer(probe.index_text, add_special_tokens=False)["input_ids"])
        budget = chunk_size - _SPECIAL_TOKENS - used
        if budget <= overlap:
            raise InputError(
                f"document {doc.id!r}: chunk_size {chunk_size} leaves {budget} tokens after the "
                f"title/heading prefix, not more than overlap {overlap}; raise chunk_size or lower overlap"
            )
        for start, end in _windows(doc.text[s_start:s_end], tokenizer, budget, overlap):
            chunks.append(_make_chunk(doc, headings, len(chunks), s_start + start, s_start + end))
    return chunks


def _make_chunk(doc: Document, headings: list[str], position: int, start: int, end: int) -> Chunk:
    # Trim whitespace but keep the span honest: start/end always index the source text.
    raw = doc.text[start:end]
    start += len(raw) - len(raw.lstrip())
    end -= len(raw) - len(raw.rstrip())
    return Chunk(
        chunk_id=f"{doc.id}#{position}",
        doc_id=doc.id,
        title=doc.title,
        text=doc.text[start:end],
        position=position,
        start=start,
        end=end,
        headings=list(headings),
        metadata=dict(doc.metadata),
    )


def _windows(body: str, tokenizer, budget: int, overlap: int) -> Iterable[tuple[int, int]]:
    """Character spans of token windows of at most `budget` tokens, `overlap` tokens shared."""
    offsets = tokenizer(body, add_special_tokens=False, return_offsets_mapping=True, verbose=False)[
        "offset_mapping"
    ]
    n = len(offsets)
    if n <= budget:
        yield 0, len(body)
        return
    # A token starts a word when whitespace separates it from the previous one.
    word_start = [i == 0 or offsets[i][0] > offsets[i - 1][1] for i in range(n)] + [True]

    def snap(i: int, lowest: int) -> int:
        for j in range(i, max(lowest, 0) - 1, -1):
            if word_start[j]:
                return j
        return i  # no word start nearby (e.g. CJK text): cut between tokens

    start = 0
    while True:
        end = min(start + budget, n)
        if end < n:
            end = snap(end, max(start + 1, end - 24))
        yield offsets[start][0], offsets[end - 1][1]
        if end >= n:
            return
        # The next window starts at a word start at or after `end - overlap` (overlap <= asked).
        nxt = max(end - overlap, start + 1)
        start = next((j for j in range(nxt, end) if word_start[j]), nxt)


def write_chunks(path: str | Path, chunks: Iterable[Chunk]) -> None:
    """Write chunks as JSONL atomically (temp file in the same folder, fsync, then rename)."""
    write_jsonl_atomic(path, (chunk.to_dict() for chunk in chunks))


def read_chunks(path: str | Path) -> list[Chunk]:
    return [Chunk.from_dict(row) for _, row in iter_jsonl(path)]
