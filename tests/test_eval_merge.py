"""`rigkit eval-merge` joins only shards of one evaluation, never overwrites without --force, and
names the lines it could not read (scripted systems, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigkit.errors import InputError
from rigkit.eval.merge import merge_runs
from rigkit.eval.runner import RESULTS_FILE, parse_shard, read_results, run_eval, shard_items
from tests.test_eval_runner import _items, _systems

SYSTEMS = "closed_book,rag"


def make_shard(root: Path, name: str, i: int | None, n: int, systems: str = SYSTEMS, **meta) -> Path:
    """A finished shard folder: results of shard i/n (i None: every question, no --shard)."""
    part = shard_items(_items(), parse_shard(f"{i}/{n}")) if i else _items()
    folder = root / name
    run_eval(part, _systems(systems)[0], folder, progress=False)
    (folder / "meta.json").write_text(json.dumps({
        "qa": "qa.jsonl", "split": "all", "limit": None, "config": {}, "runs": 1, "systems": systems.split(","),
        "shard": f"{i}/{n}" if i else None, "question_ids": [q.id for q in part], **meta}), encoding="utf-8")
    return folder


@pytest.fixture
def shards(tmp_path):
    return [make_shard(tmp_path, f"s{i}", i, 2) for i in (1, 2)]


def test_two_shards_of_one_evaluation_merge(tmp_path, shards):
    summary = merge_runs(tmp_path / "all", shards)
    assert summary.written == 3 * 2 and summary.dropped == [] and summary.missing == 0
    assert len(read_results(tmp_path / "all")) == 6


def test_an_existing_evaluation_is_replaced_only_with_force(tmp_path, shards):
    out = tmp_path / "all"
    merge_runs(out, shards)
    before = (out / RESULTS_FILE).read_bytes()
    with pytest.raises(InputError, match="already holds an evaluation; pass --force"):
        merge_runs(out, shards)
    assert (out / RESULTS_FILE).read_bytes() == before
    assert merge_runs(out, shards, force=True).written == 6


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda root, s: [s[0]], "two or more shard folders"),
        (lambda root, s: [s[0], s[0]], "named twice"),
        (lambda root, s: [s[0], make_shard(root, "again", 1, 2)], "are both shard 1/2"),
        (lambda root, s: [s[0], make_shard(root, "l", 2, 2, limit=2)], "different limit (null against 2)"),
        (lambda root, s: [s[0], make_shard(root, "r", 2, 2, runs=2)], "different runs (1 against 2)"),
        (lambda root, s: [s[0], make_shard(root, "y", 2, 2, systems="closed_book")], "different systems"),
        (lambda root, s: [s[0], make_shard(root, "q", 2, 2, qa="other.jsonl")], "different qa"),
        (lambda root, s: [s[0], make_shard(root, "c", 2, 2, config={"generator": {"model": "x"}})],
         "different config"),
        (lambda root, s: [s[0], make_shard(root, "n", 2, 3)], "split the questions 2 and 3 ways"),
        (lambda root, s: [make_shard(root, "a", 1, 3), make_shard(root, "b", 2, 3)], "shard 3/3 missing"),
        (lambda root, s: [s[0], make_shard(root, "full", None, 1)], "was run without --shard"),
        (lambda root, s: [make_shard(root, "x", None, 1), make_shard(root, "z", None, 1)], "is in both"),
    ],
    ids=["one", "twice", "same-shard", "limit", "runs", "systems", "qa", "config", "shard-count", "missing",
         "unsharded", "question-sets"],
)
def test_shards_that_do_not_belong_together_are_refused_naming_the_difference(tmp_path, shards, build, message):
    with pytest.raises(InputError) as err:
        merge_runs(tmp_path / "all", build(tmp_path, shards))
    assert message in str(err.value)
    assert not (tmp_path / "all").exists()  # nothing written


def test_torn_and_corrupt_lines_are_counted_and_named(tmp_path, shards):
    results = shards[1] / RESULTS_FILE
    lines = results.read_text(encoding="utf-8").splitlines()
    results.write_text("\n".join([lines[0], "{not json", *lines[1:], '{"id": "q9"}', lines[-1][:20]]),
                       encoding="utf-8")
    summary = merge_runs(tmp_path / "all", shards)
    assert summary.dropped == [f"{results}: lines 2, {len(lines) + 2}, {len(lines) + 3}"]
    assert summary.written == 6 and summary.missing == 0  # every good line was kept


def test_an_unfinished_shard_shows_as_missing_answers(tmp_path, shards):
    results = shards[1] / RESULTS_FILE
    results.write_text(results.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    summary = merge_runs(tmp_path / "all", shards)
    assert summary.written == 4 + 1 and summary.missing == 1  # shard 1: 2 questions x 2 systems


def test_cli_refuses_to_overwrite_and_reports_dropped_lines(tmp_path, shards, capsys):
    from rigkit.cli import main

    out = str(tmp_path / "all")
    assert main(["eval-merge", *map(str, shards), "--out", out]) == 0
    capsys.readouterr()
    assert main(["eval-merge", *map(str, shards), "--out", out]) == 2
    assert "--force" in capsys.readouterr().err
    with open(shards[0] / RESULTS_FILE, "a", encoding="utf-8") as fh:
        fh.write('{"id": "q1", "sys')  # a torn last line
    assert main(["eval-merge", *map(str, shards), "--out", out, "--force", "--json"]) == 0
    captured = capsys.readouterr()
    assert "unreadable (torn or corrupt), left out" in captured.err
    assert json.loads(captured.out)["dropped"] == [f"{shards[0] / RESULTS_FILE}: line 5"]
