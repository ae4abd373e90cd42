"""Ingestion of PDF, Word, HTML and Markdown files made here: structure-aware chunks, their
metadata, bad files skipped with a summary, and rebuilds that re-embed only what changed."""

from __future__ import annotations

import json
import logging
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from rigkit.citations import source_label
from rigkit.corpus import Block, Document, chunk_documents
from rigkit.embeddings import load_tokenizer
from rigkit.errors import CorpusError
from rigkit.readers import read_files
from rigkit.retrieval import Index

try:
    from tests.conftest_retrieval import HashEmbedder
except ImportError:  # pytest run without the repo root on sys.path
    from conftest_retrieval import HashEmbedder

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$")


# ------------------------------------------------------------------ real files, made here


def write_pdf(path: Path, pages: list[str]) -> Path:
    """A PDF with a real text layer, one string per page (matplotlib, TrueType fonts embedded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(path) as pdf:
        for text in pages:
            fig = plt.figure(figsize=(8.5, 11))
            fig.text(0.08, 0.92, text, va="top", fontsize=11)
            pdf.savefig(fig)
            plt.close(fig)
    return path


def write_encrypted_pdf(path: Path, source: Path) -> Path:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(source))
    writer.encrypt(user_password="secret", owner_password="owner-secret")
    with open(path, "wb") as f:
        writer.write(f)
    return path


def write_image_pdf(path: Path) -> Path:
    """A PDF whose only content is a picture, like a scan: no text layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig = plt.figure(figsize=(4, 4))
    fig.figimage(np.random.default_rng(0).random((64, 64)))
    fig.savefig(path, format="pdf")
    plt.close(fig)
    return path


def write_docx(path: Path) -> Path:
    """A Word file with a title, two headings, a paragraph, a bulleted list and a table."""
    import docx

    document = docx.Document()
    document.add_heading("Expense handbook", level=0)
    document.add_heading("Travel", level=1)
    document.add_paragraph("Trains are booked through the travel desk at least a week ahead.")
    for item in ("Keep every receipt", "Submit claims within 30 days", "Use the company card"):
        document.add_paragraph(item, style="List Bullet")
    document.add_heading("Allowances", level=2)
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "City", "Daily allowance"
    for city, amount in (("Berlin", "45 EUR"), ("Paris", "52 EUR"), ("Vienna", "48 EUR")):
        cells = table.add_row().cells
        cells[0].text, cells[1].text = city, amount
    document.save(path)
    return path


HTML_PAGE = """<!doctype html><html><head><title>Office guide</title></head><body>
<nav><ul><li><a href="/">Home</a></li><li><a href="/jobs">Careers menu link</a></li></ul></nav>
<main><article>
<h1>Office guide</h1>
<p>The office opens at eight in the morning and the front desk signs in every visitor who
arrives before nine. This paragraph is long enough to be kept as the page's main content.</p>
<h2>Meeting rooms</h2>
<p>Meeting rooms are booked in the calendar; a booking lapses when nobody arrives in ten minutes.</p>
<table><tr><th>Room</th><th>Seats</th></tr><tr><td>Aurora</td><td>12</td></tr>
<tr><td>Borealis</td><td>6</td></tr></table>
</article></main>
<footer>Copyright Example Corp. Footer links: privacy, imprint, cookie settings.</footer>
</body></html>
"""

PDF_PAGES = ["The warranty of every kettle lasts two years from the day of purchase.",
             "Returns are accepted within 30 days of delivery with the original receipt."]


def make_corpus(folder: Path, bad: bool = True) -> Path:
    """A folder with one file of each readable kind, and (with `bad`) four unreadable ones."""
    folder.mkdir(parents=True, exist_ok=True)
    write_pdf(folder / "handbook.pdf", PDF_PAGES)
    write_docx(folder / "expenses.docx")
    (folder / "web").mkdir(exist_ok=True)
    (folder / "web" / "office.html").write_text(HTML_PAGE, encoding="utf-8")
    (folder / "notes.md").write_text("# Notes\n\n## Install\n\nRun make install.\n", encoding="utf-8")
    if bad:
        write_encrypted_pdf(folder / "locked.pdf", folder / "handbook.pdf")
        write_image_pdf(folder / "scan.pdf")
        (folder / "empty.txt").write_text("", encoding="utf-8")
        (folder / "broken.docx").write_bytes(os.urandom(2048))
    return folder


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("all-MiniLM-L6-v2")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("ingest") / "docs")


