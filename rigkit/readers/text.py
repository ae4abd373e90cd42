"""Plain text, Markdown and JSONL: the formats rigkit read before any other.

`.md` documents are split on headings by the chunker; a `.md` whose first heading is an H1 takes
it as its title. JSONL lines are `{"id", "title", "text", ...metadata}` (or FlashRAG's
`{"id", "contents": "\"Title\"\ntext"}`); every other field is kept as chunk metadata.
"""

from __future__ import annotations

from pathlib import Path

from rigkit.corpus import HEADING, Document, check_doc_id, split_contents
from rigkit.errors import CorpusError
from rigkit.files import jsonl_objects

__all__ = ["read_text", "read_markdown", "read_jsonl", "jsonl_document", "decode_text"]


def decode_text(data: bytes, name: str) -> str:
    """UTF-8 text of `data`; binary or other encodings are a `CorpusError` naming the file."""
    if b"\0" in data[:8192]:
        raise CorpusError(f"{name}: binary data, not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{name}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_text(data: bytes, name: str) -> list[Document]:
    return [Document(id=name, title=Path(name).stem, text=decode_text(data, name))]


def read_markdown(data: bytes, name: str) -> list[Document]:
    text = decode_text(data, name)
    title = Path(name).stem
    first = next((m for m in map(HEADING.match, text.splitlines()) if m), None)
    if first is not None and len(first.group(1)) == 1:
        title = first.group(2).strip()
    return [Document(id=name, title=title, text=text, markdown=True)]


def read_jsonl(data: bytes, name: str, path: Path | None = None) -> list[Document]:
    """One document per line; a malformed line is an error naming the file and line."""
    decode_text(data, name)  # binary data is one clear line, not a JSON error per line
    where = path if path is not None else Path(name)
    docs: list[Document] = []
    seen: dict[str, int] = {}
    for lineno, obj in jsonl_objects(data.decode("utf-8"), where):
        doc = jsonl_document(obj, where, lineno)
        if doc.id in seen:
            raise CorpusError(
                f"{where}, line {lineno}: duplicate id {doc.id!r} (first on line {seen[doc.id]})"
            )
        seen[doc.id] = lineno
        docs.append(doc)
    if not docs:
        raise CorpusError(f"{where}: no documents")
    return docs


def jsonl_document(obj: dict, where: Path, lineno: int) -> Document:
    """The document of one JSONL line's object; a missing text or a bad id names file and line."""
    title, text = obj.get("title") or "", obj.get("text")
    if text is None and isinstance(obj.get("contents"), str):
        title, text = split_contents(obj["contents"])
        title = obj.get("title") or title
    if not isinstance(text, str) or not text.strip():
        raise CorpusError(f"{where}, line {lineno}: missing or empty 'text'")
    doc_id = str(obj["id"]) if obj.get("id") not in (None, "") else f"{where.stem}-{lineno}"
    problem = check_doc_id(doc_id)
    if problem:
        raise CorpusError(f"{where}, line {lineno}: document id {doc_id!r} {problem}")
    meta = {k: v for k, v in obj.items() if k not in ("id", "title", "text", "contents")}
    markdown = meta.get("format") == "markdown"
    return Document(id=doc_id, title=str(title), text=text, metadata=meta, markdown=markdown)
