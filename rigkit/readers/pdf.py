"""PDF through pypdf (BSD): text per page, paragraphs at blank lines, one block per paragraph.

pypdf reads the text layer only: a scanned or image-only PDF has none and is skipped with that
reason (OCR it first). An encrypted PDF opens only when its user password is empty. PDFs carry
no reliable headings, so their chunks have no section; every block records its 1-based page and
the chunker never lets a chunk span two pages, so `page` in a citation is exact.
"""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

from rigkit.corpus import Block, Document
from rigkit.errors import CorpusError

__all__ = ["read_pdf"]

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def read_pdf(data: bytes, name: str) -> list[Document]:
    from pypdf import PdfReader

    if b"%PDF-" not in data[:1024]:
        raise CorpusError(f"{name}: not a PDF file")
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its repair notes are not the user's
    reader = _library_call(name, lambda: PdfReader(io.BytesIO(data)))
    if reader.is_encrypted and not _library_call(name, lambda: reader.decrypt("")):
        raise CorpusError(f"{name}: encrypted, needs a password")
    blocks = []
    for number, page in enumerate(_library_call(name, lambda: list(reader.pages)), start=1):
        text = _library_call(name, page.extract_text) or ""
        blocks += [Block(p.strip(), page=number) for p in _PARAGRAPH_BREAK.split(text) if p.strip()]
    if not blocks:
        raise CorpusError(f"{name}: no text layer: image-only or scanned, run OCR first")
    title = str(_library_call(name, lambda: (reader.metadata or {}).get("/Title")) or "").strip()
    return [Document.from_blocks(name, title or Path(name).stem, blocks)]


def _library_call(name: str, call):
    """`call()`; what pypdf raises on a damaged file becomes one line naming the file."""
    from pypdf.errors import PyPdfError

    try:
        return call()
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, OSError,
            NotImplementedError) as err:
        raise CorpusError(f"{name}: not a readable PDF: {type(err).__name__}: {err}") from None