@pytest.fixture(scope="module")
def chunks(corpus, tokenizer):
    return chunk_documents(read_files(corpus).documents, tokenizer, chunk_size=256, overlap=64)


def of(chunks, source):
    return [c for c in chunks if c.metadata["source"] == source]


# ------------------------------------------------------------------ chunks and metadata


def test_pdf_chunks_carry_their_page(chunks):
    pdf = of(chunks, "handbook.pdf")
    assert [c.metadata["page"] for c in pdf] == [1, 2]  # a chunk never spans two pages
    assert "two years" in pdf[0].text and "30 days" in pdf[1].text
    assert "section" not in pdf[0].metadata and pdf[0].title == "handbook"


def test_every_chunk_names_its_file_and_time(corpus, chunks):
    assert {c.metadata["source"] for c in chunks} == {
        "handbook.pdf", "expenses.docx", "web/office.html", "notes.md"}
    for chunk in chunks:
        assert ISO_UTC.match(chunk.metadata["modified"]), chunk.metadata
    mtime = datetime.fromtimestamp((corpus / "notes.md").stat().st_mtime, timezone.utc)
    assert of(chunks, "notes.md")[0].metadata["modified"] == mtime.isoformat(timespec="seconds")
    assert of(chunks, "notes.md")[0].metadata["section"] == "Install"


def test_docx_headings_start_sections_and_keep_the_list_and_table_whole(chunks):
    word = of(chunks, "expenses.docx")
    assert {c.title for c in word} == {"Expense handbook"}  # the Title style names the document
    travel = [c for c in word if c.metadata["section"] == "Travel"]
    assert len(travel) == 1 and "travel desk" in travel[0].text
    assert "- Keep every receipt\n- Submit claims within 30 days\n- Use the company card" in travel[0].text
    table = [c for c in word if c.metadata["section"] == "Travel > Allowances"]
    assert [c.text for c in table] == [
        "| City | Daily allowance |\n| Berlin | 45 EUR |\n| Paris | 52 EUR |\n| Vienna | 48 EUR |"]


def test_html_drops_navigation_and_footer_and_keeps_the_table(chunks):
    page = of(chunks, "web/office.html")
    text = "\n".join(c.text for c in page)
    assert "Careers menu" not in text and "Footer links" not in text
    assert "front desk" in text and page[0].title == "Office guide"
    rooms = [c for c in page if c.metadata.get("section") == "Meeting rooms"]
    assert "| Room | Seats |\n| Aurora | 12 |\n| Borealis | 6 |" in rooms[0].text


SMALL_PAGES = {
    "faq.html": """<html><head><title>Narwhal FAQ</title></head><body>
<header>Sea Life Site</header><nav>Home | About</nav>
<main><h1>Narwhal FAQ</h1><p>The narwhal's tusk is a tooth.</p></main>
<aside>Related: walrus pages</aside><footer>Copyright Sea Life</footer></body></html>""",
    "roles.html": """<html><head><title>Walrus</title></head><body>
<div role="navigation">Menu: seals, whales</div><div role="banner">Banner slogan</div>
<article><header><h1>Walrus</h1></header><p>A walrus weighs up to 1.5 tonnes.</p></article>
<div role="contentinfo">Imprint and privacy</div></body></html>""",
    "zh.html": """<html><head><title>独角鲸</title></head><body><nav>首页 | 关于我们</nav>
<main><p>独角鲸的长牙其实是一颗牙齿。</p></main><footer>版权所有</footer></body></html>""",
}


