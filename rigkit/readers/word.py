"""Word `.docx` through python-docx (MIT): paragraphs, headings, lists and tables in body order.

A paragraph styled `Heading N` starts a section (its heading path is the chunk's `section`); the
`Title` style (or the core property) names the document. Consecutive list paragraphs (a `List`
style, or Word numbering) make one list block and every table one table block, so the chunker
keeps them whole. Text in headers, footers, text boxes and comments is not read.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

from rigkit.corpus import Block, Document
from rigkit.errors import CorpusError

__all__ = ["read_docx"]

_HEADING_STYLE = re.compile(r"^Heading (\d)$")


def read_docx(data: bytes, name: str) -> list[Document]:
    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from lxml import etree

    if not data.startswith(b"PK"):
        raise CorpusError(f"{name}: not a Word file")
    _check_inflated_size(data, name)
    try:
        document = docx.Document(io.BytesIO(data))
        title, blocks = _blocks(document)
        title = (document.core_properties.title or "").strip() or title
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError, OSError) as err:
        raise CorpusError(f"{name}: not a Word file: {type(err).__name__}") from None
    except etree.LxmlError as err:  # e.g. a text node over libxml2's limit
        raise CorpusError(f"{name}: its XML cannot be read ({str(err).splitlines()[0][:200]})") from None
    if not blocks:
        raise CorpusError(f"{name}: no text: an empty document")
    return [Document.from_blocks(name, title or Path(name).stem, blocks)]


MAX_INFLATED_BYTES = 128 * 2**20  # a .docx whose parts inflate beyond this is refused (a zip bomb)


def _check_inflated_size(data: bytes, name: str) -> None:
    """Refuse a file whose zip parts inflate beyond `MAX_INFLATED_BYTES`, before any is read."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            size = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, ValueError, OSError) as err:
        raise CorpusError(f"{name}: not a Word file: {type(err).__name__}") from None
    if size > MAX_INFLATED_BYTES:
        raise CorpusError(f"{name}: its parts inflate to {size / 2**20:.0f} MB, over the "
                          f"{MAX_INFLATED_BYTES // 2**20} MB a Word file may hold here")


def _blocks(document) -> tuple[str, list[Block]]:
    from docx.table import Table

    title, blocks, section, items = "", [], [], []
    levels: list[tuple[int, str]] = []

    def end_list() -> None:
        if items:
            blocks.append(Block.items(items, section))
            items.clear()

    for part in document.iter_inner_content():
        if isinstance(part, Table):
            end_list()
            rows = [[cell.text for cell in _unique(row.cells)] for row in part.rows]
            if any(any(c.strip() for c in row) for row in rows):
                blocks.append(Block.table(rows, section))
            continue
        text, style = part.text.strip(), (part.style.name if part.style is not None else "")
        if not text:
            continue
        heading = _HEADING_STYLE.match(style)
        if style == "Title" and not title:
            end_list()
            title = text
        elif heading:
            end_list()
            level = int(heading.group(1))
            levels = [(lv, t) for lv, t in levels if lv < level] + [(level, text)]
            section = [t for _, t in levels]
        elif style.startswith("List") or _numbered(part):
            items.append(text)
        else:
            end_list()
            blocks.append(Block(text, section=section))
    end_list()
    return title, blocks


def _numbered(paragraph) -> bool:
    # Word numbering lives in the paragraph's XML (w:numPr); python-docx has no property for it
    return bool(paragraph._p.xpath("./w:pPr/w:numPr"))


def _unique(cells):
    """A merged cell appears once per grid column it spans in python-docx: keep the first."""
    seen, out = set(), []
    for cell in cells:
        if id(cell._tc) not in seen:
            seen.add(id(cell._tc))
            out.append(cell)
    return out
