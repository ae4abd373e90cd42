"""Chunking: one chunk file feeds both the BM25 and the vector index.

Documents are read by `rigkit.readers` (JSONL, `.md`, `.txt`, `.pdf`, `.docx`, `.html`;
`load_documents`), which builds on the `Document` and `Block` defined here.
Markdown is split on headings first (each chunk keeps its heading path); sections longer
than the budget fall back to overlapping fixed windows. Documents read as *blocks* (PDF, Word,
HTML: paragraphs, tables and lists, each with its heading path and page) are chunked by
structure: a new section or page starts a new chunk, small blocks of one section are packed
together, a table or list is never cut unless it alone exceeds the budget, and then a table is
split between rows with its header row repeated at the top of every piece (a list between items).
A chunk never spans two PDF pages, so its `page` is exact. Sizes are counted in the *embedding
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
from dataclasses import asdict, dataclass, field, replace
from itertools import groupby
from pathlib import Path
from typing import Any

from rigkit.config import RetrievalConfig
from rigkit.errors import InputError
from rigkit.files import iter_jsonl, write_jsonl_atomic
from rigkit.trace import Hit

__all__ = [
    "Block",
    "Document",
    "Chunk",
    "BLOCK_SEPARATOR",
    "HEADING",
    "check_doc_id",
    "held_to_corpus_rules",
    "corpus_fingerprint",
    "markdown_sections",
    "chunk_documents",
    "write_chunks",
    "read_chunks",
    "split_contents",
]

log = logging.getLogger(__name__)
_SPECIAL_TOKENS = 2  # [CLS] and [SEP] count against the embedding model's limit
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass
class Block:
    """A paragraph, table or list of a structured document, where it sits (section, page)."""

    text: str
    kind: str = "text"  # "text", "table" or "list"
    section: list[str] = field(default_factory=list)  # heading path, outermost first
    page: int | None = None  # 1-based PDF page
    # table: its rows as text lines, rows[0] the header; list: its items. Where a piece too
    # large for one chunk may be cut; `text` is "\n".join(rows).
    rows: list[str] = field(default_factory=list)

    @classmethod
    def table(cls, cells: Sequence[Sequence[str]], section: Sequence[str] = (), page=None) -> Block:
        """A table from rows of cell texts, written as `| a | b |` lines (first row: the header)."""
        rows = ["| " + " | ".join(" ".join(c.split()) for c in row) + " |" for row in cells]
        return cls("\n".join(rows), "table", list(section), page, rows)

    @classmethod
    def items(cls, items: Sequence[str], section: Sequence[str] = (), page=None) -> Block:
        """A list, one `- item` line per item."""
        rows = [f"- {' '.join(item.split())}" for item in items]
        return cls("\n".join(rows), "list", list(section), page, rows)


BLOCK_SEPARATOR = "\n\n"  # between blocks in a block document's `text`


@dataclass
class Document:
    id: str
    title: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    markdown: bool = False  # split on headings before windows
    blocks: list[Block] | None = None  # structured documents; `text` is their joined text

    @classmethod
    def from_blocks(cls, doc_id: str, title: str, blocks: Sequence[Block], **metadata) -> Document:
        blocks = [b for b in blocks if b.text.strip()]
        text = BLOCK_SEPARATOR.join(b.text for b in blocks)
        return cls(doc_id, title, text, dict(metadata), blocks=blocks)


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


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) of a FlashRAG / Search-R1 `contents` string: `"Title"\ntext`.

    The title is the first line, its surrounding quotes removed; no newline: no title."""
    head, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents.strip()
    title = head.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, rest.strip()


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


def held_to_corpus_rules(hit: Hit) -> Hit:
    """`hit` with ids a corpus would accept: an unusable chunk or document id (one that could
    close a citation tag, break a line or hide in a terminal) becomes `passage-<hash>`, the
    original kept in `metadata["original_id"]`. Every retriever's hits meet it: the context
    manager's, and a remote server's or a named source's where they come in."""
    fixes = {}
    for name in ("chunk_id", "doc_id"):
        value = getattr(hit, name)
        if check_doc_id(value) is not None:
            fixes[name] = "passage-" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    if not fixes:
        return hit
    log.warning("a retrieved passage's id %s (%s) was replaced by %s", ascii(hit.chunk_id)[:80],
                check_doc_id(hit.chunk_id) or check_doc_id(hit.doc_id), fixes.get("chunk_id", hit.chunk_id))
    metadata = {**hit.metadata, "original_id": hit.chunk_id}
    return replace(hit, **fixes, metadata=metadata)


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
        match = None if in_fence else HEADING.match(line.rstrip("\r\n"))
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
    if doc.blocks is not None:
        return _chunk_blocks(doc, tokenizer, chunk_size, overlap)
    sections = markdown_sections(doc.text) if doc.markdown else [([], 0, len(doc.text))]
    chunks: list[Chunk] = []
    for headings, s_start, s_end in sections:
        headings = [h for h in headings if h != doc.title]  # the H1 is usually the title itself
        budget = _budget(doc, headings, tokenizer, chunk_size, overlap)
        for start, end in _windows(doc.text[s_start:s_end], tokenizer, budget, overlap):
            chunks.append(_make_chunk(doc, headings, len(chunks), s_start + start, s_start + end))
    return chunks