def test_small_pages_lose_their_nav_header_footer_and_aside(tmp_path, tokenizer):
    for name, page in SMALL_PAGES.items():
        (tmp_path / name).write_text(page, encoding="utf-8")
    pages = chunk_documents(read_files(tmp_path).documents, tokenizer, chunk_size=256, overlap=0)
    text = {s: " ".join(c.text for c in pages if c.metadata["source"] == s) for s in SMALL_PAGES}
    assert text["faq.html"] == "The narwhal's tusk is a tooth."
    assert text["roles.html"] == "A walrus weighs up to 1.5 tonnes."
    assert text["zh.html"] == "独角鲸的长牙其实是一颗牙齿。"
    assert {c.title for c in pages} == {"Narwhal FAQ", "Walrus", "独角鲸"}


def test_a_table_larger_than_a_chunk_is_split_by_rows_with_its_header(tokenizer):
    rows = [["Part number", "Description"]] + [[f"P-{i:03d}", f"spare part number {i} for the pump"]
                                               for i in range(80)]
    doc = Document.from_blocks("parts.pdf", "Parts", [Block("Intro line.", page=1),
                                                      Block.table(rows, page=1)])
    chunks = chunk_documents([doc], tokenizer, chunk_size=96, overlap=16)
    pieces = [c for c in chunks if c.text.startswith("| Part number")]
    assert len(pieces) > 2 and chunks[0].text == "Intro line."
    body = [line for c in pieces for line in c.text.split("\n")[1:]]
    assert body == [f"| P-{i:03d} | spare part number {i} for the pump |" for i in range(80)]
    for chunk in pieces:
        assert chunk.text.split("\n")[0] == "| Part number | Description |"
        assert len(tokenizer(chunk.index_text)["input_ids"]) <= 96
        assert chunk.metadata["page"] == 1


def test_source_labels_cite_file_page_and_section(chunks):
    from rigkit.retrieval.ranking import make_hit

    labels = {source_label(make_hit(c, 1.0, {}, {})) for c in chunks}
    assert {"handbook.pdf p. 2", "notes.md § Install", "expenses.docx § Travel > Allowances",
            "web/office.html § Meeting rooms"} <= labels


# ------------------------------------------------------------------ bad files


def test_bad_files_are_skipped_with_their_reason(corpus, caplog):
    read = read_files(corpus)
    assert {f.name: f.skipped for f in read.skipped} == {
        "broken.docx": "not a Word file",
        "empty.txt": "empty file",
        "locked.pdf": "encrypted, needs a password",
        "scan.pdf": "no text layer: image-only or scanned, run OCR first",
    }
    assert len(read.documents) == 4


def test_a_binary_file_with_a_text_suffix_is_skipped(tmp_path):
    folder = make_corpus(tmp_path / "c", bad=False)
    (folder / "data.txt").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0" + os.urandom(64))
    (folder / "fake.pdf").write_bytes(os.urandom(512))
    skipped = {f.name: f.skipped for f in read_files(folder).skipped}
    assert skipped == {"data.txt": "binary data, not text", "fake.pdf": "not a PDF file"}


def test_a_folder_with_nothing_readable_is_an_error(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "empty.md").write_text("")
    write_image_pdf(tmp_path / "c" / "scan.pdf")
    with pytest.raises(CorpusError, match=r"nothing could be indexed; skipped empty.md \(empty file\)"):
        read_files(tmp_path / "c")
    with pytest.raises(CorpusError, match="no text layer"):
        read_files(tmp_path / "c" / "scan.pdf")  # a single file that cannot be read


