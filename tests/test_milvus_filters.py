"""Metadata filters as Milvus expressions: what translates, what stays for Python, and how.

No server here: the expressions are checked as text; tests/test_retrieval_milvus.py runs them on
a real Milvus and checks the hits against the faiss path's.
"""

from __future__ import annotations

import pytest

from rigkit.config import RetrievalConfig
from rigkit.corpus import Chunk
from rigkit.errors import IndexMismatchError, InputError
from rigkit.retrieval.filters import ChunkFilter, parse_filters
from rigkit.retrieval.milvus import MilvusTarget, connect
from rigkit.retrieval.milvus_filters import FieldShape, field_shape, milvus_filter


def chunk(i: int, title: str = "", **metadata) -> Chunk:
    return Chunk(f"d{i}#0", f"d{i}", title or f"Title {i}", "text", 0, 0, 4, metadata=metadata)


CHUNKS = [
    chunk(0, lang="en", year=1990, score=0.25, tags=["a", "b"], flag=True, code="1990",
          modified="2024-01-01", mixed=1, note='say "hi"\\now'),
    chunk(1, lang="zh", year=2001, score=0.75, tags=["c"], flag=False, code="2001",
          modified="2024-06-01T12:00:00+00:00", mixed="one", 名字="中文"),
    chunk(2, lang="en", year=2015, tags=[], flag=True),
    chunk(3, year=2019),  # no lang, no score
]


def translate(spec, chunks=CHUNKS):
    filters = parse_filters(spec)
    chunk_filter = ChunkFilter(chunks)
    return milvus_filter(filters, {key: field_shape(chunk_filter, key) for key in filters.keys})


def rest_of(spec) -> list[str] | None:
    rest = translate(spec)[1]
    return None if rest is None else [str(c) for c in rest.conditions]


def test_shapes_say_what_a_field_holds():
    chunk_filter = ChunkFilter(CHUNKS)
    shape = lambda key: field_shape(chunk_filter, key)  # noqa: E731
    assert shape("lang") == FieldShape('metadata["lang"]', "text", False)
    assert shape("year") == FieldShape('metadata["year"]', "number", True)
    assert shape("tags").kind == "text-list" and shape("flag").kind == "bool"
    # numbers written as text, ISO dates and fields mixing kinds compare otherwise in Milvus
    assert {shape(k).kind for k in ("code", "modified", "mixed")} == {"mixed"}
    assert shape("doc_id") == FieldShape("doc_id", "text", True)
    assert shape("title").path == "title"
    assert shape("absent") is None


@pytest.mark.parametrize("spec, expression", [
    ("lang=en", 'metadata["lang"] == "en"'),
    ("lang=en,zh", 'metadata["lang"] == "en" or metadata["lang"] == "zh"'),
    # != keeps chunks without the field, which Milvus would drop on a missing JSON key
    ("lang!=zh", 'not exists metadata["lang"] or metadata["lang"] != "zh"'),
    ("year!=2001", 'metadata["year"] != 2001'),  # every chunk has a year
    ("year=1990", 'metadata["year"] == 1990'),
    ("year>=1990", 'metadata["year"] >= 1990'),
    ("score<0.5", 'metadata["score"] < 0.5'),
    ({"year": {"gt": 2000, "lte": 2015}}, '(metadata["year"] > 2000) and (metadata["year"] <= 2015)'),
    ({"year": [1990, "2001"]}, 'metadata["year"] == 1990 or metadata["year"] == 2001'),
    ("flag=true", 'metadata["flag"] == true'),
    ({"flag": False}, 'metadata["flag"] == false'),
    ("tags=a", 'json_contains(metadata["tags"], "a")'),
    ("tags=a,c", 'json_contains_any(metadata["tags"], ["a", "c"])'),
    ("tags!=a", 'not exists metadata["tags"] or not json_contains(metadata["tags"], "a")'),
    ("doc_id=d1,d2", 'doc_id in ["d1", "d2"]'),
    ("title=Title 1", 'title == "Title 1"'),
    ('note=say "hi"\\now', 'metadata["note"] == "say \\"hi\\"\\\\now"'),
    ("名字=中文", 'metadata["名字"] == "中文"'),
])
def test_conditions_milvus_compares_alike_become_expressions(spec, expression):
    assert translate(spec) == (expression, None)


@pytest.mark.parametrize("spec", [
    "modified<2024-03-01",  # ISO dates: Milvus would compare the text
    "code=1990",  # a number written as text equals 1990 in rigkit, not in Milvus
    "mixed=1",
    {"lang": True},  # a boolean asked of a text field
    "year=nineteen",  # text asked of a number field
])
def test_conditions_that_would_compare_otherwise_stay_for_python(spec):
    expression, rest = translate(spec)
    assert expression is None and rest == parse_filters(spec)


def test_a_filter_splits_into_what_milvus_takes_and_the_rest():
    expression, rest = translate(["lang=en", "modified>=2024-01-01", "year>=1990"])
    assert expression == '(metadata["lang"] == "en") and (metadata["year"] >= 1990)'
    assert [str(c) for c in rest.conditions] == ["modified>=2024-01-01"]
    assert rest_of(["code=1990", "flag=true"]) == ["code=1990"]


def test_a_doc_id_in_the_metadata_is_filtered_there():
    chunks = [chunk(0, doc_id="x"), chunk(1)]
    assert translate("doc_id=x", chunks)[0] is None  # some chunks by metadata, some by the field
    assert translate("doc_id=x", [chunk(0, doc_id="x"), chunk(1, doc_id="y")])[0] == 'metadata["doc_id"] == "x"'


def test_collection_names_are_checked(tmp_path):
    assert MilvusTarget().name_for(tmp_path / "musique-idx") == "rigkit_musique_idx"
    assert MilvusTarget(collection="docs_v2").name_for(tmp_path) == "docs_v2"
    with pytest.raises(InputError, match="not a Milvus collection name"):
        MilvusTarget(collection="2docs").name_for(tmp_path)


def test_a_missing_pymilvus_names_the_pip_command(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pymilvus", None)  # import pymilvus now raises ImportError
    with pytest.raises(InputError, match=r"pip install pymilvus .*rigkit\[milvus\]"):
        connect("http://127.0.0.1:19530")


def test_milvus_indexes_are_built_on_purpose(tmp_path):
    from rigkit.retrieval import open_retriever

    with pytest.raises(InputError, match="--dense-backend milvus"):
        open_retriever(RetrievalConfig(corpus=str(tmp_path / "c.jsonl"), dense_backend="milvus"))


def test_a_faiss_index_is_not_opened_as_a_milvus_one(tmp_path):
    from rigkit.retrieval import Index, open_retriever

    try:
        from tests.conftest_retrieval import DATA, HashEmbedder
    except ImportError:
        from conftest_retrieval import DATA, HashEmbedder
    index = Index.build(DATA / "demo" / "corpus.jsonl", tmp_path / "demo", embedder=HashEmbedder())
    assert index.manifest["dense"]["backend"] == "faiss"
    with pytest.raises(IndexMismatchError, match="dense_backend: index has 'faiss', asked for 'milvus'"):
        open_retriever(RetrievalConfig(index=str(index.path), dense_backend="milvus"))
