"""HTML through trafilatura (Apache-2.0): the main content, without navigation, menus and footers.

trafilatura's XML output keeps the structure this reader needs: `<head rend="hN">` headings
(which start sections), paragraphs, `<list>` items and `<table>` rows with their header cells,
so tables and lists reach the chunker whole. It needs `lxml_html_clean` installed beside it.
Page chrome (nav, aside, and a header or footer outside the article) is removed before
extraction: on small pages trafilatura falls back to keeping all text, chrome included.
"""

from __future__ import annotations

from pathlib import Path

from rigkit.corpus import Block, Document
from rigkit.errors import CorpusError

__all__ = ["read_html"]


def read_html(data: bytes, name: str) -> list[Document]:
    import trafilatura
    from lxml import etree

    if b"\0" in data[:8192]:
        raise CorpusError(f"{name}: binary data, not HTML")
    xml = trafilatura.extract(
        _without_chrome(data, name), output_format="xml", include_tables=True, include_comments=False,
        include_links=False, include_formatting=False, with_metadata=True,
    )
    if not xml:
        raise CorpusError(f"{name}: no readable text in the page")
    root = etree.fromstring(xml.encode("utf-8"))
    blocks = _blocks(root.find("main"))
    if not blocks:
        raise CorpusError(f"{name}: no readable text in the page")
    return [Document.from_blocks(name, (root.get("title") or "").strip() or Path(name).stem, blocks)]


_CHROME = ("//nav | //aside | //*[@role='navigation' or @role='complementary' or @role='banner'"
           " or @role='contentinfo'] | //header[not(ancestor::article or ancestor::main)]"
           " | //footer[not(ancestor::article or ancestor::main)]")


def _without_chrome(data: bytes, name: str):
    """The parsed page less its navigation, asides and site header and footer."""
    tree = _parsed(data, name)
    if tree is None:
        return data  # let extract() judge what cannot be parsed
    for element in tree.xpath(_CHROME):
        if element.getparent() is not None:
            element.drop_tree()
    return tree


def _parsed(data: bytes, name: str):
    """The page as lxml reads it, nested up to libxml2's huge-tree depth (trafilatura's own parse
    stops at 256 levels and drops the rest of the page silently); deeper is one error naming the file."""
    import lxml.html
    from trafilatura.utils import decode_file  # detects the encoding as extract() would

    parser = lxml.html.HTMLParser(huge_tree=True, remove_comments=True, remove_pis=True,
                                  collect_ids=False, default_doctype=False)
    try:
        tree = lxml.html.fromstring(decode_file(data), parser=parser)
    except Exception:  # noqa: BLE001 - an empty or unparsable page: extract() says what it finds
        return None
    if any("Excessive depth" in entry.message for entry in parser.error_log):
        raise CorpusError(f"{name}: elements nested too deeply for the HTML parser; the text past that "
                          "depth would be lost, so the page is skipped")
    return tree


def _blocks(main) -> list[Block]:
    blocks: list[Block] = []
    levels: list[tuple[int, str]] = []
    section: list[str] = []
    for element in main if main is not None else []:
        text = " ".join("".join(element.itertext()).split())
        if element.tag == "head":
            level = int((element.get("rend") or "h2").lstrip("h") or 2)
            levels = [(lv, t) for lv, t in levels if lv < level] + [(level, text)]
            section = [t for _, t in levels]
        elif element.tag == "table":
            rows = [["".join(c.itertext()) for c in row.iter("cell")] for row in element.iter("row")]
            if rows:
                blocks.append(Block.table(rows, section))
        elif element.tag == "list":
            blocks.append(Block.items(["".join(i.itertext()) for i in element.iter("item")], section))
        elif text:
            blocks.append(Block(text, section=section))
    return blocks