def test_cli_prints_the_summary_and_strict_sets_the_exit_code(cli, corpus, tmp_path, monkeypatch):
    import rigkit.embeddings

    monkeypatch.setattr(rigkit.embeddings, "load_embedder", lambda *a, **k: HashEmbedder())
    # a handler an earlier test left on rigkit's logger writes to that test's closed stderr
    monkeypatch.setattr(logging.getLogger("rigkit"), "handlers", [])
    out = tmp_path / "idx"
    run = cli("index", "build", "--corpus", str(corpus), "--out", str(out), "--no-progress",
              "--set", "retrieval.embedding_model=all-MiniLM-L6-v2")
    assert run.returncode == 0, run.stderr
    assert ("indexed 4 files, skipped 4: broken.docx (not a Word file), empty.txt (empty file), "
            "locked.pdf (encrypted, needs a password), scan.pdf (no text layer: image-only or "
            "scanned, run OCR first)") in run.stdout
    assert "skipped locked.pdf: encrypted" in run.stderr
    strict = cli("index", "build", "--corpus", str(corpus), "--out", str(out), "--no-progress",
                 "--set", "retrieval.embedding_model=all-MiniLM-L6-v2", "--strict")
    assert strict.returncode == 1 and "reused 4 files" in strict.stdout
    clean = make_corpus(tmp_path / "clean", bad=False)
    ok = cli("index", "build", "--corpus", str(clean), "--out", str(tmp_path / "ok"), "--strict",
             "--no-progress", "--set", "retrieval.embedding_model=all-MiniLM-L6-v2")
    assert ok.returncode == 0 and "indexed 4 files, skipped 0" in ok.stdout


# ------------------------------------------------------------------ incremental rebuilds


def test_a_rebuild_re_embeds_only_new_and_changed_files(tmp_path):
    folder = make_corpus(tmp_path / "docs", bad=False)
    out = tmp_path / "idx"
    first = Index.build(folder, out, embedding_model="all-MiniLM-L6-v2", embedder=HashEmbedder())
    assert first.manifest["update"]["new_files"] == 4 and first.manifest["update"]["reused_chunks"] == 0
    assert set(first.manifest["sources"]) == {"handbook.pdf", "expenses.docx", "web/office.html",
                                              "notes.md"}

    (folder / "notes.md").write_text("# Notes\n\n## Install\n\nRun make install twice.\n")
    (folder / "expenses.docx").unlink()
    (folder / "extra.txt").write_text("A new file about parking permits.\n")
    embedder = HashEmbedder()
    second = Index.build(folder, out, embedding_model="all-MiniLM-L6-v2", embedder=embedder)
    report, manifest = second.report, json.loads((out / "manifest.json").read_text())
    assert (report.reused, report.changed, report.new, report.dropped) == (
        ["handbook.pdf", "web/office.html"], ["notes.md"], ["extra.txt"], ["expenses.docx"])
    assert manifest["update"]["embedded_chunks"] == 2 and embedder.calls == 1
    assert set(manifest["sources"]) == {"handbook.pdf", "web/office.html", "notes.md", "extra.txt"}
    assert not any(c.doc_id == "expenses.docx" for c in second.chunks)
    assert "twice" in next(c.text for c in second.chunks if c.doc_id == "notes.md")

    # kept vectors are the old ones: the index answers as a full build does
    full = Index.build(folder, tmp_path / "full", embedding_model="all-MiniLM-L6-v2",
                       embedder=HashEmbedder())
    loaded = Index.load(out, embedder=HashEmbedder())
    assert [c.chunk_id for c in loaded.chunks] == [c.chunk_id for c in full.chunks]
    query = "returns within 30 days"
    assert ([h.chunk_id for h in loaded.retriever("hybrid").search(query, 3)]
            == [h.chunk_id for h in full.retriever("hybrid").search(query, 3)])

    untouched = HashEmbedder()
    third = Index.build(folder, out, embedding_model="all-MiniLM-L6-v2", embedder=untouched)
    assert third.manifest["update"]["reused_files"] == 4 and untouched.calls == 0


def test_other_chunk_settings_re_embed_everything(tmp_path):
    folder = make_corpus(tmp_path / "docs", bad=False)
    out = tmp_path / "idx"
    Index.build(folder, out, embedding_model="all-MiniLM-L6-v2", embedder=HashEmbedder())
    again = Index.build(folder, out, embedding_model="all-MiniLM-L6-v2", chunk_size=128,
                        embedder=HashEmbedder())
    assert again.manifest["update"]["reused_files"] == 0
    assert again.manifest["update"]["changed_files"] == 0 and again.manifest["update"]["new_files"] == 4


