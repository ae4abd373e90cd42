"""rig:oracle and rag:gold with the real default model on one MuSiQue question (slow: loads it).

The index holds that question's own paragraphs (gold and distractors), so it builds in seconds;
the oracle's searches are the gold sub-questions and what they found is checked hop by hop.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigkit.config import load_config
from rigkit.eval.experiment import evaluate
from rigkit.eval.gold import gold_chain
from rigkit.eval.hops import hop_record
from rigkit.eval.runner import read_results

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_oracle_systems_answer_with_the_default_model(tmp_path):
    record = json.loads((ROOT / "data/musique/qa.jsonl").read_text().splitlines()[0])
    (tmp_path / "qa.jsonl").write_text(json.dumps(record) + "\n")
    (tmp_path / "corpus.jsonl").write_text("".join(
        json.dumps({"id": p["pid"], "title": p["title"], "text": p["text"]}) + "\n" for p in record["paragraphs"]))
    config = load_config(ROOT / "configs/cpu.yaml").override(retrieval={"corpus": str(tmp_path / "corpus.jsonl")})
    evaluate(tmp_path / "qa.jsonl", tmp_path / "run", "rag:gold,rig:oracle", config=config,
             faithfulness=False, progress=False)
    rows = {r["system"]: r for r in read_results(tmp_path / "run")}
    chain = gold_chain(record)
    gold = rows["rag:gold"]
    assert gold["error"] is None and gold["support_recall_pid"] == 1.0 and gold["answer"].strip()
    assert [c.split("#")[0] for c in gold["summary"]["upfront"]] == [h.pid for h in chain.hops]
    oracle = rows["rig:oracle"]
    assert oracle["error"] is None and oracle["answer"].strip()
    queries = [r["query"] for r in oracle["summary"]["rounds"] if r["query"]]
    assert queries == [h.query for h in chain.hops][: len(queries)] and queries  # gold sub-questions, in order
    assert all(r["text"] is not None for r in oracle["summary"]["rounds"])
    # over its own paragraphs, each gold sub-question finds its hop
    assert hop_record(oracle, chain).found == [1, 2]
    assert (tmp_path / "run" / "report.md").read_text().count("Per-hop retrieval recall") == 1
