"""Real PDF, Word and HTML files made on the spot for the ingestion tests (no fixtures on disk)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_pdf", "write_encrypted_pdf", "write_image_pdf", "write_docx", "write_html",
           "HTML_PAGE"]


def write_pdf(path: Path, pages: list[str]) -> Path:
    """A PDF with a real text layer, one string per page (matplotlib, TrueType fonts embedded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(path) as pdf:
        for text in pages:
            fig = plt.figure(figsize=(8.5, 11))
            fig.text(0.08, 0.92, text, va="top", fontsize=11, wrap=True)
            pdf.savefig(fig)
            plt.close(fig)
    return path


def write_encrypted_pdf(path: Path, source: Path, password: str = "secret") -> Path:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(source))
    writer.encrypt(user_password=password, owner_password=password + "-owner")
    with open(path, "wb") as f:
        writer.write(f)
    return path


def write_image_pdf(path: Path) -> Path:
    """A PDF whose only content is a picture (a scan): no text layer."""
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


def write_html(path: Path) -> Path:
    path.write_text(HTML_PAGE, encoding="utf-8")
    return path


def touch_later(path: Path, seconds: float = 5.0) -> None:
    """Move the file's mtime forward (an edit within the same second must still look newer)."""
    stat = path.stat()
    os.utime(path, (stat.st_atime + seconds, stat.st_mtime + seconds))
