"""The benchmark suite: replay (teacher forcing) on a tiny model, then every script in quick mode.

The slow test runs each `bench/*.py --quick` as `make bench-quick` does, into a temporary folder,
so the scripts never rot; it checks what the figures must say whatever the machine's speed
(identical answers with the cache on and off, faithful replays, fewer pre-filled tokens for the
append layout than for re-encoding), never an absolute time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rigkit.build import build_controller
from rigkit.config import load_config
from rigkit.testing import DictRetriever
from rigkit.trace import Hit
from tests.conftest import hang_limit
from tests.tiny_model import tiny_generator

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SCRIPTS = ("retrieval", "cache", "overhead", "cost", "latency", "stages", "startup", "compression")

PASSAGES = [
    Hit("apache#0", "apache", "Apache", "the apache licence may grant a patent", 1.0),
    Hit("mit#0", "mit", "MIT", "the mit licence is short and you must include it", 0.9),
    Hit("gpl#0", "gpl", "GPL", "the gpl licence is a copyleft and you must ship the source", 0.8),
]


@pytest.fixture
def replay(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import replay

    return replay


def _config(layout: str, use_cache: bool, rounds: int = 2):
    return load_config(
        decider={"name": "always"},
        controller={"max_rounds": rounds, "policy": "continue"},
        context={"layout": layout},
        generator={"use_cache": use_cache, "max_answer_tokens": 24, "max_segment_tokens": 6},
    )


def _run(base, config, question, script=None):
    """One answer through a recording (or, with `script`, forcing) copy of `base`."""
    from replay import scripted_generator  # bench/ is on sys.path through the fixture

    generator, model = scripted_generator(base, use_cache=config.generator.use_cache, script=script)
    result = build_controller(config, generator, DictRetriever({}, default=PASSAGES)).run(question)
    return result, model.calls


def test_replay_forces_the_reference_through_every_layout(replay):
    base = tiny_generator(seed=3)
    reference, script = _run(base, _config("append", True), "what licence may you ship?")
    assert reference.used_retrieval_times == 2 and len(reference.rounds) >= 3
    for layout, use_cache in (("append", True), ("append", False), ("prefix", True), ("prefix", False)):
        replayed, _ = _run(base, _config(layout, use_cache), "what licence may you ship?", script)
        assert replay.same_run(replayed, reference), (layout, use_cache)
        if layout == "append" and use_cache:
            assert replayed.tokens == reference.tokens  # the reference replayed is itself
    prefix, _ = _run(base, _config("prefix", False), "what licence may you ship?", script)
    assert prefix.tokens["prefilled"] > reference.tokens["prefilled"]  # re-encoding costs more
    assert prefix.tokens["reused"] == 0


def test_forcing_overrides_what_the_model_would_write(replay):
    base = tiny_generator(seed=3)
    first, script = _run(base, _config("append", True), "what licence may you ship?")
    free, _ = _run(base, _config("append", True), "which code is under the gpl?")
    forced, _ = _run(base, _config("append", True), "which code is under the gpl?", script)
    written = [t for r in forced.rounds for t in r.segment.token_ids]
    assert written == [t for r in first.rounds for t in r.segment.token_ids]
    assert written != [t for r in free.rounds for t in r.segment.token_ids]


def test_report_lists_parts_that_did_not_run(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import report

    assert "no results" in report.render(report.load(tmp_path))


@pytest.mark.slow
def test_every_bench_script_runs_in_quick_mode(tmp_path):
    # each script is limited on its own (a minute or two each on a quiet 2-core machine), not
    # all together: a hang names its script
    for script in SCRIPTS:
        done = subprocess.run(
            [sys.executable, str(BENCH / f"{script}.py"), "--quick", "--out-dir", str(tmp_path)],
            cwd=ROOT, capture_output=True, text=True, timeout=hang_limit(120),
        )
        assert done.returncode == 0, f"{script}: {done.stderr[-2000:]}"
        record = json.loads((tmp_path / f"{script}.json").read_text())
        assert record["mode"] == "quick" and record["machine"]["cores"]
    cache = json.loads((tmp_path / "cache.json").read_text())
    summary = cache["profiles"]["cpu"]["summary"]
    nocache = [e for e in summary if e["way"] == "append, no cache"]
    assert nocache and all(e["same_tokens"] == e["questions"] for e in nocache)
    replays = [e for e in summary if e["mode"] == "replay" and e["way"] != "append + cache"]
    assert replays and all(e["faithful"] == e["questions"] for e in replays)
    for e in summary:
        if e["way"] == "prefix, no cache" and e["mode"] == "replay":
            assert e["prefill_vs_append"] > 1
    compression = json.loads((tmp_path / "compression.json").read_text())
    for modes in compression["sets"].values():  # compression never adds passage tokens
        assert modes["none"]["passage_tokens_vs_none"] == 1 and modes["extractive"]["passage_tokens_vs_none"] <= 1
    overhead = json.loads((tmp_path / "overhead.json").read_text())
    assert all(s["same_tokens"] == s["questions"] for s in overhead["summary"].values())
    cost = json.loads((tmp_path / "cost.json").read_text())
    for run in cost["runs"].values():  # the floor reads every prompt token once and decodes only what was kept
        s = run["summary"]
        assert s["prefilled"] >= 0.9 * s["floor_prompt_tokens"] and s["decoded"] >= 0.9 * s["kept_tokens"], s
    table = subprocess.run([sys.executable, str(BENCH / "report.py"), "--dir", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, check=True,
                           timeout=hang_limit(10)).stdout
    assert "| part | measurement | result | goal |" in table
    # serve, serve_vllm and eval_throughput run against servers (bench/serve.py, the vLLM tests)
    assert not [part for part in SCRIPTS if f"| {part} | not run |" in table], table


def test_dense_retriever_embeds_a_repeated_query_once():
    import numpy as np

    from rigkit.corpus import Chunk
    from rigkit.retrieval.dense import QUERY_CACHE_SIZE, DenseRetriever, build_faiss_index

    class CountingEmbedder:
        calls = 0

        def encode(self, texts, **kwargs):
            CountingEmbedder.calls += len(texts)
            rng = np.random.default_rng(abs(hash(texts[0])) % 2**32)
            v = rng.normal(size=(len(texts), 8)).astype(np.float32)
            return v / np.linalg.norm(v, axis=1, keepdims=True)

    vectors = np.concatenate([CountingEmbedder().encode([f"chunk {i}"]) for i in range(20)])
    chunks = [Chunk(f"d{i}#0", f"d{i}", f"T{i}", f"text {i}", 0, 0, 6) for i in range(20)]
    dense = DenseRetriever(chunks, build_faiss_index(vectors), "stub", CountingEmbedder())
    CountingEmbedder.calls = 0
    first = dense.search("which licence?", 3)
    again = dense.search("which licence?", 3)
    assert CountingEmbedder.calls == 1 and [h.chunk_id for h in first] == [h.chunk_id for h in again]
    dense.search("another question", 3)
    assert CountingEmbedder.calls == 2
    for i in range(QUERY_CACHE_SIZE + 1):  # the oldest query falls out of the bounded cache
        dense.encode(f"q{i}")
    before = CountingEmbedder.calls
    dense.encode("which licence?")
    assert CountingEmbedder.calls == before + 1


def test_latency_summarises_eval_runs(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import latency

    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({
        "config_file": "configs/cpu.yaml", "config": {"generator": {"max_answer_tokens": 96}},
        "model": {"spec": "m"}, "updated": "now"}))
    rows, traces = [], []
    for q, (rag_s, rig_s) in enumerate([(1.0, 2.0), (2.0, 3.0), (3.0, 3.0)]):
        for system, seconds, segments in (("rag", rag_s, 1), ("rig:prob", rig_s, 2)):
            rows.append({"id": f"q{q}", "dataset": "set", "system": system, "run": 0, "latency": seconds,
                         "timings": {"generate": seconds / 2, "retrieve": 0.1}, "segments": segments,
                         "extra_model_calls": 1 if system == "rig:prob" else 0, "forward_passes": 10,
                         "tokens_generated": 10, "tokens_prefilled": 50, "tokens_reused": 5,
                         "retrievals": segments - 1 if system != "rag" else 1, "error": None})
            traces.append({"id": f"q{q}", "system": system, "run": 0,
                           "result": {"rounds": [{"budget": {"draft": 8}}]}})
    rows.append({**rows[0], "id": "bad", "error": "ValueError: x"})  # a failed answer is not timed
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces))
    assert latency.main(["--from-eval", str(run), "--out-dir", str(tmp_path / "out"),
                         "--systems", "rag,rig:prob,closed_book"]) == 0
    saved = json.loads((tmp_path / "out" / "latency.json").read_text())
    summary = saved["summary"]["set"]
    assert saved["done"] == {"set": 3} and set(summary) == {"rag", "rig:prob"}
    assert summary["rag"]["p50_s"] == 2.0 and summary["rig:prob"]["p50_s"] == 3.0
    assert summary["rig:prob"]["vs_rag_p50"] == 1.5 and summary["rig:prob"]["model_calls"] == 3.0
    assert summary["rig:prob"]["answer_tokens"] == 8 and summary["rig:prob"]["forward_share"] is None
    assert saved["max_answer_tokens"] == 96 and saved["from_eval"] == [str(run)]
