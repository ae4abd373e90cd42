"""Corpus loading, malformed input, and chunking against the embedding tokenizer's limit."""

from __future__ import annotations

import pytest

from rigkit.corpus import chunk_documents, read_chunks, write_chunks
from rigkit.embeddings import load_tokenizer
from rigkit.errors import CorpusError, InputError
from rigkit.readers import load_documents
from rigkit.retrieval import Index

try:
    from tests.conftest_retrieval import DATA, HashEmbedder, write_jsonl
except ImportError:  # pytest run without the repo root on sys.path
    from conftest_retrieval import DATA, HashEmbedder, write_jsonl


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("all-MiniLM-L6-v2")


GOOD = '{"id": "a", "title": "A", "text": "alpha"}'


@pytest.mark.parametrize(
    "bad_line, words",
    [
        ('{"id": "b", "text": "beta"', "not valid JSON"),
        ('{"id": "b", "title": "B"}', "missing or empty 'text'"),
        ('{"id": "b", "text": "   "}', "missing or empty 'text'"),
        ('["b", "beta"]', "expected a JSON object"),
        ('{"id": "a", "text": "again"}', "duplicate id 'a'"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line, words):
    path = tmp_path / "docs.jsonl"
    path.write_text(f"{GOOD}\n\n{bad_line}\n", encoding="utf-8")
    with pytest.raises(CorpusError) as err:
        load_documents(path)
    assert "docs.jsonl" in str(err.value) and "line 3" in str(err.value) and words in str(err.value)


def test_malformed_corpus_writes_nothing(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(f"{GOOD}\nnot json\n", encoding="utf-8")
    out = tmp_path / "index"
    with pytest.raises(CorpusError, match="line 2"):
        Index.build(path, out, embedder=HashEmbedder())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


def test_chunk_size_above_model_limit_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "text": "alpha"}])
    with pytest.raises(InputError, match="256"):
        Index.build(path, tmp_path / "index", chunk_size=300, embedder=HashEmbedder())


def test_chunks_fit_the_model_and_cover_long_paragraphs(tokenizer):
    docs = load_documents(DATA / "musique" / "corpus.jsonl")[:800]
    long_docs = [d for d in docs if len(tokenizer(d.title + ". " + d.text)["input_ids"]) > 256][:40]
    assert len(long_docs) >= 20  # real paragraphs the model would otherwise truncate
    chunks = chunk_documents(long_docs, tokenizer, chunk_size=256, overlap=64)
    by_doc = {}
    for chunk in chunks:
        assert len(tokenizer(chunk.index_text)["input_ids"]) <= 256  # [CLS] + prefix + body + [SEP]
        by_doc.setdefault(chunk.doc_id, []).append(chunk)
    for doc in long_docs:
        parts = by_doc[doc.id]
        assert len(parts) >= 2
        assert [c.position for c in parts] == list(range(len(parts)))
        for c in parts:
            assert c.text == doc.text[c.start : c.end] and c.title == doc.title
        for prev, nxt in zip(parts, parts[1:]):
            assert prev.start < nxt.start < prev.end  # neighbours overlap
        assert parts[0].start == len(doc.text) - len(doc.text.lstrip())
        assert parts[-1].end == len(doc.text.rstrip())


def test_overlap_is_about_the_requested_token_count(tokenizer):
    text = " ".join(f"word{i}" for i in range(600))
    docs = load_documents_from_text(text)
    chunks = chunk_documents(docs, tokenizer, chunk_size=64, overlap=16)
    assert len(chunks) > 10
    for prev, nxt in zip(chunks, chunks[1:]):
        shared = len(tokenizer(text[nxt.start : prev.end], add_special_tokens=False)["input_ids"])
        assert 8 <= shared <= 16


def load_documents_from_text(text):
    from rigkit.corpus import Document

    return [Document(id="long", title="", text=text)]


def test_unsplit_mode_keeps_one_chunk_per_document(tokenizer):
    docs = load_documents(DATA / "2wikimultihopqa" / "corpus.jsonl")[:300]
    chunks = chunk_documents(docs, tokenizer, chunk_size=256, overlap=64, split=False)
    assert [c.doc_id for c in chunks] == [d.id for d in docs]
    assert chunks[0].index_text == f"{docs[0].title}. {docs[0].text.strip()}"


def test_markdown_splits_on_headings_and_keeps_the_path(tmp_path, tokenizer):
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "guide.md").write_text(
        "# Install guide\n\nIntro words.\n\n## Linux\n\nUse apt.\n\n```\n# not a heading\n```\n\n"
        "### Debian\n\nDebian words.\n\n## Windows\n\nUse the installer.\n",
        encoding="utf-8",
    )
    (folder / "sub" / "plain.txt").write_text("Plain text file.\n", encoding="utf-8")
    docs = load_documents(folder)
    assert [d.id for d in docs] == ["guide.md", "sub/plain.txt"]
    assert docs[0].title == "Install guide" and docs[1].title == "plain"
    chunks = chunk_documents(docs, tokenizer, chunk_size=256, overlap=64)
    got = [(c.doc_id, c.headings, c.text) for c in chunks]
    assert got == [
        ("guide.md", [], "Intro words."),
        ("guide.md", ["Linux"], "Use apt.\n\n```\n# not a heading\n```"),
        ("guide.md", ["Linux", "Debian"], "Debian words."),
        ("guide.md", ["Windows"], "Use the installer."),
        ("sub/plain.txt", [], "Plain text file."),
    ]
    assert chunks[2].index_text == "Install guide > Linux > Debian. Debian words."
    for c in chunks[:4]:
        assert docs[0].text[c.start : c.end] == c.text


def test_chunk_file_round_trip(tmp_path, tokenizer):
    docs = load_documents(DATA / "demo" / "corpus.jsonl")
    chunks = chunk_documents(docs, tokenizer, chunk_size=128, overlap=32)
    write_chunks(tmp_path / "chunks.jsonl", chunks)
    assert read_chunks(tmp_path / "chunks.jsonl") == chunks
    assert [p.name for p in tmp_path.iterdir()] == ["chunks.jsonl"]  # no temp file left
