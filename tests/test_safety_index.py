"""Indexes are atomic, verified and honest when damaged.

A real process builds an index over an older one and is SIGKILLed at each write / fsync / rename
step (`RIGKIT_FAULT_AT`, see rigkit.files.fault_point); the path must then hold the old index or
the new one, loadable, and the next build cleans up (slow: a process start each). Damaged files
give one-line `IndexCorruptError`s naming the file, through `Index.load` and through the CLI (run
in this process by the `cli` fixture).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rigkit.errors import IndexCorruptError, IndexMismatchError
from rigkit.retrieval import Index, storage
from tests.conftest import hang_limit
from tests.conftest_retrieval import DATA, HashEmbedder

ROOT = Path(__file__).resolve().parents[1]
DEMO = DATA / "demo" / "corpus.jsonl"
BUILD = """
import sys
from rigkit.retrieval import Index, storage
from tests.conftest_retrieval import HashEmbedder
if sys.argv[3] == "no-exchange":
    storage._exchange = lambda a, b: False  # a system without renameat2: the two-rename path
Index.build(sys.argv[1], sys.argv[2], chunk_size=int(sys.argv[4]), embedder=HashEmbedder())
"""
EXCHANGE_STEPS = ["index:files-written", "index:fsync-file", "index:fsync-dir", "index:exchanged",
                  "index:fsync-parent"]
FALLBACK_STEPS = ["index:fsync-dir", "index:old-aside", "index:renamed", "index:fsync-parent"]


def _build_killed_at(step: str, out: Path, exchange: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "RIGKIT_FAULT_AT": step, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", BUILD, str(DEMO), str(out), "exchange" if exchange else "no-exchange", "128"],
        cwd=ROOT, env=env, capture_output=True, timeout=hang_limit(10),
    )


@pytest.mark.slow  # a SIGKILL needs a process of its own: ~5 s each to start
@pytest.mark.parametrize("step, exchange", [(s, True) for s in EXCHANGE_STEPS]
                         + [(s, False) for s in FALLBACK_STEPS])
def test_a_kill_at_any_swap_step_leaves_an_index(tmp_path, step, exchange):
    out = tmp_path / "idx"
    Index.build(DEMO, out, chunk_size=256, embedder=HashEmbedder())  # the old index
    done = _build_killed_at(step, out, exchange)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-1500:]
    loaded = Index.load(out)  # old or new, never neither, never half
    assert loaded.manifest["chunking"]["chunk_size"] in (128, 256)
    Index.build(DEMO, out, chunk_size=128, embedder=HashEmbedder())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # leftovers cleaned
    Index.load(out)


@pytest.fixture
def built(tmp_path):
    return Index.build(DEMO, tmp_path / "idx", embedder=HashEmbedder()).path


def _fresh_load(path: Path):
    storage._VERIFIED.clear()  # as a new process would
    return Index.load(path, embedder=HashEmbedder())


def test_manifest_lists_every_file_with_size_and_hash(built):
    manifest = json.loads((built / "manifest.json").read_text())
    on_disk = {p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    assert all(len(e["sha256"]) == 64 and e["bytes"] > 0 for e in manifest["files"].values())


def _reorder_chunks(path: Path) -> None:
    lines = (path / "chunks.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[0], lines[1] = lines[1], lines[0]
    (path / "chunks.jsonl").write_text("".join(lines), encoding="utf-8")


def _truncate_faiss(path: Path) -> None:
    with open(path / "dense.faiss", "rb+") as f:
        f.truncate(100)


def _delete_bm25_file(path: Path) -> None:
    next(p for p in sorted((path / "bm25").iterdir()) if p.is_file()).unlink()


def _swap_files(path: Path) -> None:
    other = Index.build(DEMO, path.parent / "other", chunk_size=128, embedder=HashEmbedder()).path
    os.replace(other / "chunks.jsonl", path / "chunks.jsonl")


def _garble_manifest(path: Path) -> None:
    (path / "manifest.json").write_text('{"format_version": 2, "files": ', encoding="utf-8")


@pytest.mark.parametrize("damage, named", [
    (_reorder_chunks, "chunks.jsonl"), (_truncate_faiss, "dense.faiss"),
    (_delete_bm25_file, "bm25"), (_swap_files, "chunks.jsonl"), (_garble_manifest, "manifest.json"),
])
def test_damaged_index_is_one_clear_error(cli, built, damage, named):
    before = Index.load(built, embedder=HashEmbedder()).retriever("hybrid").search("licence", 3)
    assert before
    damage(built)
    with pytest.raises(IndexCorruptError, match=named) as err:
        _fresh_load(built)
    assert "rebuild with `rigkit index build" in str(err.value) and "\n" not in str(err.value)
    done = cli("search", str(built), "licence")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and named in done.stderr


def test_verify_hashes_even_after_a_verified_load(cli, built):
    Index.load(built)
    with open(built / "chunks.jsonl", "r+b") as f:  # same size, one byte changed
        data = bytearray(f.read())
        at = data.index(b'"text": "') + 10  # a letter of the first chunk's text
        data[at] = ord("X") if data[at] != ord("X") else ord("Y")
        f.seek(0)
        f.write(bytes(data))
    Index.load(built)  # already verified in this process: sizes only, and they match
    done = cli("index", "verify", str(built))  # the same process: verify hashes all the same
    assert done.returncode == 2 and "chunks.jsonl" in done.stderr and "checksum" in done.stderr


def test_verify_passes_on_a_good_index(cli, built):
    done = cli("index", "verify", str(built))
    assert done.returncode == 0, done.stderr
    assert "match the manifest" in done.stdout


def test_explicit_index_with_other_bm25_tokens_is_refused(built):
    manifest = json.loads((built / "manifest.json").read_text())
    manifest["bm25"]["tokenizer"] = "rigkit-bm25-tokens-0"
    (built / "manifest.json").write_text(json.dumps(manifest))
    from rigkit.config import RetrievalConfig
    from rigkit.retrieval.factory import open_index

    with pytest.raises(IndexMismatchError, match="BM25 tokens"):
        open_index(RetrievalConfig(index=str(built)))


def test_build_shows_chunking_and_embedding_progress(tmp_path, capsys):
    Index.build(DEMO, tmp_path / "idx", embedder=HashEmbedder(), progress=True)
    err = capsys.readouterr().err
    assert "chunking" in err and "embedding" in err and "chunk/s" in err
    Index.build(DEMO, tmp_path / "quiet", embedder=HashEmbedder(), progress=False)
    assert "chunk/s" not in capsys.readouterr().err


def test_ask_and_eval_report_a_damaged_index_before_loading_a_model(cli, built, tmp_path):
    _truncate_faiss(built)
    qa = ROOT / "data" / "2wikimultihopqa" / "qa.jsonl"
    for args in (["ask", "What?", "--index", str(built)],
                 ["eval", "--qa", str(qa), "--index", str(built), "--out", str(tmp_path / "o")]):
        done = cli(*args)
        assert done.returncode == 2 and "dense.faiss" in done.stderr and "Traceback" not in done.stderr
        assert "loading" not in done.stderr  # refused before the model
