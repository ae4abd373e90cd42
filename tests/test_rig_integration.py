"""The RIG loop end to end with the real default model and the demo index (slow)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rigkit.build import build_controller
from rigkit.config import load_config
from rigkit.trace import RIGResult

pytestmark = pytest.mark.slow

CPU = "configs/cpu.yaml"
QUESTION = "Who wrote the novel Dracula, and in which year was the author born?"


def test_probability_decider_retrieves_on_the_demo_corpus(default_generator, demo_retriever):
    config = load_config(CPU, decider={"name": "prob"})
    controller = build_controller(config, default_generator, demo_retriever)
    result = controller.run(
        "Can I use code under the Apache-2.0 licence in a commercial product, and what must I include when I ship it?"
    )
    assert result.used_retrieval_times >= 1 and len(result.rounds) >= 2
    fired = [r for r in result.rounds if r.query is not None]
    assert fired and all(r.hits for r in fired)
    assert result.answer and "<retrieve>" not in result.answer
    assert result.model["source"].startswith("gguf")
    # the append layout reuses the cache: after the first round, pre-fill is a small share
    assert result.tokens["reused"] > result.tokens["prefilled"]
    assert RIGResult.from_json(result.to_json()) == result


def test_cache_on_and_off_give_the_same_answer_and_rounds(default_generator, demo_retriever):
    from rigkit.generation.loading import load_generator

    config = load_config(CPU, decider={"name": "always"}, controller={"max_rounds": 2},
                         generator={"max_answer_tokens": 48})
    question = "What must I include when I ship Apache-2.0 code?"
    on = build_controller(config, load_generator(use_cache=True), demo_retriever).run(question)
    off = build_controller(config, load_generator(use_cache=False), demo_retriever).run(question)
    # the cache matters from the second segment on: a run that ends in round one proves nothing
    assert len(on.rounds) >= 2 and on.used_retrieval_times >= 1
    assert on.answer == off.answer
    assert [r.segment.token_ids for r in on.rounds] == [r.segment.token_ids for r in off.rounds]
    assert [r.action for r in on.rounds] == [r.action for r in off.rounds]
    assert off.tokens["reused"] == 0 and on.tokens["reused"] > 0
    assert on.tokens["prefilled"] < off.tokens["prefilled"]


def test_prefix_layout_reuses_less(default_generator, demo_retriever):
    config = load_config(CPU, decider={"name": "always"}, controller={"max_rounds": 2},
                         generator={"max_answer_tokens": 48})
    question = "What must I include when I ship Apache-2.0 code?"
    append = build_controller(config, default_generator, demo_retriever).run(question)
    prefix = build_controller(config.override(context={"layout": "prefix"}), default_generator, demo_retriever).run(question)
    assert prefix.used_retrieval_times >= 1 and append.used_retrieval_times >= 1
    assert len(append.rounds) >= 2 and len(prefix.rounds) >= 2  # or the checks below are vacuous
    head = append.rounds[0].tokens_prefilled  # system + question: the first round fills them
    assert append.rounds[0].tokens_reused == 0 and prefix.rounds[0].tokens_prefilled == head
    # append: the head is never filled again; prefix: passages go before the question, so the
    # question (and the draft after it) is filled again after an injection
    assert all(r.tokens_reused >= head for r in append.rounds[1:])
    after_injection = [r for prev, r in zip(prefix.rounds, prefix.rounds[1:]) if prev.injection and prev.injection.added]
    assert after_injection and after_injection[0].tokens_reused < head


def test_cli_json_prints_only_the_result(tmp_path):
    cmd = [sys.executable, "-m", "rigkit.cli", "ask", "--config", CPU, "--decider", "never", "--json",
           "What does the MIT licence allow?"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = RIGResult.from_dict(json.loads(done.stdout))
    assert result.answer and result.used_retrieval_times == 0
    assert "round 0" in done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["   "], "question is empty"),
        (["--decider", "nope", "Q?"], "nope"),
        (["--corpus", "/no/such/file.jsonl", "Q?"], "not found"),
        (["--model", "/no/such/model", "Q?"], "model"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args, message):
    done = subprocess.run([sys.executable, "-m", "rigkit.cli", "ask", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rigkit: error:") and message in last
    assert "Traceback" not in done.stderr