def _budget(doc: Document, headings: list[str], tokenizer, chunk_size: int, overlap: int) -> int:
    """Body tokens a chunk of this section may hold, after the special tokens and the prefix."""
    probe = Chunk("", doc.id, doc.title, "", 0, 0, 0, headings)
    budget = chunk_size - _SPECIAL_TOKENS - _count(tokenizer, probe.index_text)
    if budget <= overlap:
        raise InputError(
            f"document {doc.id!r}: chunk_size {chunk_size} leaves {budget} tokens after the "
            f"title/heading prefix, not more than overlap {overlap}; raise chunk_size or lower overlap"
        )
    return budget


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _make_chunk(
    doc: Document,
    headings: list[str],
    position: int,
    start: int,
    end: int,
    text: str | None = None,
    page: int | None = None,
) -> Chunk:
    """`text` None: the source slice [start, end), whitespace trimmed (the span stays honest);
    given: a table piece that repeats its header row, which lies before the span."""
    if text is None:
        raw = doc.text[start:end]
        start += len(raw) - len(raw.lstrip())
        end -= len(raw) - len(raw.rstrip())
        text = doc.text[start:end]
    metadata = dict(doc.metadata)
    if page is not None:
        metadata["page"] = page
    if headings:
        metadata["section"] = " > ".join(headings)
    return Chunk(
        chunk_id=f"{doc.id}#{position}",
        doc_id=doc.id,
        title=doc.title,
        text=text,
        position=position,
        start=start,
        end=end,
        headings=list(headings),
        metadata=metadata,
    )


# A piece of a section: (start, end, own text or None for the source slice, may share a chunk)
_Piece = tuple[int, int, "str | None", bool]


def _chunk_blocks(doc: Document, tokenizer, chunk_size: int, overlap: int) -> list[Chunk]:
    """Structure-aware chunks of a block document: sections and pages never share a chunk."""
    spans, offset = [], 0
    for block in doc.blocks or []:
        spans.append((block, offset, offset + len(block.text)))
        offset += len(block.text) + len(BLOCK_SEPARATOR)
    chunks: list[Chunk] = []
    for (section, page), group in groupby(spans, key=lambda s: (tuple(s[0].section), s[0].page)):
        headings = [h for h in section if h != doc.title]
        budget = _budget(doc, headings, tokenizer, chunk_size, overlap)
        pieces: list[_Piece] = []
        for block, start, end in group:
            pieces += _block_pieces(doc.text, block, start, end, tokenizer, budget, overlap)
        for start, end, text in _pack(doc.text, pieces, tokenizer, budget):
            chunks.append(_make_chunk(doc, headings, len(chunks), start, end, text, page))
    return chunks


def _block_pieces(text: str, block: Block, start: int, end: int, tokenizer, budget: int,
                  overlap: int) -> list[_Piece]:
    if _count(tokenizer, text[start:end]) <= budget:
        return [(start, end, None, True)]
    if len(block.rows) > 1:
        return _row_pieces(block, start, tokenizer, budget, overlap)
    return [(start + s, start + e, None, False)
            for s, e in _windows(text[start:end], tokenizer, budget, overlap)]


def _row_pieces(block: Block, start: int, tokenizer, budget: int, overlap: int) -> list[_Piece]:
    """A table cut between rows, its header row on top of every piece; a list between items."""
    header = block.rows[0] if block.kind == "table" else None
    offsets, at = [], start  # each row's span in the document text
    for row in block.rows:
        offsets.append((at, at + len(row)))
        at += len(row) + 1
    body = list(zip(block.rows, offsets))[1 if header is not None else 0 :]
    pieces: list[_Piece] = []
    group: list[tuple[str, tuple[int, int]]] = []

    def flush() -> None:
        if not group:
            return
        lines = [row for row, _ in group]
        first = group[0][1][0]
        if header is not None and first == offsets[1][0]:
            pieces.append((offsets[0][0], group[-1][1][1], None, False))  # header in the slice
        else:
            own = "\n".join(([header] if header is not None else []) + lines)
            pieces.append((first, group[-1][1][1], own if header is not None else None, False))
        group.clear()

    for row, span in body:
        candidate = "\n".join(([header] if header else []) + [r for r, _ in group] + [row])
        if group and _count(tokenizer, candidate) > budget:
            flush()
        if _count(tokenizer, "\n".join(([header] if header else []) + [row])) > budget:
            # one row (or item) larger than a chunk on its own: windows over it, no header
            pieces += [(span[0] + s, span[0] + e, None, False)
                       for s, e in _windows(row, tokenizer, budget, overlap)]
            continue
        group.append((row, span))
    flush()
    return pieces


def _pack(text: str, pieces: list[_Piece], tokenizer, budget: int):
    """Join neighbouring small pieces of one section while they fit: (start, end, own text)."""
    current: list[int] | None = None
    for start, end, own, packable in pieces:
        if packable and current and _count(tokenizer, text[current[0] : end]) <= budget:
            current[1] = end
            continue
        if current:
            yield current[0], current[1], None
            current = None
        if packable:
            current = [start, end]
        else:
            yield start, end, own
    if current:
        yield current[0], current[1], None


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