# ------------------------------------------------------------------ with the real embedder


@pytest.mark.slow
def test_a_real_index_over_documents_cites_file_and_page(cli, tmp_path):
    folder = make_corpus(tmp_path / "docs")
    out = tmp_path / "idx"
    built = cli("index", "build", "--corpus", str(folder), "--out", str(out), "--no-progress",
                "--set", "retrieval.embedding_model=all-MiniLM-L6-v2")
    assert built.returncode == 0, built.stderr
    index = Index.load(out)
    hits = index.retriever("hybrid").search("Can I return it with the original receipt?", 3)
    assert source_label(hits[0]) == "handbook.pdf p. 2"
    printed = cli("search", str(out), "Can I return it with the original receipt?", "--top-k", "1")
    assert "[handbook.pdf#1] handbook.pdf p. 2" in printed.stdout
    found = cli("search", str(out), "daily allowance in Paris", "--top-k", "3", "--json")
    assert json.loads(found.stdout)[0]["metadata"]["section"] == "Travel > Allowances"


def _inflated_docx(path: Path, text_bytes: int) -> Path:
    """A real Word file whose one paragraph is `text_bytes` of text (streamed into the zip, so it
    inflates to that size from a small file)."""
    import zipfile

    plain = write_docx(path.with_name("plain.docx"))
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            if item.filename != "word/document.xml":
                target.writestr(item, source.read(item))
                continue
            head, _, tail = source.read(item).decode("utf-8").partition("<w:body>")
            with target.open("word/document.xml", "w", force_zip64=True) as out:
                out.write((head + "<w:body><w:p><w:r><w:t>").encode())
                for _ in range(text_bytes // 2**20):
                    out.write(b"a" * 2**20)
                out.write(("</w:t></w:r></w:p>" + tail.partition("<w:body>")[2]).encode())
    plain.unlink()
    return path


def test_deep_html_and_inflating_word_files_are_skipped_by_name_and_the_rest_is_built(tmp_path, caplog):
    """A paragraph under 300 levels of nesting is read (and the one after it); past the parser's
    depth the page is one warning; a Word file whose text node is over lxml's limit, or whose parts
    inflate to hundreds of MB, is one warning naming it; the other files are indexed."""
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "guide.html").write_text(HTML_PAGE, encoding="utf-8")

    def nested(depth: int) -> str:
        return ("<html><head><title>Nested</title></head><body><p>Before the nesting comes a first paragraph "
                "of ordinary length.</p>" + "<div>" * depth + "<p>The deep paragraph says the vault opens "
                "at noon.</p>" + "</div>" * depth + "<p>The paragraph after it says the vault closes at "
                "six.</p></body></html>")

    (folder / "deep.html").write_text(nested(300), encoding="utf-8")
    (folder / "deeper.html").write_text(nested(5000), encoding="utf-8")
    _inflated_docx(folder / "long.docx", 24 * 2**20)  # one 24 MB text node: over lxml's 10 MB limit
    _inflated_docx(folder / "bomb.docx", 300 * 2**20)
    with caplog.at_level(logging.WARNING, logger="rigkit"):
        read = read_files(folder)
    skipped = {f.name: f.skipped for f in read.skipped}
    assert set(skipped) == {"deeper.html", "long.docx", "bomb.docx"}, skipped
    assert "nested too deeply" in skipped["deeper.html"] and "inflate to 301 MB" in skipped["bomb.docx"]
    assert "XML cannot be read" in skipped["long.docx"]
    for name in skipped:
        assert name in caplog.text
    text = next(d.text for d in read.documents if d.id.startswith("deep"))
    assert "vault opens at noon" in text and "vault closes at six" in text
    assert any(d.id.startswith("guide") for d in read.documents)
